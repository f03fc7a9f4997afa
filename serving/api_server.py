"""vLLM's OpenAI-compatible server, with the out-of-vocabulary check that
``--skip-tokenizer-init`` switches off put back, chat requests without a tokenizer refused by
name, and a bounded shutdown.

vLLM checks prompt token ids against the vocabulary in its renderer
(``BaseRenderer.validate_token_ids``), but skips the check when no tokenizer is loaded. A
prompt id >= the model's vocabulary size then reaches the embedding lookup inside the engine
core, which raises and takes the whole server down with every request in flight. Here the
check runs against the model's vocabulary size when there is no tokenizer, so such a request
gets vLLM's own 400 (``VLLMValidationError``) and the server keeps serving.

Without a tokenizer vLLM answers a chat completion with a bare 500 (an ``assert`` on the
tokenizer, and an empty message); the chat template needs the tokenizer. Here such a request
gets a 400 that says so and what to send instead.

On SIGTERM or SIGINT vLLM stops its engine first (aborting what is in flight), then its
HTTP server, which waits for open connections to close, with no limit: a streaming client
still connected waits for tokens from an engine that is gone, and the server never exits
(a second signal is ignored). Here the HTTP server waits `SHUTDOWN_GRACE_S` at most, then
closes what is still open.

With a batchpilot controller in the environment (``BATCHPILOT_CONTROLLER``, as `batchpilot
serve` sets it), a scheduler class other than batchpilot's is refused before anything
starts: vLLM takes the last of several ``--scheduler-cls`` (also as ``--scheduler-cls=X``,
``--scheduler_cls X`` or an abbreviation), and the controller would be silently gone.

Started by `batchpilot serve` (``BATCHPILOT_SERVE_PID``), the server stops (SIGTERM, on
Linux) when that process dies, even killed outright: no orphan keeps the port and the model.

    python -m batchpilot.serving.api_server --model DIR [vLLM's server arguments]

(`batchpilot serve` runs this.) The vocabulary and chat checks are installed in this process
only: the one that renders requests (the default single API server).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

from batchpilot.serving.config import CONTROLLER_ENV, PARENT_ENV

SHUTDOWN_GRACE_S = 5.0
"""How long the HTTP server waits for open connections once shutdown has begun (uvicorn's
``timeout_graceful_shutdown``; the engine has finished or aborted their requests by then)."""
SCHEDULER = "batchpilot.serving.scheduler.BatchpilotScheduler"
"""The scheduler class a controller runs in (`batchpilot serve` passes it)."""


def install_vocab_check() -> None:
    """Make vLLM's renderer check token ids against the model's vocabulary when it has no
    tokenizer (vLLM 0.32: ``vllm.renderers.base.BaseRenderer.validate_token_ids``)."""
    from vllm.exceptions import VLLMValidationError
    from vllm.renderers.base import BaseRenderer

    vllm_check = BaseRenderer.validate_token_ids
    if getattr(vllm_check, "batchpilot", False):
        return

    def validate_token_ids(
        self: Any, token_ids: Sequence[int], *, parameter: str | None = None
    ) -> None:
        vllm_check(self, token_ids, parameter=parameter)
        if self.tokenizer is not None or not token_ids:
            return
        vocab = self.model_config.get_vocab_size()
        low, high = min(token_ids), max(token_ids)
        if low < 0 or high >= vocab:
            raise VLLMValidationError(
                f"Token id {low if low < 0 else high} is out of vocabulary "
                f"(the model's vocabulary has ids 0..{vocab - 1})",
                parameter=parameter,
            )

    validate_token_ids.batchpilot = True  # type: ignore[attr-defined]
    BaseRenderer.validate_token_ids = validate_token_ids  # type: ignore[method-assign]


NO_TOKENIZER_CHAT = (
    "chat completions render messages with the model's chat template, which needs its "
    "tokenizer, and this server runs with --skip-tokenizer-init: send token ids to "
    "/v1/completions, or serve without --skip-tokenizer-init"
)
"""The 400's message for a chat completion on a server without a tokenizer."""


def install_chat_check() -> None:
    """Answer a chat completion with a 400 naming the problem when the server has no
    tokenizer, where vLLM fails an ``assert`` (vLLM 0.32:
    ``OpenAIServingChat.create_chat_completion``)."""
    from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat

    vllm_create = OpenAIServingChat.create_chat_completion
    if getattr(vllm_create, "batchpilot", False):
        return

    async def create_chat_completion(self: Any, request: Any, raw_request: Any = None) -> Any:
        if self.renderer.tokenizer is None:
            return self.create_error_response(NO_TOKENIZER_CHAT)
        return await vllm_create(self, request, raw_request)

    create_chat_completion.batchpilot = True  # type: ignore[attr-defined]
    OpenAIServingChat.create_chat_completion = create_chat_completion  # type: ignore[method-assign]


def install_shutdown_grace(seconds: float = SHUTDOWN_GRACE_S) -> None:
    """Bound how long vLLM's HTTP server waits for open connections when it shuts down
    (vLLM 0.32: ``serve_http`` as ``vllm.entrypoints.launchers.api_server.entry`` calls it)."""
    from vllm.entrypoints.launchers.api_server import entry

    vllm_serve = entry.serve_http
    if getattr(vllm_serve, "batchpilot", False):
        return

    async def serve_http(*args: Any, **uvicorn_kwargs: Any) -> Any:
        uvicorn_kwargs.setdefault("timeout_graceful_shutdown", seconds)
        return await vllm_serve(*args, **uvicorn_kwargs)

    serve_http.batchpilot = True  # type: ignore[attr-defined]
    entry.serve_http = serve_http  # type: ignore[assignment]


def check_scheduler(args: argparse.Namespace) -> None:
    """Refuse (SystemExit) a scheduler class other than `SCHEDULER` when a controller is set
    in the environment: it would never run."""
    spec = os.environ.get(CONTROLLER_ENV)
    cls = getattr(args, "scheduler_cls", None)
    if cls is None:
        name = "vLLM's default"
    else:
        name = cls if isinstance(cls, str) else f"{cls.__module__}.{cls.__qualname__}"
    if spec and name != SCHEDULER:
        raise SystemExit(
            f"batchpilot: the scheduler class is {name}, not {SCHEDULER}: controller {spec} "
            "would not run (batchpilot serve sets --scheduler-cls itself; drop yours)"
        )


def install_scheduler_check() -> None:
    """Run `check_scheduler` on vLLM's parsed server arguments, before anything starts (vLLM
    0.32: ``vllm.entrypoints.launchers.cli_args.validate_parsed_serve_args``)."""
    from vllm.entrypoints.launchers import cli_args

    vllm_validate = cli_args.validate_parsed_serve_args
    if getattr(vllm_validate, "batchpilot", False):
        return

    def validate_parsed_serve_args(args: argparse.Namespace) -> None:
        check_scheduler(args)
        vllm_validate(args)

    validate_parsed_serve_args.batchpilot = True  # type: ignore[attr-defined]
    cli_args.validate_parsed_serve_args = validate_parsed_serve_args  # type: ignore[assignment]


def stop_with_parent() -> None:
    """Have the kernel send this process SIGTERM when the `batchpilot serve` named by
    ``PARENT_ENV`` dies (Linux's ``PR_SET_PDEATHSIG``: a SIGKILL, which no handler sees,
    included); exit at once if it is gone already. Nothing without the variable or Linux."""
    parent = os.environ.get(PARENT_ENV, "")
    if not parent.isdigit() or not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() != int(parent):  # it died before the request took effect
        raise SystemExit(f"batchpilot: the batchpilot serve ({parent}) that started this is gone")


def main() -> None:
    stop_with_parent()
    install_vocab_check()
    install_chat_check()
    install_shutdown_grace()
    install_scheduler_check()
    from vllm.entrypoints.launchers.api_server.entry import main as vllm_main

    vllm_main()


if __name__ == "__main__":
    main()

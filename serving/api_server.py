"""vLLM's OpenAI-compatible server, with the out-of-vocabulary check that
``--skip-tokenizer-init`` switches off put back.

vLLM checks prompt token ids against the vocabulary in its renderer
(``BaseRenderer.validate_token_ids``), but skips the check when no tokenizer is loaded. A
prompt id >= the model's vocabulary size then reaches the embedding lookup inside the engine
core, which raises and takes the whole server down with every request in flight. Here the
check runs against the model's vocabulary size when there is no tokenizer, so such a request
gets vLLM's own 400 (``VLLMValidationError``) and the server keeps serving.

    python -m batchpilot.serving.api_server --model DIR [vLLM's server arguments]

(`batchpilot serve` runs this.) The check is installed in this process only: the one that
renders requests (the default single API server).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


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


def main() -> None:
    install_vocab_check()
    from vllm.entrypoints.launchers.api_server.entry import main as vllm_main

    vllm_main()


if __name__ == "__main__":
    main()

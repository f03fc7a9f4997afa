"""Step-by-step bookkeeping inside vLLM's scheduler: per-request latencies and telemetry.

`StepTracker` is fed by `TrackingScheduler` (request arrivals, each `schedule()` output,
each `update_from_output()`), and turns what vLLM's own scheduler knows into the same
`Telemetry` and `RequestRecord`s the simulator reports. Times are seconds since `start()`
on the engine clock: `time.monotonic()` (``wall``, the default), or the process's CPU time
with idle gaps skipped (``cpu``: what the engine's own work costs, unaffected by other
processes on a shared machine as long as the model runs on one thread, which `VLLMEngine`
sees to; for measurements, never for serving).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from batchpilot.envs.metrics import SLO, RequestRecord, RunMetrics
from batchpilot.envs.telemetry import (
    LapsedFirstTokens,
    Telemetry,
    TelemetryAccumulator,
    on_track,
)

CLOCKS = {"wall": time.monotonic, "cpu": time.process_time}
STEP_LOG_LEN = 1
"""Steps kept in `StepTracker.step_log` by default: the last, which calibration reads; a
step-by-step comparison with the simulator asks for more (`VLLMEngine`'s ``step_log``)."""


@dataclass(slots=True)
class _Track:
    arrival_s: float
    prompt_tokens: int
    max_tokens: int
    first_token_s: float = -1.0
    last_token_s: float = -1.0
    output_tokens: int = 0
    preemptions: int = 0
    recomputed: int = 0
    max_itl_s: float = 0.0
    computed: int = 0
    """Tokens with KV computed as of the last step scheduled (what a preemption drops)."""
    queued: int = 0
    """Tokens it waits to prefill in vLLM's waiting queue (0 while scheduled)."""


class StepTracker:
    """Per-request and per-interval accounting of a vLLM scheduler's steps.

    A report costs the requests started (running, or preempted after a first token), not
    the waiting queue: the queued prefill tokens are summed as requests arrive, are
    scheduled and are preempted, and the requests with no first token yet are watched for
    their deadlines (`LapsedFirstTokens`), so a long queue does not slow the engine loop.
    """

    def __init__(
        self, slo: SLO | None = None, keep_records: bool = False, step_log_len: int = STEP_LOG_LEN
    ) -> None:
        self.slo = slo or SLO()
        self.keep_records = keep_records
        """Keep every finished request's record (a run's `RunResult.records`); off in a
        long-running server, where they would grow without bound. The metrics accumulate
        in `stats` either way (bounded memory)."""
        self.step_log_len = step_log_len
        """Steps `step_log` keeps."""
        self.start()

    clock = staticmethod(time.monotonic)
    """The engine clock's source (`CLOCKS`); set before `start()`."""

    def start(self) -> None:
        """Forget everything; the engine clock restarts at 0."""
        self.t0 = self.clock()
        self.skipped = 0.0
        self.tracks: dict[str, _Track] = {}
        self.started: dict[str, _Track] = {}
        """The tracks with a first token."""
        self.unstarted = LapsedFirstTokens()
        """The tracks without one, weighed by their max tokens."""
        self.queued_tokens = 0
        """Sum of the tracks' `_Track.queued`."""
        self.records: list[RequestRecord] = []
        self.stats = RunMetrics()
        self.last_finish_s = 0.0
        self.iterations = 0
        self.kv_integral = 0.0
        self._kv_last = (0.0, 0.0)
        self.tele = TelemetryAccumulator()
        self._step_start = 0.0
        self._step_counts = (0, 0, 0, 0, 0, 0)
        self.step_log: deque[tuple[int, int, int, int, int, int, float]] = deque(
            maxlen=self.step_log_len
        )
        """Recent steps as the simulator's step model sees them, and their seconds:
        (prefill requests, prefill tokens, prefill contexts, sum of chunk x context,
        decode requests, decode contexts, seconds)."""
        self.last_added = ""
        """vLLM's internal id of the newest request (it appends a random suffix)."""

    def now(self) -> float:
        return self.clock() - self.t0 + self.skipped

    def skip(self, seconds: float) -> None:
        """Move the engine clock over an idle gap (the CPU clock does not run while idle)."""
        self.skipped += max(0.0, seconds)

    # ------------------------------------------------------------------ hooks
    def on_arrival(self, request_id: str, prompt_tokens: int, max_tokens: int) -> None:
        now = self.now()
        self.last_added = request_id
        self._drop(request_id)
        self.tracks[request_id] = _Track(now, prompt_tokens, max_tokens, queued=prompt_tokens)
        self.queued_tokens += prompt_tokens
        self.unstarted.add(request_id, now, max_tokens)
        self.tele.arrived(now, prompt_tokens)

    def set_arrival(self, request_id: str, arrival_s: float) -> None:
        """The request arrived at `arrival_s` on the engine clock, before vLLM was handed it
        (a replayed workload's own time); call in arrival order, before it is scheduled."""
        track = self.tracks[request_id]
        track.arrival_s = arrival_s
        if track.first_token_s < 0:  # one with a first token is judged as started
            self.unstarted.add(request_id, arrival_s, track.max_tokens)

    def _drop(self, request_id: str) -> _Track | None:
        """Stop tracking a request (None if it was not tracked)."""
        track = self.tracks.pop(request_id, None)
        if track is not None:
            self.queued_tokens -= track.queued
            self.started.pop(request_id, None)
            self.unstarted.discard(request_id)
        return track

    def _kv_mark(self, now: float, kv_usage: float) -> None:
        """Integrate KV usage as a step function of time: the last value until `now`."""
        t, usage = self._kv_last
        self.kv_integral += usage * (now - t)
        iv = self.tele.interval
        iv.kv_time += usage * (now - max(t, iv.start_s))
        self._kv_last = (now, kv_usage)

    def on_schedule(self, out: Any, requests: dict[str, Any], kv_usage: float) -> None:
        """After `schedule()` (KV blocks allocated): classify the step's tokens, count
        preemptions."""
        self._step_start = self.now()
        self._kv_mark(self._step_start, kv_usage)
        prefill = decode = kv = 0
        prefill_seqs = prefill_kv = prefill_attn = 0
        # preemptions first: one made between steps (vLLM's reset_prefix_cache) may be
        # scheduled again in this step, which the loop below then sees
        for rid in out.preempted_req_ids or ():
            track = self.tracks.get(rid)
            if track is not None:
                track.preemptions += 1
                dropped = track.computed  # vLLM has already reset num_computed_tokens
                track.recomputed += dropped
                self.tele.interval.recomputed_tokens += dropped
                req = requests.get(rid)
                queued = 0 if req is None else req.num_tokens - req.num_computed_tokens
                self.queued_tokens += queued - track.queued
                track.queued = queued
            self.tele.interval.preemptions += 1
        for rid, n in out.num_scheduled_tokens.items():
            req = requests.get(rid)
            if req is None:
                continue
            before = req.num_computed_tokens - n  # schedule() already advanced it
            context = req.num_computed_tokens
            track = self.tracks.get(rid)
            if track is not None:
                track.computed = context
                self.queued_tokens -= track.queued
                track.queued = 0
            if n == 1 and req.num_output_tokens > 0 and before == req.num_tokens - 1:
                decode += 1
            else:
                prefill += n
                prefill_seqs += 1
                prefill_kv += context
                prefill_attn += n * context
            kv += context
        self.tele.interval.prompt_tokens += prefill
        decode_kv = kv - prefill_kv
        self._step_counts = (prefill_seqs, prefill, prefill_kv, prefill_attn, decode, decode_kv)
        self.tele.last_step = (prefill, decode, 0.0)

    def on_update(self, new_tokens: dict[str, int], finished: set[str], kv_usage: float) -> None:
        """After `update_from_output()`: tokens produced per request, requests finished."""
        now = self.now()
        duration = max(0.0, now - self._step_start)
        iv = self.tele.interval
        iv.iterations += 1
        self.iterations += 1
        self._kv_mark(now, kv_usage)
        prefill, decode, _ = self.tele.last_step
        self.tele.last_step = (prefill, decode, duration)
        self.step_log.append((*self._step_counts, duration))
        if prefill or decode:
            self.tele.step_cost.add(prefill + decode, duration)
        if decode:
            iv.decode_steps += 1
            iv.decode_seqs += decode
            iv.decode_time += duration
            self.tele.step_times.add(duration)
        for rid, n in new_tokens.items():
            track = self.tracks.get(rid)
            if track is None or n <= 0:
                continue
            if track.first_token_s < 0:
                track.first_token_s = now
                self.unstarted.discard(rid)
                self.started[rid] = track
                iv.ttft_n += 1
                iv.ttft_sum += now - track.arrival_s
            elif track.last_token_s >= 0:
                gap = now - track.last_token_s
                self.stats.itl.add(gap)
                track.max_itl_s = max(track.max_itl_s, gap)
            track.last_token_s = now
            track.output_tokens += n
            iv.output_tokens += n
        for rid in finished:
            track = self._drop(rid)
            if track is not None:
                self._finish(rid, track, now)

    def _finish(self, rid: str, track: _Track, now: float) -> None:
        """Count a request that ended at `now` with the tokens it produced."""
        rec = RequestRecord(
            rid,
            track.arrival_s,
            track.prompt_tokens,
            track.output_tokens,
            track.first_token_s,
            now,
            track.preemptions,
            track.recomputed,
            track.max_itl_s,
        )
        good = self.slo.met(rec.ttft_s, rec.tpot_s, rec.e2el_s)
        self.stats.add_request(rec, good)
        self.last_finish_s = now
        if self.keep_records:
            self.records.append(rec)
        self.tele.finished(track.output_tokens, good)

    def on_abort(self, request_ids: list[str] | None, served: bool = False) -> None:
        """Requests ended from outside the normal finish (None: all, a reset or a pause).

        With `served` (vLLM's abort) one with output counts as finished with the tokens it
        produced: vLLM ends a request on a client's stop string this way (its front end finds
        the string and aborts the request in the core, a step or more late with the core in
        its own process), which the scheduler cannot tell from a client gone mid-stream.
        Any other (no output yet, an error, all at once) is forgotten."""
        if request_ids is None:
            self.tracks.clear()
            self.started.clear()
            self.unstarted.clear()
            self.queued_tokens = 0
        now = self.now()
        for rid in request_ids or ():
            track = self._drop(rid)
            if served and track is not None and track.output_tokens > 0:
                self._finish(rid, track, now)

    # ------------------------------------------------------------------ reporting
    def telemetry(
        self,
        scheduler: Any,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        now: float | None = None,
    ) -> Telemetry:
        """The interval's telemetry from `scheduler`'s state; starts a new interval.

        `now` overrides the clock: 0 right after `start()` reports the workload's start as
        the simulator does, the same on every reset (no microseconds of bookkeeping in it).
        """
        now = self.now() if now is None else now
        pool = scheduler.kv_cache_manager.block_pool
        usage = min(1.0, max(0.0, float(scheduler.kv_cache_manager.usage)))
        self._kv_mark(now, usage)
        running, waiting = scheduler.get_request_counts()
        decoding = sum(
            1
            for r in scheduler.running
            if r.num_output_tokens > 0 and r.num_computed_tokens >= r.num_prompt_tokens
        )
        slo = self.slo
        on_track_tokens = 0
        off_track_tokens = self.unstarted.lapsed_weight(now, slo)
        for k in self.started.values():
            if on_track(slo, now, k.arrival_s, k.first_token_s, k.last_token_s, k.output_tokens):
                on_track_tokens += k.output_tokens
            else:
                off_track_tokens += k.max_tokens
        head = next_waiting(scheduler)
        track = None if head is None else self.tracks.get(head.request_id)
        oldest = now if track is None else track.arrival_s
        return self.tele.report(
            now,
            self.iterations,
            kv_cache_usage=usage,
            num_free_blocks=pool.get_num_free_blocks(),
            num_total_blocks=pool.num_gpu_blocks,
            block_size=scheduler.block_size,
            num_requests_running=running,
            num_requests_waiting=waiting,
            num_decoding=decoding,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            oldest_waiting_age_s=now - oldest,
            waiting_prefill_tokens=self.queued_tokens,
            inflight_on_track_tokens=on_track_tokens,
            inflight_off_track_output_tokens=off_track_tokens,
        )


def next_waiting(scheduler: Any) -> Any:
    """The head of vLLM's waiting queue (the oldest new request, or a preempted one put back
    in front; under the priority policy, the first by priority), or None if none waits.
    Requests parked holding KV blocks (a remote KV load, an idle input stream) are not
    counted: they wait on something other than the batch limits."""
    return scheduler.waiting.peek_request() if scheduler.waiting else None

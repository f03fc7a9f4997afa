"""A fast simulated vLLM V1 engine (``engine="sim"``).

One iteration follows vLLM V1's scheduler:

1. RUNNING requests in admission order each get their next tokens (a decode takes one;
   a partial or resumed prefill takes what is left of its prompt, cut to the remaining
   token budget). KV blocks are allocated on demand; when none is free, the most
   recently admitted running request is preempted by recompute (blocks freed, back to
   the front of the queue, all its tokens to prefill again) until the allocation fits.
2. If nothing was preempted, WAITING requests are admitted first-come first-served while
   fewer than `max_num_seqs` run, token budget remains and the blocks of their whole
   sequence (prompt and output so far) are free, though only the first chunk's are taken:
   vLLM 0.32's ``scheduler_reserve_full_isl`` (on by default), which keeps a chunked
   prompt from being admitted only to be preempted a step later.

A request that completes its prompt (or its recompute) samples a token in that step.
Lowering `max_num_seqs` below the running count preempts nothing: the batch drains.

With ``scheduler="v0"`` an iteration follows vLLM V0's default scheduler instead (the one
the batching paper measured): whole-prompt prefills of waiting requests if any can be
admitted, decodes stalled; otherwise one decode of every running request (`_step_v0`).

Step time comes from the profile's step-time model (`batchpilot.envs.step_models`): the
linear model or the measured tabular one, given each step's prefill requests, tokens,
contexts and chunk x context work, and its decode requests and KV tokens.

Runs of identical pure-decode iterations (no admission possible, no finish, no block
shortage, no control boundary) are advanced in closed form: each iteration's time comes
from the step-time model's `base_time` and `decode_kv_s` with the same floating-point
operations as one step, the clock is summed in step order, and KV usage and every
token's inter-token latency are still accounted exactly.
"""

from __future__ import annotations

import copy
import math
import numbers
from array import array
from collections import deque
from collections.abc import Callable, Sequence
from itertools import chain, pairwise, repeat
from operator import attrgetter

import numpy as np

from batchpilot.envs.engine import RunResult
from batchpilot.envs.metrics import SLO, RequestRecord, RunMetrics
from batchpilot.envs.profiles import NULL_BLOCKS, EngineProfile
from batchpilot.envs.telemetry import (
    LENGTH_PRIOR,
    Limits,
    StepTimes,
    Telemetry,
    TelemetryAccumulator,
    on_track,
)
from batchpilot.envs.workload import Request, Requests, Workload

SCHEDULERS = ("v1", "v0")
"""`v1`: vLLM V1's scheduler (chunked prefill mixed with decodes); `v0`: vLLM V0's default."""
DEFAULT_SCHEDULER = SCHEDULERS[0]
V0_WATERMARK = 0.01
"""Fraction of KV blocks V0's block manager keeps free when admitting a prompt."""


def _admissible(req: _Req, free_blocks: int, block_size: int) -> bool:
    """Whether a waiting request may be admitted: the blocks of its whole sequence (prompt and
    output so far) are free, though only its first chunk's are taken (vLLM 0.32's
    ``scheduler_reserve_full_isl``)."""
    return -(-(req.prompt + req.generated) // block_size) <= free_blocks


def _arrival(req: _Req) -> float:
    return req.arrival


class _Req:
    """Mutable scheduler state of one request."""

    __slots__ = (
        "arrival",
        "blocks",
        "computed",
        "first_token",
        "generated",
        "last_token",
        "max_itl",
        "output",
        "preemptions",
        "prompt",
        "recomputed",
        "rid",
    )

    def __init__(self, r: Request) -> None:
        self.rid = r.request_id
        self.arrival = r.arrival_s
        self.prompt = r.prompt_tokens
        self.output = r.output_tokens
        self.computed = 0
        self.generated = 0
        self.blocks = 0
        self.first_token = -1.0
        self.last_token = -1.0
        self.max_itl = 0.0
        self.preemptions = 0
        self.recomputed = 0

    def copy(self) -> _Req:
        """An independent copy (every slot)."""
        twin = _Req.__new__(_Req)
        for name, value in zip(_Req.__slots__, _REQ_STATE(self), strict=True):
            setattr(twin, name, value)
        return twin


_REQ_STATE = attrgetter(*_Req.__slots__)


def length_prior_problem(prior: object) -> str | None:
    """None if `prior` is 4 finite numbers (prompt mean > 0, its variance >= 0, output mean
    > 0, its variance >= 0), else what is wrong."""
    if not isinstance(prior, list | tuple) or len(prior) != 4:
        return "need 4 numbers (prompt mean, prompt variance, output mean, output variance)"
    if any(isinstance(v, bool) or not isinstance(v, numbers.Real) for v in prior):
        return "need 4 numbers (prompt mean, prompt variance, output mean, output variance)"
    prompt_mean, prompt_var, output_mean, output_var = (float(v) for v in prior)
    finite = all(math.isfinite(v) for v in (prompt_mean, prompt_var, output_mean, output_var))
    if not finite or min(prompt_mean, output_mean) <= 0 or min(prompt_var, output_var) < 0:
        return "the means must be finite and > 0, the variances finite and >= 0"
    return None


class SimEngine:
    """Simulated vLLM V1 engine for an `EngineProfile`.

    `slo` decides which finished requests count as good (goodput); `length_prior` is
    (prompt mean, prompt variance, output mean, output variance) used by the workload
    estimates until requests arrive or finish.
    """

    def __init__(
        self,
        profile: EngineProfile,
        *,
        slo: SLO | None = None,
        length_prior: tuple[float, float, float, float] = LENGTH_PRIOR,
        fast_forward: bool = True,
        scheduler: str = DEFAULT_SCHEDULER,
        keep_records: bool = False,
    ) -> None:
        if scheduler not in SCHEDULERS:
            raise ValueError(f"scheduler must be one of {', '.join(SCHEDULERS)}, got {scheduler!r}")
        for name, flag in (("fast_forward", fast_forward), ("keep_records", keep_records)):
            if not isinstance(flag, bool):
                raise ValueError(f"{name} must be true or false, got {flag!r}")
        if problem := length_prior_problem(length_prior):
            raise ValueError(f"length_prior {length_prior!r}: {problem}")
        self.profile = profile
        self.slo = slo or SLO()
        self.length_prior = length_prior
        self.fast_forward = fast_forward
        self.scheduler = scheduler
        self.keep_records = keep_records
        """Keep every finished request's `RequestRecord` in `result().records` (memory grows
        with the run; the metrics never need them: they accumulate in `RunMetrics`)."""
        self._watermark = int(V0_WATERMARK * profile.num_gpu_blocks) if scheduler == "v0" else 0
        self.block_size = profile.block_size
        self.num_total_blocks = profile.num_gpu_blocks
        self._kv_blocks = profile.num_gpu_blocks - NULL_BLOCKS
        """Blocks requests can hold: KV usage is a fraction of these, as vLLM's
        (`BlockPool.get_usage` leaves out the null block)."""
        self.max_model_len = profile.max_model_len
        self.max_num_seqs = profile.max_num_seqs
        self.max_num_batched_tokens = profile.max_num_batched_tokens
        self._workload: Workload | None = None

    # ------------------------------------------------------------------ set-up
    def reset(self, workload: Workload, limits: Limits) -> Telemetry:
        workload.check_fits(self.max_model_len, self.max_tokens)
        self._workload = workload
        self._arrivals: Sequence[Request] = workload.requests  # immutable: forks share them
        self._next = 0  # index of the next arrival to queue
        self._upcoming: Request | None = self._arrivals[0] if self._arrivals else None
        """The next arrival to queue (made from the workload's columns), None after the last."""
        self._future_replaced = False
        self._waiting: deque[_Req] = deque()
        self._running: list[_Req] = []
        self._stats = RunMetrics()
        self._records: list[RequestRecord] = []  # only with keep_records
        self._free = self.num_total_blocks - NULL_BLOCKS
        self._clock = 0.0
        self._iteration = 0
        self._kv_integral = 0.0
        self._tele = TelemetryAccumulator(self.length_prior)
        self._waiting_tokens = 0
        self.set_limits(limits)
        self._admit_arrivals()
        self.reset_peak_demand()
        return self._telemetry()

    @property
    def max_tokens(self) -> int:
        """The most tokens (prompt and output) one request may hold: the context, or the KV
        cache if smaller."""
        kv = (self.num_total_blocks - NULL_BLOCKS - self._watermark) * self.block_size
        return min(self.max_model_len, kv)

    def set_limits(self, limits: Limits) -> None:
        self._limit = max(1, min(limits.max_num_seqs, self.max_num_seqs))
        budget = limits.max_num_batched_tokens or self.max_num_batched_tokens
        self._budget = max(1, min(budget, self.max_num_batched_tokens))

    def reset_peak_demand(self) -> None:
        """Start `peak_demand` afresh from the engine's state now."""
        self._peak_running = len(self._running)
        self._peak_tokens = 0

    def peak_demand(self) -> tuple[int, int]:
        """(most requests running, most tokens an iteration asked for) since the last
        `reset_peak_demand` (a reset, a fork without history).

        An iteration asks for the tokens it scheduled plus, where a request's blocks did
        not fit, that request's unclipped chunk; where the token budget ran out, it asked
        for the whole budget (at least). So a run in which ``max_num_seqs`` stayed above
        the first figure never met that limit, nor one whose budget stayed above the second
        met the budget: continued from the same state with any other limit above the same
        figure, it goes exactly the same way (`mpc` reuses such horizons). A V0
        iteration not run in closed form asks for every token (its budget check is not
        tracked)."""
        return self._peak_running, self._peak_tokens

    @property
    def done(self) -> bool:
        return self._upcoming is None and not (self._waiting or self._running)

    @property
    def clock_s(self) -> float:
        return self._clock

    def remaining_output_tokens(self) -> list[tuple[int, int]]:
        """(tokens held now, output tokens still to generate) per running request.

        Clairvoyant: only a simulator knows the second number. For the oracle controller.
        """
        return [(r.prompt + r.generated, r.output - r.generated) for r in self._running]

    def waiting_output_tokens(self) -> list[tuple[int, int]]:
        """The same pairs for waiting requests, in admission order (clairvoyant, oracle only)."""
        return [(r.prompt + r.generated, r.output - r.generated) for r in self._waiting]

    # ------------------------------------------------------------------ forking
    def unfinished_requests(self) -> list[tuple[str, float, float, float, int, int, int]]:
        """(request id, arrival s, first token s or -1, last token s or -1, tokens
        generated, output tokens, prompt tokens) of each admitted unfinished request,
        running (in admission order) then waiting (in queue order). Clairvoyant (true
        output lengths): for `mpc`."""
        return [
            (r.rid, r.arrival, r.first_token, r.last_token, r.generated, r.output, r.prompt)
            for r in (*self._running, *self._waiting)
        ]

    def arrived_requests(self, last: int) -> list[Request]:
        """The `last` requests to have arrived so far, in arrival order (true lengths)."""
        if self._workload is None or self._future_replaced:
            raise RuntimeError("arrived_requests() needs a reset engine whose future is its own")
        return list(self._arrivals[max(0, self._next - last) : self._next])

    def replace_future(self, requests: list[Request]) -> None:
        """Make `requests` (sorted by arrival, none before the clock) the arrivals still to
        come, in place of the workload's: a fork that plans against an estimated future."""
        times = [r.arrival_s for r in requests]
        if times and (times[0] < self._clock or any(b < a for a, b in pairwise(times))):
            raise ValueError("replace_future: arrivals must be sorted and not before the clock")
        self._arrivals = tuple(requests)
        self._next = 0
        self._upcoming = requests[0] if requests else None
        self._future_replaced = True

    def replace_outputs(self, outputs: list[int]) -> None:
        """Give the admitted unfinished requests, in `unfinished_requests` order, these
        output lengths: a fork that plans without knowing them. Each must exceed the tokens
        the request has generated and fit the context and the KV cache (`max_tokens`) with
        its prompt."""
        requests = [*self._running, *self._waiting]
        if len(outputs) != len(requests):
            raise ValueError(
                f"replace_outputs: {len(outputs)} lengths for {len(requests)} requests"
            )
        cap = self.max_tokens
        for r, output in zip(requests, outputs, strict=True):
            if not r.generated < output <= cap - r.prompt:
                raise ValueError(
                    f"replace_outputs: request {r.rid} has generated {r.generated} of a "
                    f"{r.prompt}-token prompt's output; {output} tokens do not follow on"
                )
            r.output = output

    def fork(self, *, history: bool = True) -> SimEngine:
        """An independent copy whose future is identical to this engine's.

        Continued with the same limits and `advance` calls, the copy produces the same
        telemetry and result; continued otherwise, it leaves this engine untouched. Only
        mutable state is copied: the workload, the profile and the arrivals still to come
        are shared (a fork costs the requests in flight, not the workload's length),
        per-request scheduler state is copied slot by slot.

        With `history=False` the copy is a look-ahead: it keeps what a planner reads (its
        telemetry, `peak_demand`, and the records of the requests that finish after the
        fork, in `finished_records()`) but no run metrics (latency sketches and counters),
        so its `result()` raises. Its cost is then independent of how long the run has been
        going, and each of its steps is cheaper (about a sixth, in `mpc`'s horizons).
        """
        if self._workload is None:
            raise RuntimeError("call reset(workload, limits) before fork()")
        twins: dict[int, _Req] = {}

        def twin(req: _Req) -> _Req:
            copy = twins.get(id(req))
            if copy is None:
                copy = twins[id(req)] = req.copy()
            return copy

        other = SimEngine.__new__(SimEngine)
        state = other.__dict__
        for key, value in self.__dict__.items():
            if history or key not in _HISTORY:
                state[key] = _copy_state(value, twin)
        if not history:
            state["_stats"] = _UNMETERED
            state["_records"] = []
            state["keep_records"] = True  # what follows a fork is short: its records are kept
            other.reset_peak_demand()
        return other

    # ------------------------------------------------------------------ running
    def advance(self, max_iterations: int | None = None, until_s: float | None = None) -> Telemetry:
        if self._workload is None:
            raise RuntimeError("call reset(workload, limits) first")
        stop_iter = None if max_iterations is None else self._iteration + max_iterations
        while not self.done:
            if stop_iter is not None and self._iteration >= stop_iter:
                break
            if until_s is not None and self._clock >= until_s:
                break
            self._admit_arrivals()
            if not self._running and not self._waiting:
                nxt = self._upcoming.arrival_s  # type: ignore[union-attr]  # not done
                if until_s is not None and nxt >= until_s:
                    self._clock = until_s
                    break
                self._clock = nxt
                continue
            left = None if stop_iter is None else stop_iter - self._iteration
            if not (self.fast_forward and self._decode_run(left, until_s)):
                self._step_v0() if self.scheduler == "v0" else self._step()
        return self._telemetry()

    def _admit_arrivals(self, clock: float | None = None) -> None:
        """Queue the requests arrived by `clock` (default: now)."""
        upcoming = self._upcoming
        if clock is None:
            clock = self._clock
        if upcoming is None or upcoming.arrival_s > clock:
            return
        arrivals, i = self._arrivals, self._next
        while upcoming is not None and upcoming.arrival_s <= clock:
            r = _Req(upcoming)
            i += 1
            upcoming = arrivals[i] if i < len(arrivals) else None
            self._waiting.append(r)
            self._waiting_tokens += r.prompt
            self._tele.arrived(r.arrival, r.prompt)
        self._next, self._upcoming = i, upcoming

    def _step(self) -> None:
        """One scheduler iteration, request by request."""
        bs = self.block_size
        budget = self._budget
        running, waiting = self._running, self._waiting
        scheduled: list[tuple[_Req, int]] = []
        add = scheduled.append
        preempted = 0
        free = self._free
        asked = 0  # tokens asked for where blocks did not fit (`peak_demand`)
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            computed = req.computed
            n = req.prompt + req.generated - computed
            if n > budget:
                n = budget
            need = -(-(computed + n) // bs) - req.blocks
            if need > free:
                asked = max(asked, self._budget - budget + req.prompt + req.generated - computed)
                self._free = free
                while True:
                    victim = running.pop()
                    self._preempt(victim)
                    preempted += 1
                    if victim is req or need <= self._free:
                        break
                free = self._free
                if victim is req:
                    break
            free -= need
            req.blocks += need
            add((req, n))
            budget -= n
            i += 1
        if not preempted:
            limit = self._limit
            while waiting and len(running) < limit and budget > 0:
                req = waiting[0]
                n = req.prompt + req.generated - req.computed
                if n > budget:
                    n = budget
                need = -(-n // bs)
                if not _admissible(req, free, bs):
                    asked = self._budget - budget + req.prompt + req.generated - req.computed
                    break
                waiting.popleft()
                self._waiting_tokens -= req.prompt + req.generated
                free -= need
                req.blocks = need
                running.append(req)
                add((req, n))
                budget -= n
        self._free = free
        asked = max(asked, self._budget - budget)
        if asked > self._peak_tokens:
            self._peak_tokens = asked
        self._execute(scheduled, preempted)

    def _step_v0(self) -> None:
        """One vLLM V0 iteration (no chunked prefill): prefill or decode, never both.

        Waiting requests are admitted first-come first-served while fewer than
        `max_num_seqs` run, their whole prompts (prompt and output so far, after a
        preemption) fit the token budget and their blocks leave V0's watermark free; a
        prompt longer than the budget runs alone (V0 itself requires the engine's budget
        to cover `max_model_len`; only a controller's lower budget gets here). If none is
        admitted, every running request decodes, oldest arrival first; when a block is
        missing, the latest-arrived running request is preempted by recompute.
        """
        running, waiting = self._running, self._waiting
        scheduled: list[tuple[_Req, int]] = []
        preempted = 0
        budget = self._budget
        self._peak_tokens = 1 << 62  # not tracked (`peak_demand`)
        while waiting and len(running) < self._limit:
            req = waiting[0]
            n = req.prompt + req.generated
            if (scheduled and n > budget) or not self._v0_fits(req):
                break
            waiting.popleft()
            need = -(-n // self.block_size)
            self._free -= need
            req.blocks = need
            running.append(req)
            scheduled.append((req, n))
            budget -= n
        if scheduled:
            if any(a.arrival > b.arrival for a, b in pairwise(running)):
                running.sort(key=_arrival)  # V0 orders the running queue by arrival (FCFS)
        else:
            i = 0
            while i < len(running):
                req = running[i]
                need = -(-(req.computed + 1) // self.block_size) - req.blocks
                while need > self._free:
                    victim = running.pop()
                    self._preempt(victim)
                    preempted += 1
                    if victim is req:
                        break
                else:
                    self._free -= need
                    req.blocks += need
                    scheduled.append((req, 1))
                    i += 1
                    continue
                break
        self._execute(scheduled, preempted)

    def _v0_fits(self, req: _Req) -> bool:
        """Whether V0 can allocate `req`'s whole prompt and keep its watermark free."""
        need = -(-(req.prompt + req.generated) // self.block_size)
        return self._free - need >= self._watermark

    def _execute(self, scheduled: list[tuple[_Req, int]], preempted: int) -> None:
        """Run one iteration of `scheduled` (request, tokens) pairs and account for it."""
        if len(self._running) > self._peak_running:
            self._peak_running = len(self._running)
        prefill_seqs = prefill = prefill_kv = prefill_attn = decode = decode_kv = 0
        for req, n in scheduled:
            computed = req.computed
            context = computed + n
            if n == 1 and req.generated and computed == req.prompt + req.generated - 1:
                decode += 1
                decode_kv += context
            else:
                prefill_seqs += 1
                prefill += n
                prefill_kv += context
                prefill_attn += n * context
        dt = self.profile.step.time(
            prefill_seqs, prefill, prefill_kv, prefill_attn, decode, decode_kv
        )
        now = self._clock = self._clock + dt
        iv = self._tele.interval
        iv.prompt_tokens += prefill
        iv.preemptions += preempted
        finished = False
        itl = self._stats.itl
        add_itl = itl.buffer.append
        tokens = ttft_n = 0
        ttft_sum = iv.ttft_sum
        for req, n in scheduled:
            computed = req.computed = req.computed + n
            generated = req.generated
            if computed < req.prompt + generated:
                continue  # partial prefill chunk: no token yet
            req.generated = generated = generated + 1
            tokens += 1
            if req.first_token < 0:
                req.first_token = now
                ttft_n += 1
                ttft_sum += now - req.arrival
            else:
                gap = now - req.last_token
                add_itl(gap)
                if gap > req.max_itl:
                    req.max_itl = gap
            req.last_token = now
            if generated >= req.output:
                finished = True
        iv.output_tokens += tokens
        iv.ttft_n += ttft_n
        iv.ttft_sum = ttft_sum
        itl.settle()
        used = self._kv_blocks - self._free
        if finished:
            self._retire()
        self._tele.last_step = (prefill, decode, dt)
        if prefill or decode:
            self._tele.step_cost.add(prefill + decode, dt)
        if decode:
            self._tele.step_times.add(dt)
        self._account(dt, used * dt / self._kv_blocks, decode, 1)

    def _preempt(self, req: _Req) -> None:
        self._free += req.blocks
        req.recomputed += req.computed
        self._tele.interval.recomputed_tokens += req.computed
        self._waiting_tokens += req.prompt + req.generated
        req.blocks = 0
        req.computed = 0
        req.preemptions += 1
        self._waiting.appendleft(req)

    def _retire(self) -> None:
        keep: list[_Req] = []
        slo = self.slo
        for req in self._running:
            if req.generated < req.output:
                keep.append(req)
                continue
            self._free += req.blocks
            req.blocks = 0
            rec = RequestRecord(
                req.rid,
                req.arrival,
                req.prompt,
                req.output,
                req.first_token,
                req.last_token,
                req.preemptions,
                req.recomputed,
                req.max_itl,
            )
            good = slo.met(rec.ttft_s, rec.tpot_s, rec.e2el_s)
            self._stats.add_request(rec, good)
            if self.keep_records:
                self._records.append(rec)
            self._tele.finished(req.output, good)
        self._running = keep

    def _account(
        self, duration: float, usage_time: float, decode_seqs: int, iterations: int
    ) -> None:
        """Add `iterations` steps lasting `duration` s in all to the run and interval totals.

        `usage_time` is the KV usage integrated over those steps (fraction x seconds).
        """
        self._kv_integral += usage_time
        iv = self._tele.interval
        iv.kv_time += usage_time
        iv.iterations += iterations
        self._iteration += iterations
        if decode_seqs:
            iv.decode_steps += iterations
            iv.decode_seqs += decode_seqs * iterations
            iv.decode_time += duration

    def _decode_run(self, max_iterations: int | None, until_s: float | None) -> bool:
        """Advance k > 1 identical pure-decode iterations in closed form; False if none apply.

        Plain Python over lists (runs are short: a few iterations of tens of requests, where
        numpy's per-call cost dominated); sums that numpy took are taken in numpy's order
        (`_np_sum`), so every figure is bit-identical to the array version's.
        """
        running = self._running
        n = len(running)
        queue_arrivals = False
        if self.scheduler == "v0":
            # V0 decodes the whole batch; FCFS: a blocked head keeps later arrivals waiting
            if n == 0 or (self._waiting and n < self._limit and self._v0_fits(self._waiting[0])):
                return False  # a prefill step is due
            admission_open = n < self._limit and not self._waiting
        else:
            budget = self._budget
            if n == 0 or budget < n:
                return False  # nothing to run, or decodes cut by the budget
            if n > self._peak_tokens:
                self._peak_tokens = n
            admission_open = n < self._limit and budget > n
            if self._waiting and admission_open:
                head = self._waiting[0]
                remaining = head.prompt + head.generated - head.computed
                if n + remaining > self._peak_tokens:
                    self._peak_tokens = n + remaining
                if _admissible(head, self._free, self.block_size):
                    return False  # an admission is due
                # the head's blocks cannot be free until a request finishes (decodes only
                # take blocks): later arrivals queue behind it, and are admitted to the
                # queue when `_step` would have (`queue_arrivals`)
                admission_open = False
                queue_arrivals = True
        bs = self.block_size
        first_finish = 1 << 62  # iterations until the first running request finishes
        kv = 0
        firsts: list[int] = []  # per request, the first iteration whose token needs a new block
        for req in reversed(running):  # newest first: a prefill chunk is due there if anywhere
            generated = req.generated
            held = req.prompt + generated
            if req.computed != held - 1 or not generated:
                return False  # a prefill chunk is due
            left = req.output - generated
            if left < first_finish:
                if left < 2:
                    return False
                first_finish = left
            kv += held
            firsts.append(req.blocks * bs - held + 1)
        k = first_finish if max_iterations is None else min(first_finish, max_iterations)
        if k < 2:
            return False
        bound = until_s
        if admission_open and self._upcoming is not None:
            nxt = self._upcoming.arrival_s
            bound = nxt if bound is None else min(bound, nxt)
        # each step's time as `StepModel.time` gives it (base + per-KV-token term, the
        # same floating-point operations as one step), the clock summed in step order as
        # `_step` sums it: bit-identical end times; computed only up to the bound
        step = self.profile.step
        base, per_kv = step.base_time(0, 0, 0, 0, n), step.decode_kv_s
        durations: list[float] = []
        ends: list[float] = []
        clock = self._clock
        for i in range(k):
            d = base + per_kv * float(kv + n * i)
            clock += d
            durations.append(d)
            ends.append(clock)
            if bound is not None and clock >= bound:
                break  # the first iteration ending at or past the bound is the last
        k = len(ends)
        # extra[j]: blocks the running requests need beyond theirs after iteration j
        extra = [0] * k
        for first in firsts:
            if first >= k:
                continue
            if first < 0:  # `_step` always holds blocks for every computed token
                raise AssertionError("a decoding request holds fewer blocks than its tokens")
            for j in range(first, k, bs):
                extra[j] += 1
        total = 0
        for j in range(k):
            total += extra[j]
            extra[j] = total
        free = self._free
        if extra[-1] > free:
            k = sum(1 for e in extra if e <= free)
        if k < 2:
            return False
        del durations[k:], ends[k:], extra[k:]
        used = self._kv_blocks - free
        self._free = free - extra[-1]
        if queue_arrivals:
            self._stepped_decodes(durations, ends, used, extra)
        else:
            self._decode_totals(durations, ends, used, extra)
        self._admit_arrivals(ends[-2])  # stepping queues arrivals before each iteration
        if k == first_finish:
            self._retire()
        return True

    def _decode_totals(
        self, durations: list[float], ends: list[float], used: int, extra: list[int]
    ) -> None:
        """Account a closed-form decode run in closed form: its inter-token latencies and
        KV usage as weighted totals (`_decode_run` started this way; its figures are kept)."""
        running = self._running
        n, k = len(running), len(durations)
        bs = self.block_size
        # KV usage after each iteration, for the time-weighted mean
        usage_time = _np_sum([(used + e) * d for e, d in zip(extra, durations, strict=True)])
        usage_time /= self._kv_blocks
        start = self._clock
        end = ends[-1]
        first_end = ends[0]
        d1 = durations[0]
        rest_max = max(durations[1:])
        first_weight = n
        itl = self._stats.itl
        last = k - 1
        for req in running:
            held = req.prompt + req.generated
            req.computed += k
            req.generated += k
            blocks = -(-(held + last) // bs)
            if blocks > req.blocks:
                req.blocks = blocks
            worst = req.max_itl
            if req.last_token != start:  # it did not run in the previous step
                first_gap = first_end - req.last_token
                first_weight -= 1
                itl.add(first_gap)
                if first_gap > worst:
                    worst = first_gap
            elif d1 > worst:
                worst = d1
            req.max_itl = rest_max if rest_max > worst else worst
            req.last_token = end
        self._tele.step_times.extend(durations[-StepTimes.maxlen :])
        self._tele.step_cost.add_steps(n, durations)
        weights = [n] * k
        weights[0] = first_weight
        itl.add_many(durations, weights)
        self._clock = end
        self._tele.interval.output_tokens += n * k
        self._tele.last_step = (0, n, durations[-1])
        self._account(_np_sum(durations), usage_time, n, k)

    def _stepped_decodes(
        self, durations: list[float], ends: list[float], used: int, extra: list[int]
    ) -> None:
        """Account a closed-form decode run step by step, with `_execute`'s figures and
        floating-point order (each gap a difference of step end times, each step's totals
        added in turn): bit-identical to stepping, at a fraction of its per-request cost.
        For runs `_decode_run` takes past a KV-blocked queue head, which it once stepped."""
        running = self._running
        n, k = len(running), len(durations)
        bs = self.block_size
        total = self._kv_blocks
        itl = self._stats.itl
        step_times = self._tele.step_times
        add_cost = self._tele.step_cost.add
        iv = self._tele.interval
        first_end, end = ends[0], ends[-1]
        gaps = [b - a for a, b in pairwise(ends)]  # every later step's gap, as `_execute`
        rest_max = max(gaps)
        last = k - 1
        add = itl.buffer.append
        for req in running:
            held = req.prompt + req.generated
            req.computed += k
            req.generated += k
            blocks = -(-(held + last) // bs)
            if blocks > req.blocks:
                req.blocks = blocks
            gap = first_end - req.last_token
            add(gap)
            worst = req.max_itl
            if gap > worst:
                worst = gap
            req.max_itl = rest_max if rest_max > worst else worst
            req.last_token = end
        for j in range(k):
            if j:
                itl.buffer.extend(repeat(gaps[j - 1], n))
            itl.settle()
            dt = durations[j]
            add_cost(n, dt)
            step_times.add(dt)
            self._account(dt, (used + extra[j]) * dt / total, n, 1)
        self._clock = end
        iv.output_tokens += n * k
        self._tele.last_step = (0, n, durations[-1])

    # ------------------------------------------------------------------ reporting
    def _telemetry(self) -> Telemetry:
        now = self._clock
        usage = 1.0 - self._free / self._kv_blocks  # vLLM's formula, to the bit
        on_track_tokens = off_track_tokens = 0
        slo = self.slo
        for r in chain(self._running, self._waiting):
            if on_track(slo, now, r.arrival, r.first_token, r.last_token, r.generated):
                on_track_tokens += r.generated
            else:
                off_track_tokens += r.output
        decoding = sum(r.generated > 0 and r.computed >= r.prompt for r in self._running)
        waiting = self._waiting
        return self._tele.report(
            now,
            self._iteration,
            kv_cache_usage=usage,
            num_free_blocks=self._free,
            num_total_blocks=self.num_total_blocks,
            block_size=self.block_size,
            num_requests_running=len(self._running),
            num_requests_waiting=len(waiting),
            num_decoding=decoding,
            max_num_seqs=self._limit,
            max_num_batched_tokens=self._budget,
            oldest_waiting_age_s=now - waiting[0].arrival if waiting else 0.0,
            waiting_prefill_tokens=self._waiting_tokens,
            inflight_on_track_tokens=on_track_tokens,
            inflight_off_track_output_tokens=off_track_tokens,
        )

    def finished_records(self) -> list[RequestRecord]:
        """The records of the requests finished so far (empty unless `keep_records`, which
        a fork without history sets)."""
        return list(self._records)

    def result(self) -> RunResult:
        if self._stats is _UNMETERED:
            raise RuntimeError(
                "a fork without history keeps no run metrics: read its finished_records()"
            )
        duration = self._clock
        return RunResult(
            stats=self._stats.copy(),
            records=list(self._records),
            duration_s=duration,
            iterations=self._iteration,
            mean_kv_usage=self._kv_integral / duration if duration > 0 else 0.0,
            slo=self.slo,
            unfinished=len(self._arrivals) - self._next + len(self._waiting) + len(self._running),
        )


def _np_sum(values: list[float]) -> float:
    """``float(np.sum(values))`` for a short list, in numpy's own order (pairwise blocks
    of 8 accumulators) but without building an array."""
    return _pairwise_sum(values, 0, len(values))


def _pairwise_sum(a: list[float], lo: int, n: int) -> float:
    """numpy's ``pairwise_sum`` over ``a[lo:lo + n]`` (numpy/_core/src/umath/loops_utils.h)."""
    if n < 8:
        res = 0.0
        for i in range(lo, lo + n):
            res += a[i]
        return res
    if n <= 128:
        r0, r1, r2, r3, r4, r5, r6, r7 = a[lo : lo + 8]
        i = lo + 8
        stop = lo + n - n % 8
        while i < stop:
            r0 += a[i]
            r1 += a[i + 1]
            r2 += a[i + 2]
            r3 += a[i + 3]
            r4 += a[i + 4]
            r5 += a[i + 5]
            r6 += a[i + 6]
            r7 += a[i + 7]
            i += 8
        res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
        for j in range(i, lo + n):
            res += a[j]
        return res
    half = n // 2
    half -= half % 8
    return _pairwise_sum(a, lo, half) + _pairwise_sum(a, lo + half, n - half)


class _Unmetered:
    """The run metrics of a fork without history: every latency and finished request is
    dropped (`_execute`'s inter-token latencies go to a fresh buffer each step)."""

    @property
    def itl(self) -> _Unmetered:
        return self

    @property
    def buffer(self) -> array:
        return array("d")

    def settle(self) -> None:
        pass

    def add(self, value: float) -> None:
        pass

    def add_many(
        self, values: np.ndarray | list[float], counts: np.ndarray | list[int] | None = None
    ) -> None:
        pass

    def add_request(self, record: RequestRecord, good: bool) -> None:
        pass


_UNMETERED = _Unmetered()
_HISTORY = ("_stats", "_records")
"""`SimEngine` attributes a fork without history starts afresh rather than copies."""

_SHARED = (int, float, bool, str, bytes, type(None), tuple, frozenset)
_SHARED_OBJECTS = (*_SHARED, EngineProfile, SLO, Workload, Request, Requests)


def _copy_state(value: object, twin: Callable[[_Req], _Req]) -> object:
    """A copy of one `SimEngine` attribute for `SimEngine.fork`.

    Immutable values and the shared inputs (profile, SLO, workload) are shared; containers
    of per-request state get per-request copies (`twin` keeps one copy per request, so a
    request in two containers stays one object); anything else is deep-copied, so state
    added to the engine later is never shared by mistake (only slower to fork).
    """
    if isinstance(value, _SHARED_OBJECTS):
        return value
    if isinstance(value, list | deque):
        if value and isinstance(value[0], _Req):
            return type(value)(map(twin, value))
        if not value or isinstance(value[0], (*_SHARED, RequestRecord, Request, np.ndarray)):
            return type(value)(value)  # shallow: the items are never mutated in place
    if isinstance(value, array):
        return array(value.typecode, value)
    if isinstance(value, RunMetrics | TelemetryAccumulator):
        return value.copy()
    return copy.deepcopy(value)

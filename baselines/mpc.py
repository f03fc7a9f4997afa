"""`mpc`: a lookahead oracle for the simulator (model-predictive control with the true future).

At each re-plan it forks the running `SimEngine` (which holds the workload's true future
arrivals and lengths), continues each candidate (max_num_seqs, max_num_batched_tokens)
pair over a horizon with that pair fixed, and applies the pair whose horizon scores best.
It is the upper reference the rules and the learned controller are measured against, and
the teacher for imitation; it reads the simulator's future, so it cannot run on a real
engine or serve.

The score of a horizon [t0, t0 + H], in output tokens (the units of goodput), counts
requests that were not already off pace at t0 (`on_pace`: TTFT met or its deadline
ahead, and the mean TPOT projected with the remaining tokens (true length) at the recent
decode step time within target; with ``pace=recoverable``, at the faster of that and a
pure-decode step of the running batch, `recoverable_step_s`):

- **+ output** of each request that finishes in the horizon meeting the SLOs;
- **+ generated so far** of each started, unfinished request still on pace at t0 + H
  that the KV cache can carry to completion: with the true lengths, the running requests
  in admission order up to the last whose blocks still fit at their peak (`peak_blocks`,
  as the `oracle` controller uses); vLLM would preempt the later ones;
- **- output** of each request lost in the horizon: finished missing an SLO, started and
  now off pace, not started by a TTFT deadline inside the horizon, or not started by
  t0 + H while the queue ahead of it, drained at the (net of recompute) prompt tokens
  per second this candidate prefilled at, would reach it after its deadline;
- **- arrival rate x mean output x (drain time - TTFT target)** (at most H): while the
  queue left at t0 + H takes longer than the TTFT target to drain, new arrivals are lost
  too. Without this terminal term a short horizon prefers starving a queue whose requests
  are already lost, which leaves every later arrival behind them.

With ``ttft_ties=T`` (default 0), the candidates of a sweep that score within T (relative,
as imitation's `TIE_TOLERANCE` measures) of its best tie, and the tie goes to the one whose
horizon spent the fewest request-seconds before first tokens: a lower mean TTFT where goodput
does not tell the candidates apart. Without it, light load leaves the limits where they
were: every candidate meets the SLOs, and a lead of a token or two in the horizon-end credit
holds max_num_seqs at the running count while requests wait (on the Azure 2023 conversation
replay, 300 requests on the 7B H100, deciding every 500 ms, the sampled-future 16 s teacher
kept a p99 TTFT of 444 ms; with ``ttft_ties=0.001`` 215 ms, goodput 875.0 tok/s both). It is off by
default: over the learned report's four suites (seeds 0-2, against the same teacher without
it) ``ttft_ties=0.001`` scored 1.003 / 1.003 / 0.999 / 0.987 (held-out / training / families
/ unseen; 0.938 on the unseen Azure code replay x2 on the H100, where admitting sooner costs
TPOT) and ``ttft_ties=0.01`` 0.966 on the held-out suite, though p99 TTFT fell on most
scenarios. Near-ties of the budget alone do not help: the least wait is often a small chunk
(prefilling several short prompts first), and the replay's p99 TTFT rose to 487 ms.

With ``recompute=W`` (default 0) a horizon also pays W output tokens for each token whose
KV a preemption dropped in it (the env's ``w_recompute``): without it, preempting is free
wherever the recompute still meets the SLOs, and a teacher that preempts freely teaches
its student to.

Losing a request costs its whole output whether it misses TTFT or TPOT, so admitting
everyone to dodge TTFT misses at the price of every TPOT does not pay. The candidate
search is coordinate-wise on log grids: from the current pair, every max_num_seqs on the
grid (plus the running count, and the `oracle` controller's most requests that never need
a preemption) with the current budget, then every budget with the best max_num_seqs (``rounds``
times); the current pair wins ties (and must be beaten by more than ``margin``), which
keeps the limits from flapping between equal futures (other ties go to the larger value).
The last round's two sweeps stay readable (`MPCController.sweeps`): how much each knob's
choice mattered, which imitation can weigh its labels by. A candidate whose limits a scored
horizon never met (`SimEngine.peak_demand`: its max_num_seqs and the scored one's both above
the most requests that ran, or likewise its budget) would repeat that horizon exactly, so it
takes that score without a rollout (`reused`): the same choices, at a fraction of the rollouts.

With ``future=sampled`` the arrivals after a re-plan are not the workload's but one draw,
shared by every candidate of that re-plan: a Poisson stream at the recent (short-window)
arrival rate, each request's lengths resampled from the last `RECENT_ARRIVALS` arrivals.
Admitted requests keep their true lengths, unless ``lengths=sampled``: then each admitted
unfinished request's output length is drawn once a re-plan from the outputs of the recent
arrivals already finished that exceed what it has generated (none: what it has generated
plus the mean output), for the rollouts and for which requests are already off pace, and the
`oracle` controller's limit (true lengths) is no candidate. (A sampled future's arrivals still
take the lengths of recent arrivals, finished or not.) With ``future=renewal`` the draw keeps
the arrivals' burstiness, which a Poisson stream smooths away: the gaps between arrivals are
resampled from the gaps between the last `RECENT_ARRIVALS` arrivals, scaled to the recent
(short-window) arrival rate (a renewal process with the recent gaps' shape at the recent
rate; its first gap is one longer than the wait since the last arrival), the lengths as with
``sampled``. Unscaled, a few arrivals at one instant make a stream of millions; levelled by
the arrivals since the oldest of them, the draw lags a rate that steps (on the training
suite's math/chat shift it scored 406 tok/s against 479). With ``future=auto`` a re-plan
draws a renewal future where the recent gaps' coefficient of variation passes `BURSTY_CV`
(bursts to come), else a Poisson one as ``sampled`` does (a rate that steps, Poisson within
each step). It scored as ``sampled`` does: 1.001x its goodput over 25 scenarios of the learned
report's suites (seeds 373-375; held-out 1.015, training 1.005, users' SLOs 0.996, unseen
0.994), up on bursty conversation at TTFT 500 ms on the 7B (1.034), down on the math/chat shift
(0.931), whose rate steps mix two rates in the recent gaps. With ``rate=lower`` a drawn future
runs at the lower of the short-window (5 s) and long-window (30 s) arrival rates: right after
a burst the short window counts the burst as the rate to come; ``rate=bursty`` does so only
where the recent gaps' coefficient of variation passes `BURSTY_CV`, so a rate that steps
(Poisson within each step) keeps the short window. With ``draws=K`` (default 1) a re-plan
draws K futures, every candidate is rolled out against each, and it scores their mean (its
peak demand the largest of the K): one draw's noise no longer picks the limits, at K times
the rollouts. It scored lower, not higher: ``rate=bursty:draws=3`` 1.147 of the tuned pair
over the training and held-out suites (seeds 335-337) against 1.182 with one draw (the
math/chat shift 1.64 against 1.93, the 7B's sustained overload 0.90 against 1.01). The gap
between the true and the sampled futures is what knowing the future is worth, a gain no
deployable controller can reach.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from batchpilot.baselines.checks import keyword_value, require
from batchpilot.baselines.oracle import OracleController, largest_fitting, peak_blocks
from batchpilot.envs.action_grid import BUDGET_GRID
from batchpilot.envs.engine import Engine
from batchpilot.envs.metrics import SLO
from batchpilot.envs.plain_numbers import plain_int
from batchpilot.envs.profiles import NULL_BLOCKS
from batchpilot.envs.sim_engine import SimEngine
from batchpilot.envs.telemetry import Limits, Telemetry
from batchpilot.envs.workload import Request

SEQS_GRID = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
FUTURES = ("true", "sampled", "renewal", "auto")
"""Values of ``future``: the simulator's truth, or a draw (module doc)."""
LENGTHS = ("true", "sampled")
"""Values of ``lengths``: the simulator's truth, or a draw (module doc)."""
PACES = ("recent", "recoverable")
"""Values of ``pace``: the step time at which a running request counts as already off pace
at a re-plan (module doc, `recoverable_step_s`)."""
RATES = ("recent", "lower", "bursty")
"""Values of ``rate``: the arrival rate a drawn future runs at, the recent (short-window) one,
the lower of the short- and long-window rates, or that lower one only where the recent gaps
between arrivals vary more than `BURSTY_CV` (module doc)."""
BURSTY_CV = 1.5
"""The coefficient of variation of the recent gaps above which ``rate=bursty`` takes the lower
rate (Poisson arrivals: 1)."""
RECENT_ARRIVALS = 64
"""Arrivals whose lengths a sampled future resamples."""


def parse_grid(text: str) -> tuple[int, ...]:
    """``8/32/128`` -> (8, 32, 128): a grid written without commas (commas separate specs)."""
    try:
        values = tuple(sorted({plain_int(v) for v in text.split("/")}))
    except ValueError:
        raise ValueError("whole numbers >= 1 separated by '/', e.g. 8/32/128") from None
    if values[0] < 1:
        raise ValueError("each value must be >= 1")
    return values


def _one_of(choices: tuple[str, ...]) -> Callable[[str], str]:
    """The parser of a keyword taking one of `choices` (see the module doc); errors say what
    it takes (`keyword_value` names the keyword and the text)."""

    def parse(text: str) -> str:
        if text not in choices:
            raise ValueError(f"one of {', '.join(choices)}")
        return text

    return parse


MAX_DRAWS = 16
"""The most futures a re-plan draws (``draws``): each multiplies its rollouts."""

parse_future = _one_of(FUTURES)
parse_lengths = _one_of(LENGTHS)
parse_pace = _one_of(PACES)
parse_rate = _one_of(RATES)

MPC_ARGS = {
    "horizon_s": float,
    "replan_s": float,
    "seqs": parse_grid,
    "tokens": parse_grid,
    "rounds": int,
    "margin": float,
    "future": parse_future,
    "recompute": float,
    "lengths": parse_lengths,
    "pace": parse_pace,
    "ttft_ties": float,
    "rate": parse_rate,
    "draws": int,
}
"""Spec keywords: ``mpc:horizon_s=4:replan_s=1:seqs=8/32/128:tokens=512/2048:future=sampled``
(and ``future=renewal``, ``future=auto``, ``recompute=0.5``, ``lengths=sampled``,
``pace=recoverable``, ``ttft_ties=0.01``, ``rate=lower``, ``rate=bursty``, ``draws=3``)."""


class MPCController:
    """Lookahead oracle: re-plans every `replan_s` of engine time over `horizon_s`.

    `seqs` and `tokens` are the candidate grids (clipped to the engine's caps, which are
    always candidates); `rounds` coordinate sweeps per re-plan; `margin` is the relative
    score gain a new pair needs over the current one; `future` the arrivals a rollout
    sees; `recompute` the output tokens a dropped KV token costs; `lengths` the output
    lengths of the admitted requests it plans with; `pace` the step time at which a running
    request counts as already off pace (module doc); `ttft_ties` the relative score gap
    within which candidates count as tied and go to the least first-token wait; `rate` the
    arrival rate a drawn future runs at (module doc); `draws` how many futures a re-plan
    draws, a candidate scoring their mean. Simulator
    only. After each re-plan, `sweeps` holds its last round's horizon scores: (max_num_seqs
    -> score at the budget then in hand, budget -> score at the chosen max_num_seqs).
    """

    simulator_only = True

    def __init__(
        self,
        horizon_s: float = 4.0,
        replan_s: float = 1.0,
        seqs: tuple[int, ...] | str = SEQS_GRID,
        tokens: tuple[int, ...] | str = BUDGET_GRID,
        rounds: int = 1,
        margin: float = 0.0,
        future: str = "true",
        recompute: float = 0.0,
        lengths: str = "true",
        pace: str = "recent",
        ttft_ties: float = 0.0,
        rate: str = "recent",
        draws: int = 1,
    ) -> None:
        require(horizon_s > 0, "horizon_s", horizon_s, "> 0")
        require(replan_s > 0, "replan_s", replan_s, "> 0")
        require(rounds >= 1, "rounds", rounds, ">= 1")
        require(margin >= 0, "margin", margin, ">= 0")
        require(0 <= recompute < float("inf"), "recompute", recompute, "a finite number >= 0")
        require(0 <= ttft_ties < 1, "ttft_ties", ttft_ties, "in [0, 1)")
        require(1 <= draws <= MAX_DRAWS, "draws", draws, f"1 to {MAX_DRAWS}")
        self.horizon_s = horizon_s
        self.replan_s = replan_s
        grid = {"seqs": seqs, "tokens": tokens}
        self.seqs, self.tokens = (
            keyword_value(k, parse_grid, v) if isinstance(v, str) else tuple(sorted(set(v)))
            for k, v in grid.items()
        )
        self.rounds = rounds
        self.margin = margin
        self.future = keyword_value("future", parse_future, future)
        self.recompute = recompute
        self.lengths = keyword_value("lengths", parse_lengths, lengths)
        self.pace = keyword_value("pace", parse_pace, pace)
        self.ttft_ties = ttft_ties
        self.rate = keyword_value("rate", parse_rate, rate)
        if self.future == "true" and (draws > 1 or self.rate != "recent"):
            raise ValueError(
                ("draws must be 1" if draws > 1 else f"rate={self.rate} is read by a drawn future")
                + " with future=true (one true future); draw with future=sampled, "
                "future=renewal or future=auto"
            )
        self.draws = draws
        self.name = "mpc"
        self._engine: Engine | None = None
        self._packing = OracleController()
        self.plans = 0
        self.rollouts = 0
        self.reused = 0
        self.plan_wall_s = 0.0
        self.sweeps: tuple[dict[int, float], dict[int, float]] = ({}, {})

    def reset(self, engine: Engine) -> None:
        """Keep the engine, which must be the simulator (it forks it at each re-plan)."""
        needed = ("fork", "unfinished_requests", "arrived_requests", "replace_future")
        missing = [m for m in needed if not callable(getattr(engine, m, None))]
        if missing:
            raise TypeError(
                f"the mpc controller looks ahead by forking a simulated engine with the true "
                f"future workload; {type(engine).__name__} lacks {', '.join(missing)} "
                "(mpc runs only on --engine sim, never on vLLM or in serving)"
            )
        self._engine = engine
        self._packing.reset(engine)
        self._seq_grid = _clip(self.seqs, engine.max_num_seqs)
        self._token_grid = _clip(self.tokens, engine.max_num_batched_tokens)
        self._current = (engine.max_num_seqs, engine.max_num_batched_tokens)
        self._next_plan = float("-inf")
        self.plans = self.rollouts = self.reused = 0
        self.plan_wall_s = 0.0
        self._rng = np.random.default_rng(0)
        self._futures: list[list[Request] | None] = [None]
        self._outputs: list[int] | None = None
        self.sweeps = ({}, {})

    def decide(self, telemetry: Telemetry) -> Limits:
        if self._engine is None:
            raise RuntimeError("call reset(engine) before decide()")
        if telemetry.time_s >= self._next_plan:
            start = time.perf_counter()
            self._current = self._plan(telemetry)
            self.plan_wall_s += time.perf_counter() - start
            self.plans += 1
            self._next_plan = telemetry.time_s + self.replan_s
        return Limits(*self._current)

    # ------------------------------------------------------------------ planning
    def _plan(self, telemetry: Telemetry) -> tuple[int, int]:
        scores: dict[tuple[int, int], float] = {}
        # besides the grid: hold the running count, and the `oracle` controller's limit
        # (the most requests that never need a preemption, from the true lengths)
        state = {max(telemetry.num_requests_running, 1)}
        self._outputs = self._sampled_outputs(telemetry) if self.lengths == "sampled" else None
        if self._outputs is None:
            state.add(self._packing.decide(telemetry).max_num_seqs)
        seq_grid = sorted(set(self._seq_grid) | state)

        lost = self._lost(telemetry)
        self._futures = [None]
        if self.future != "true":
            renew = self.future == "renewal" or (self.future == "auto" and self._bursty())
            draw = self._renewal_future if renew else self._sampled_future
            self._futures = [draw(telemetry) for _ in range(self.draws)]

        peaks: dict[tuple[int, int], tuple[int, int]] = {}  # of each rollout's horizon
        waits: dict[tuple[int, int], float] = {}  # request-seconds before first tokens

        def score(pair: tuple[int, int]) -> float:
            if pair not in scores:
                twin = _same_horizon(pair, peaks)
                if twin is None:
                    scores[pair], peaks[pair], waits[pair] = self._scored(telemetry, pair, lost)
                else:
                    scores[pair], waits[pair] = scores[twin], waits[twin]
                    self.reused += 1
            return scores[pair]

        def least_wait(pairs: list[tuple[int, int]]) -> None:
            """With `ttft_ties`: of the best so far and a sweep's `pairs` (scored, larger
            limits first), the least wait among those tied with the top score; the current
            pair's score counts with its `margin`, as in `consider`, and the best so far keeps
            an equal wait."""
            nonlocal best, best_score
            if not self.ttft_ties:
                return

            def bar(p: tuple[int, int]) -> float:
                return scores[p] + (self.margin * abs(scores[p]) if p == incumbent else 0.0)

            pool = [best, *(p for p in pairs if p != best)]
            top = max(bar(p) for p in pool)
            tied = [p for p in pool if top - bar(p) < self.ttft_ties * (abs(top) + 1.0)]
            pick = min(tied, key=lambda p: waits[p])  # the first of equal waits: best
            best, best_score = pick, scores[pick]

        incumbent = self._current
        best, best_score = incumbent, score(incumbent)

        def consider(pair: tuple[int, int]) -> None:
            nonlocal best, best_score
            bar = best_score + (self.margin * abs(best_score) if best == incumbent else 0.0)
            if score(pair) > bar:
                best, best_score = pair, score(pair)

        for _ in range(self.rounds):
            before = best
            for s in reversed(seq_grid):  # ties go to the larger limit
                consider((s, best[1]))
            least_wait([(s, best[1]) for s in reversed(seq_grid)])
            seq_sweep = {s: scores[(s, best[1])] for s in seq_grid}
            for t in reversed(self._token_grid):
                consider((best[0], t))
            least_wait([(best[0], t) for t in reversed(self._token_grid)])
            token_sweep = {t: scores[(best[0], t)] for t in self._token_grid}
            if best == before:
                break
        self.sweeps = (seq_sweep, token_sweep)
        return best

    def rollout(self, telemetry: Telemetry, pair: tuple[int, int], lost: set[str]) -> float:
        """The horizon score (output tokens) of holding `pair` for `horizon_s` from the
        engine's state at `telemetry`; `lost`: ids of requests already off pace then."""
        return self._scored(telemetry, pair, lost)[0]

    def _scored(
        self, telemetry: Telemetry, pair: tuple[int, int], lost: set[str]
    ) -> tuple[float, tuple[int, int], float]:
        """`_rollout`'s score and wait, averaged over the re-plan's futures, and the largest
        peak demand of their horizons."""
        runs = [self._rollout(telemetry, pair, lost, future) for future in self._futures]
        peak = (max(r[1][0] for r in runs), max(r[1][1] for r in runs))
        return sum(r[0] for r in runs) / len(runs), peak, sum(r[2] for r in runs) / len(runs)

    def _rollout(
        self,
        telemetry: Telemetry,
        pair: tuple[int, int],
        lost: set[str],
        future: list[Request] | None,
    ) -> tuple[float, tuple[int, int], float]:
        """The horizon score of `pair` with the arrivals `future` (None: the workload's),
        the horizon's `SimEngine.peak_demand`, and the request-seconds spent in it before
        first tokens."""
        now = telemetry.time_s
        engine = self._engine.fork(history=False)  # type: ignore[union-attr]
        if future is not None:
            engine.replace_future(future)
        if self._outputs is not None:
            engine.replace_outputs(self._outputs)
        self.rollouts += 1
        engine.set_limits(Limits(*pair))
        telemetry = engine.advance(until_s=now + self.horizon_s)
        end = telemetry.time_s  # earlier if the workload ran out
        slo = engine.slo
        limit = float("inf") if slo.ttft_ms is None else slo.ttft_ms / 1e3
        score = telemetry.interval_good_output_tokens
        score -= self.recompute * telemetry.interval_recomputed_tokens
        wait = 0.0
        for r in engine.finished_records():
            wait += max(min(r.first_token_s, end) - max(r.arrival_s, now), 0.0)
            if r.request_id not in lost and not slo.met(r.ttft_s, r.tpot_s, r.e2el_s):
                score -= r.output_tokens
        entries = engine.unfinished_requests()
        running = telemetry.num_requests_running
        pace_s = telemetry.recent_tbt_s
        kept = self._kv_fit(engine, entries[:running])
        # Past the horizon, the queue drains at the pace this candidate prefilled at: a
        # request not started by `end` is lost if at that pace its first token would come
        # after its deadline, and while the queue takes longer than the TTFT target to
        # drain, new arrivals (at the recent arrival rate, mean output) are lost too.
        span = end - now
        progress = telemetry.interval_prompt_tokens - telemetry.interval_recomputed_tokens
        pace = max(progress, 0) / span if span > 0 else 0.0
        queued = 0
        for i, (rid, arrival, first, last, generated, output, prompt) in enumerate(entries):
            deadline = arrival + limit
            if i >= running:
                queued += prompt + generated
            wait += max((first if first >= 0 else end) - max(arrival, now), 0.0)
            if rid in lost:
                continue
            if first >= 0:
                if on_pace(slo, end, arrival, first, last, generated, output, pace_s):
                    score += generated if i < kept else 0
                else:
                    score -= output
            elif deadline <= end or (
                i >= running and end + self._drain_s(queued, pace) > deadline
            ):
                score -= output
        backlog = min(self._drain_s(queued, pace) - limit, self.horizon_s)
        if backlog > 0:
            score -= backlog * telemetry.arrival_rate * telemetry.output_mean
        return float(score), engine.peak_demand(), wait

    def _sampled_future(self, telemetry: Telemetry) -> list[Request]:
        """One draw of the arrivals over the horizon (module doc)."""
        recent = self._engine.arrived_requests(RECENT_ARRIVALS)  # type: ignore[union-attr]
        n = int(self._rng.poisson(self._future_rate(telemetry) * self.horizon_s))
        if not recent or n == 0:
            return []
        times = np.sort(telemetry.time_s + self._rng.uniform(0.0, self.horizon_s, n))
        return self._with_recent_lengths(times, recent)

    def _renewal_future(self, telemetry: Telemetry) -> list[Request]:
        """One draw of the arrivals over the horizon as a renewal process (module doc)."""
        recent = self._engine.arrived_requests(RECENT_ARRIVALS)  # type: ignore[union-attr]
        now, end = telemetry.time_s, telemetry.time_s + self.horizon_s
        gaps = np.diff([r.arrival_s for r in recent])
        rate = self._future_rate(telemetry)
        if rate <= 0 or not (gaps > 0).any():  # no gaps to renew from: a Poisson draw
            return self._sampled_future(telemetry)
        gaps *= 1.0 / (rate * gaps.mean())  # the recent gaps' shape at the recent rate
        waited = now - recent[-1].arrival_s
        longer = gaps[gaps > waited]  # the first gap: one longer than the wait so far
        if len(longer):
            t = recent[-1].arrival_s + longer[self._rng.integers(len(longer))]
        else:
            t = now + gaps[self._rng.integers(len(gaps))]
        times = []
        while t <= end:
            times.append(t)
            t += gaps[self._rng.integers(len(gaps))]
        return self._with_recent_lengths(times, recent)

    def _future_rate(self, telemetry: Telemetry) -> float:
        """The arrivals per second a drawn future runs at (`rate`)."""
        lower = min(telemetry.arrival_rate_short, telemetry.arrival_rate)
        if self.rate == "lower":
            return lower
        if self.rate == "bursty" and self._bursty():
            return lower
        return telemetry.arrival_rate_short

    def _bursty(self) -> bool:
        """Whether the gaps between the recent arrivals vary more than `BURSTY_CV`."""
        recent = self._engine.arrived_requests(RECENT_ARRIVALS)  # type: ignore[union-attr]
        gaps = np.diff([r.arrival_s for r in recent])
        return len(gaps) > 2 and gaps.mean() > 0 and gaps.std() > BURSTY_CV * gaps.mean()

    def _with_recent_lengths(self, times: Sequence[float], recent: list[Request]) -> list[Request]:
        """Requests arriving at `times`, each with the lengths of one of `recent`, drawn."""
        picks = self._rng.integers(len(recent), size=len(times))
        return [
            Request(f"sampled-{i}", float(t), recent[j].prompt_tokens, recent[j].output_tokens)
            for i, (t, j) in enumerate(zip(times, picks, strict=True))
        ]

    def _sampled_outputs(self, telemetry: Telemetry) -> list[int]:
        """One draw of the admitted unfinished requests' output lengths (module doc)."""
        engine = self._engine
        entries = engine.unfinished_requests()  # type: ignore[union-attr]
        open_ids = {e[0] for e in entries}
        seen = [
            r.output_tokens
            for r in engine.arrived_requests(RECENT_ARRIVALS)  # type: ignore[union-attr]
            if r.request_id not in open_ids
        ]
        cap = engine.max_tokens  # type: ignore[union-attr]
        outputs = []
        for _, _, _, _, generated, _, prompt in entries:
            longer = [o for o in seen if generated < o <= cap - prompt]
            if longer:
                outputs.append(longer[self._rng.integers(len(longer))])
            else:
                outputs.append(min(generated + max(round(telemetry.output_mean), 1), cap - prompt))
        return outputs

    def _lost(self, telemetry: Telemetry) -> set[str]:
        """Ids of the admitted unfinished requests already off pace at the re-plan (at the
        step time `pace` names)."""
        engine = self._engine
        now, tbt = telemetry.time_s, telemetry.recent_tbt_s
        entries = engine.unfinished_requests()  # type: ignore[union-attr]
        if self.pace == "recoverable":
            tbt = recoverable_step_s(engine, entries[: telemetry.num_requests_running], telemetry)
        outputs = [e[5] for e in entries] if self._outputs is None else self._outputs
        return {
            rid
            for (rid, arrival, first, last, gen, _, _), out in zip(entries, outputs, strict=True)
            if not on_pace(engine.slo, now, arrival, first, last, gen, out, tbt)  # type: ignore[union-attr]
        }

    def _kv_fit(self, engine: Engine, running: list[tuple]) -> int:
        """How many of the running requests, in admission order, the KV cache can carry to
        completion (true lengths): vLLM preempts the later ones, so they are not on track."""
        if not running:
            return 0
        table = np.array([(e[6] + e[4], e[5] - e[4]) for e in running], dtype=np.int64)
        capacity = engine.num_total_blocks - NULL_BLOCKS
        bs = engine.block_size

        def fits(k: int) -> bool:
            return peak_blocks(table[:k, 0], table[:k, 1], bs) <= capacity

        if fits(len(running)):
            return len(running)
        return largest_fitting(fits, 0, len(running) - 1)  # fits(len(running)) does not hold

    def _drain_s(self, tokens: int, pace: float) -> float:
        """Seconds to prefill `tokens` at `pace` tokens/s (infinite at pace 0)."""
        if tokens <= 0:
            return 0.0
        return tokens / pace if pace > 0 else float("inf")

    def cost(self) -> dict[str, float]:
        """Planning totals so far: re-plans, rollouts, candidates scored by a rollout they
        would repeat (`reused`), wall seconds spent planning."""
        return {
            "plans": self.plans,
            "rollouts": self.rollouts,
            "reused": self.reused,
            "plan_wall_s": self.plan_wall_s,
        }


def _same_horizon(
    pair: tuple[int, int], peaks: dict[tuple[int, int], tuple[int, int]]
) -> tuple[int, int] | None:
    """A rolled-out pair whose horizon `pair` would repeat exactly, or None: on each knob
    either the same value, or both values above the most that horizon asked for (its
    `peak_demand`: that limit never acted, nor would the other)."""
    seqs, tokens = pair
    for (s, t), (running, asked) in peaks.items():
        if (s == seqs or min(s, seqs) > running) and (t == tokens or min(t, tokens) > asked):
            return s, t
    return None


def _clip(grid: tuple[int, ...], cap: int) -> tuple[int, ...]:
    return tuple(sorted({min(v, cap) for v in grid} | {cap}))


def recoverable_step_s(engine: SimEngine, running: list[tuple], telemetry: Telemetry) -> float:
    """The step time the running requests can decode at from here: the recent one, or, if
    that is slower, a pure-decode step of these requests (no candidate can remove a running
    request, but one that admits nothing and prefills nothing leaves just their decodes).
    Judged at the recent step time alone, a batch a little past the TPOT target is written
    off whole, every candidate then ties on it, and the ties go to the largest limits: the
    batch only grows (a teacher's collapse under sustained overload).

    Measured (``pace=recoverable`` against the default): on the training suite's sustained
    overload of the 7B A100, `mpc:horizon_s=16` 222 -> 245 tok/s over 10 seeds (the tuned
    static pair 282); over the four suites of the learned report (seeds 0-4, against the
    pair) 1.129 / 1.133 / 1.022 / 1.120 -> 1.134 / 1.157 / 1.021 / 1.122, while `mpc` (4 s)
    fell on held-out 1.069 -> 1.036. Students taught by it scored worse than the shipped
    ones (six members, seeds 10-19: G 1.020 against 1.050), so it is not the default."""
    recent = telemetry.recent_tbt_s
    if not running:
        return recent
    kv = sum(prompt + generated for *_, generated, _, prompt in running)
    return min(recent, engine.profile.step.decode_time(len(running), kv))


def on_pace(
    slo: SLO,
    now: float,
    arrival: float,
    first: float,
    last: float,
    generated: int,
    output: int,
    step_s: float,
) -> bool:
    """Whether an unfinished request will meet `slo` if its remaining tokens (true length)
    come one per `step_s` from now on: TTFT met (or its deadline ahead, if not started),
    and the projected mean TPOT and end-to-end latency within target. Unlike the mean
    TPOT so far, this does not write off a request whose first few tokens were slow but
    that has enough tokens left to make up for them."""
    if first < 0:
        return slo.ttft_ms is None or (now - arrival) * 1e3 <= slo.ttft_ms
    if slo.ttft_ms is not None and (first - arrival) * 1e3 > slo.ttft_ms:
        return False
    finish = max(last, now) + (output - generated) * step_s
    tpot_ms = (finish - first) / (output - 1) * 1e3 if output > 1 else 0.0
    if slo.tpot_ms is not None and tpot_ms > slo.tpot_ms:
        return False
    return slo.e2el_ms is None or (finish - arrival) * 1e3 <= slo.e2el_ms

"""`batchpilot/Batching-v0`: set an LLM engine's two batching limits every control interval."""

from __future__ import annotations

import numbers
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from batchpilot.envs.action_grid import ActionGrid
from batchpilot.envs.arrivals import DEFAULT_ARRIVAL, Arrival
from batchpilot.envs.controller import check_interval_iters, check_interval_s
from batchpilot.envs.engine import Engine
from batchpilot.envs.metrics import DEFAULT_SLO, SLO, goodput_slo, slo_ranges
from batchpilot.envs.observation import OBSERVATION_FIELDS, SCALES, Observer
from batchpilot.envs.plain_numbers import is_number, is_whole
from batchpilot.envs.profiles import DEFAULT_PROFILE, EngineProfile, get_profile
from batchpilot.envs.telemetry import Telemetry
from batchpilot.envs.traces import DEFAULT_BAD_ROWS
from batchpilot.envs.workload import Workload, scale_range
from batchpilot.envs.workloads import (
    DEFAULT_SOURCE,
    MAX_REQUESTS,
    draw_probabilities,
    is_trace_file,
    make_workload,
    short_trace_note,
    trace_window,
)

__all__ = ["OBSERVATION_FIELDS", "BatchingEnv", "WorkloadSpec"]


@dataclass(frozen=True)
class WorkloadSpec:
    """How to draw an episode's workload: a source, an arrival process and randomisation.

    `rate_scale` (lo, hi) multiplies every rate of the arrival process by a factor drawn
    uniformly per episode; `length_scale` does the same for output lengths
    and `prompt_scale` for prompt lengths (cut to fit the context, the output after the
    prompt).
    `profiles`, if given, restricts the spec to episodes on those engine profiles (rates
    that suit one GPU overload another). An episode draws its profile (by the env's profile
    weights), then one of the specs that apply to it with probability proportional to `weight`.
    """

    source: str = DEFAULT_SOURCE
    arrival: str = DEFAULT_ARRIVAL
    num_requests: int = 400
    rate_scale: tuple[float, float] = (1.0, 1.0)
    length_scale: tuple[float, float] = (1.0, 1.0)
    prompt_scale: tuple[float, float] = (1.0, 1.0)
    profiles: tuple[str, ...] = ()
    weight: float = 1.0
    bad_rows: str = DEFAULT_BAD_ROWS
    """A trace file's bad rows: stop with their error, or ``skip`` (`load_trace`)."""

    @classmethod
    def coerce(cls, value: str | dict | WorkloadSpec) -> WorkloadSpec:
        if isinstance(value, WorkloadSpec):  # checked as its fields would be in a dict
            data = {k: v for k, v in asdict(value).items() if not (k == "profiles" and not v)}
            if "profiles" in data:
                data["profiles"] = list(data["profiles"])
            return cls.coerce(data)
        if isinstance(value, str):
            return cls(source=value)
        if isinstance(value, dict):
            unknown = set(value) - set(cls.__dataclass_fields__)
            if unknown:
                raise ValueError(f"workload spec: unknown key(s) {sorted(unknown)}")
            data = dict(value)
            for key in ("source", "arrival", "bad_rows"):
                if key in data and not isinstance(data[key], str):
                    got = f"{data[key]!r} ({type(data[key]).__name__})"
                    raise ValueError(f"workload spec: {key} must be a string, got {got}")
            n = data.get("num_requests", cls.num_requests)
            if not is_whole(n) or not 1 <= n <= MAX_REQUESTS:
                raise ValueError(
                    f"workload spec: num_requests must be a whole number in [1, {MAX_REQUESTS}], "
                    f"got {n!r}"
                )
            data["num_requests"] = int(n)
            for key in ("rate_scale", "length_scale", "prompt_scale"):
                if key in data:
                    data[key] = scale_range(data[key], f"workload spec: {key}")
            if "weight" in data:
                data["weight"] = draw_weight(data["weight"], "workload spec")
            if "profiles" in data:
                names = data["profiles"]
                names = [names] if isinstance(names, str) else names
                if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                    raise ValueError(
                        "workload spec: profiles must be a profile name or a list of names, "
                        f"got a {type(names).__name__}"
                        + (" holding other things" if isinstance(names, list) else "")
                    )
                if not names:  # the default () means every profile
                    raise ValueError(
                        "workload spec: profiles is empty; name at least one profile, or leave "
                        "profiles out (every profile)"
                    )
                data["profiles"] = tuple(names)
            return cls(**data)
        raise TypeError(f"workload spec must be a str, dict or WorkloadSpec, got {type(value)}")

    def draw(
        self, rng: np.random.Generator, max_model_len: int, rate_factor: float = 1.0
    ) -> Workload:
        """One episode's workload; every rate times the drawn `rate_scale` and `rate_factor`.
        Of a trace file longer than `num_requests`, a window from a random request on, so
        episodes see the whole trace, not its start only; of one no longer, the whole trace
        (`trace_window`, as a suite's scenario per seed)."""
        arrival = Arrival.parse(self.arrival).scaled(rng.uniform(*self.rate_scale) * rate_factor)
        # drawn only for a longer trace file: other specs keep their streams
        num_requests, start = trace_window(self.source, self.num_requests, rng, self.bad_rows)
        w = make_workload(
            self.source,
            arrival,
            num_requests=num_requests,
            seed=int(rng.integers(2**31)),
            max_model_len=max_model_len,
            bad_rows=self.bad_rows,
            window_start=start,
        )
        g = rng.uniform(*self.length_scale)
        # drawn only when asked for, so the specs without it keep their random streams
        p = rng.uniform(*self.prompt_scale) if self.prompt_scale != (1.0, 1.0) else 1.0
        return w.scaled(p, g, max_model_len)


CONTROL_INTERVAL_S = 0.5
"""One env step's length (s) unless `control_interval_s` or `control_interval_iters` is given."""
MAX_WEIGHT = 1000.0
"""The largest `w_lost` and `w_recompute`: output tokens debited per token lost or recomputed
(larger ones only scale the reward, and past float64 they made it -inf)."""

ScaleRanges = tuple[float, float] | dict[str, tuple[float, float]]
"""A (lo, hi) range of scale factors, or a mapping of profile names to such ranges."""


def profile_ranges(
    value: ScaleRanges, profiles: list[str], what: str
) -> dict[str, tuple[float, float]]:
    """Profile name -> (lo, hi) from one range for all `profiles` or a mapping naming some of
    them; profiles left at (1, 1) are left out."""
    if isinstance(value, dict):
        unknown = sorted(set(value) - set(profiles))
        if unknown:
            raise ValueError(f"{what}: {unknown[0]!r} is not one of the env's profiles {profiles}")
        ranges = {name: scale_range(r, f"{what} {name!r}") for name, r in value.items()}
    else:
        ranges = dict.fromkeys(profiles, scale_range(value, what))
    return {name: r for name, r in ranges.items() if r != (1.0, 1.0)}


def log_uniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    """A draw from [lo, hi], uniform in log (no draw when lo == hi, so streams keep)."""
    return lo if lo == hi else float(np.exp(rng.uniform(np.log(lo), np.log(hi))))


def draw_weight(w: object, what: str) -> float:
    """`w` as a draw weight: a finite number > 0, else an error naming `what`."""
    if not is_number(w) or not 0 < w < np.inf:
        raise ValueError(f"{what}: weight must be a number > 0, got {w!r}")
    return float(w)


def profile_weights(profile: str | list[str] | dict[str, float]) -> dict[str, float]:
    """Profile name -> draw weight, from one name, a list (equal weights) or a mapping of
    names to positive weights."""
    if isinstance(profile, str):
        return {profile: 1.0}
    if not isinstance(profile, dict | list | tuple):
        raise ValueError(
            f"profile must be a name, a list of names or a mapping of names to weights, got "
            f"{profile!r}"
        )
    if isinstance(profile, dict):
        weights = {str(n): draw_weight(w, f"profile {n!r}") for n, w in profile.items()}
    else:
        weights = dict.fromkeys(profile, 1.0)
        if len(weights) < len(profile):
            raise ValueError(
                f"profile list {list(profile)} names a profile twice; give a mapping of "
                "profiles to weights to draw one more often"
            )
    if not weights:
        raise ValueError("profile list is empty")
    return weights


def offered_output_tps(workload: Workload) -> float:
    """The workload's output tokens over its arrival span (at least 1 s): the reward's unit."""
    times = workload.arrival_s  # sorted
    span = float(times[-1] - times[0]) if len(times) else 0.0
    return max(int(workload.output_tokens.sum()), 1) / max(span, 1.0)


class BatchingEnv(gym.Env):
    """
    ## Description
    An LLM serving engine (vLLM V1, simulated or real) serves a stream of requests with
    continuous batching. Every control interval the agent sets both of the engine's
    batching limits: the running-request limit (`max_num_seqs`) and the per-step token
    budget (`max_num_batched_tokens`, the prefill chunk size). Too low wastes the
    accelerator and lets the queue miss its TTFT target; too high overflows the KV cache
    (preemption and recompute) or slows every step past the TPOT target.

    ## Action Space
    `MultiDiscrete` over log grids (`batchpilot.envs.action_grid`): with
    ``action_mode="grid"`` (default) ``[len(SEQ_GRID), len(BUDGET_GRID)]``, absolute grid
    choices; with ``action_mode="step"`` ``[3, 3]``, one grid step down, stay or up for
    each knob. Grid points above the engine's caps act as the caps; nothing else bounds
    the choice (no rule's limit caps it).

    ## Observation Space
    `Box(-10, 10, (23,), float32)`: `batchpilot.envs.observation.Observer` (queue and the
    age of its head against the TTFT target, pending prefill tokens, short and long
    arrival rates, KV usage and its trend, mean and p90 step time against the TPOT
    target, the prefill/decode mix, the limits in effect, length estimates, the engine's
    measured speed as a line of step time on tokens per step), scaled by the fixed
    constants `SCALES`.

    ## Rewards
    Goodput credit, dense, in seconds of the episode's offered output (output tokens divided
    by the workload's offered output rate, `offered_output_tps` in the reset info: its
    output tokens over its arrival span, at least 1 s):

        r = (good_finished + on_track_now - on_track_before
             - w_lost * (bad_finished + off_track_now - off_track_before)
             - w_recompute * recomputed_tokens) / offered_output_tps

    Serving every request within the SLO earns about one per second of the run, on a light
    model or a heavy one, on a short or a long trace; so each episode weighs by its length
    in time, not by how many tokens its engine can produce, and a policy trained on several
    profiles and workloads does not neglect the slow ones.

    - ``good_finished``: output tokens of requests that finished in the interval meeting
      every SLO (`interval_good_output_tokens`);
    - ``on_track``: output tokens generated so far by unfinished requests still on track
      for the SLO (TTFT met or not yet due, mean TPOT so far within target;
      `Telemetry.inflight_on_track_tokens`). A request's tokens are credited as they are
      generated while it is on track; when it falls off track, everything credited for it
      is debited; when it finishes, its credit becomes final if it met the SLO. Over an
      episode run to its end the credit therefore sums to exactly the goodput's token count
      (over `offered_output_tps`); one cut short by a step limit keeps the credit of its
      requests still on track. The reports' ``output_goodput`` divides those tokens by the
      run's duration, which a policy that drains the last requests slower lengthens: the
      reward does not see that (it counts tokens, not the tail);
    - ``off_track``: full output lengths of unfinished requests off track for the SLO,
      queued ones whose TTFT deadline passed before admission included
      (`Telemetry.inflight_off_track_output_tokens`); ``bad_finished``: output tokens of
      requests that finished missing it (`interval_bad_output_tokens`). A request is
      debited its whole output, `w_lost` (default 0: off) per token, the moment it falls
      off track, and credited back if it returns on track, so over an episode this part sums
      to `w_lost` x the output lost to the SLO, and the return to (1 + `w_lost`) x good -
      `w_lost` x offered output: the same best policy, but a request left queued past its
      deadline costs something when it happens, not never (the credit alone only ever
      withholds what it would have earned);
    - ``recomputed_tokens``: tokens whose KV cache was dropped by preemption in the
      interval (`w_recompute` good tokens each, default 0.5): the price of preemption.

    ``info`` holds the telemetry and ``reward_<part>`` for ``credit``, ``lost`` and
    ``recompute``.

    ## Episode End
    Terminated when every request of the episode's workload has finished; truncated only by
    a `max_episode_steps` given to `gymnasium.make` (none by default: a step count would cut
    episodes at a length that depends on `control_interval_s`; `batchpilot train` sets its
    config's `max_episode_steps`).

    ## Arguments
    - `engine`: `"sim"` (default) or `"vllm"` (needs `model`, a model directory); extra
      `engine_kwargs` go to `SimEngine` (e.g. `scheduler="v0"`) or `VLLMEngine`.
    - `profile`: engine profile name or JSON path, a list to draw from uniformly per
      episode, or a mapping of them to weights (``{llama-2-70b-a100x4: 2, llama-3-8b-a100: 1}``
      draws the first twice as often).
    - `workload`: a source string (`embedded:NAME` or a trace path), a dict of
      `WorkloadSpec` fields, or a list of them to draw from per episode (among those whose
      ``profiles`` include the episode's profile).
    - `slo`: goodput SLOs (ms); default `DEFAULT_SLO`, `"ttft:2000,tpot:50"`.
    - `slo_scale`: ``{ttft: [lo, hi], tpot: [lo, hi]}``, ranges of factors drawn
      log-uniformly per episode that multiply `slo`'s targets: the episode is scored, and
      observed, against that SLO (its ``slo`` in the reset info), for a policy that serves
      whatever targets its users set. Default: none, every episode on `slo`.
    - `control_interval_s` or `control_interval_iters` (not both): one env step's length,
      seconds > 0 or engine iterations >= 1; neither: `CONTROL_INTERVAL_S` seconds.
    - `step_time_scale`, `kv_scale`: (lo, hi) ranges of factors drawn log-uniformly per
      episode that multiply the profile's step times and its KV cache blocks
      (`EngineProfile.scaled`): GPUs and memory budgets no profile describes, for a policy
      that must serve on them. One range for every profile, or a mapping of profile names
      to ranges (a profile it does not name is left as it is). Arrival rates are divided by
      the step-time factor, so a workload spec's load relative to the engine holds on a
      slower or faster one. Default (1, 1): the profile as it is.
    - `knee_scale`: the same for the decode knee (`EngineProfile.scaled`): the token count
      where a step's linear layers turn compute-bound, times the factor (an H100 is close to
      an A100 at 0.67x the step time with the knee 2.54x as far out). Arrival rates are left as
      they are.
    - `action_mode` (``grid`` or ``step``), `w_lost`, `w_recompute`.
    - `observation_fields`: the entries of `OBSERVATION_FIELDS` the observation holds, in
      that order or another (default: all); a policy file records them and serves with them.

    ## Examples
    ```python
    import gymnasium as gym
    import batchpilot.envs  # registers batchpilot/Batching-v0

    env = gym.make("batchpilot/Batching-v0", profile="llama-7b-a100",
                   workload={"source": "embedded:azure-conv", "rate_scale": (0.5, 1.5)})
    obs, info = env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
    ```
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}

    def __init__(
        self,
        engine: str = "sim",
        profile: str | list[str] | dict[str, float] = DEFAULT_PROFILE,
        workload: str | dict | list[str | dict] = DEFAULT_SOURCE,
        slo: str = str(DEFAULT_SLO),
        control_interval_s: float | None = None,
        control_interval_iters: int | None = None,
        action_mode: str = "grid",
        w_lost: float = 0.0,
        w_recompute: float = 0.5,
        step_time_scale: ScaleRanges = (1.0, 1.0),
        kv_scale: ScaleRanges = (1.0, 1.0),
        knee_scale: ScaleRanges = (1.0, 1.0),
        slo_scale: dict[str, tuple[float, float]] | None = None,
        model: str | None = None,
        engine_kwargs: dict[str, Any] | None = None,
        observation_fields: list[str] | None = None,
        render_mode: str | None = None,
    ) -> None:
        if render_mode is not None:  # a TypeError, on which SB3's make_vec_env drops it
            raise TypeError(f"render_mode {render_mode!r}: this env renders nothing")
        if engine not in ("sim", "vllm"):
            raise ValueError(f"engine must be 'sim' or 'vllm', got {engine!r}")
        if engine == "vllm" and not model:
            raise ValueError("engine='vllm' needs model=DIR (a model directory vLLM can load)")
        if engine == "sim" and model:
            raise ValueError(
                f"model={model!r} is read with engine='vllm' only; the simulator models the "
                "engine its profile names (set engine: vllm, or leave model out)"
            )
        if control_interval_s is not None and control_interval_iters is not None:
            raise ValueError(
                f"set one of control_interval_s ({control_interval_s!r}) and "
                f"control_interval_iters ({control_interval_iters!r}), not both"
            )
        if control_interval_iters is None and control_interval_s is None:
            control_interval_s = CONTROL_INTERVAL_S
        if control_interval_s is not None:
            check_interval_s(control_interval_s, "control_interval_s")
        else:
            check_interval_iters(control_interval_iters, "control_interval_iters")
        for name, w in (("w_lost", w_lost), ("w_recompute", w_recompute)):
            if isinstance(w, bool) or not isinstance(w, numbers.Real) or not 0 <= w <= MAX_WEIGHT:
                raise ValueError(f"{name} must be a number in [0, {MAX_WEIGHT:g}], got {w!r}")
        if not isinstance(slo, str):
            raise ValueError(f"slo must be a string such as 'ttft:2000,tpot:50', got {slo!r}")
        self.engine_kind = engine
        weights = profile_weights(profile)
        self.profiles = list(weights)
        self._profile_p = draw_probabilities(list(weights.values()))
        self._profile_objs = [get_profile(p) for p in self.profiles]
        names = [p.name for p in self._profile_objs]
        if twice := sorted({n for n in names if names.count(n) > 1}):
            given = [p for p, n in zip(self.profiles, names, strict=True) if n == twice[0]]
            raise ValueError(
                f"profiles {given} are all named {twice[0]!r}; per-profile settings (workload "
                "profiles:, step_time_scale, ...) name profiles by name: rename one"
            )
        self.step_time_scale = profile_ranges(step_time_scale, names, "step_time_scale")
        self.kv_scale = profile_ranges(kv_scale, names, "kv_scale")
        self.knee_scale = profile_ranges(knee_scale, names, "knee_scale")
        self.slo = goodput_slo(SLO.parse(slo), "slo")  # the reward credits on-target tokens
        self.slo_scale = slo_ranges({} if slo_scale is None else slo_scale, self.slo)
        if engine == "vllm" and (
            self.step_time_scale or self.kv_scale or self.knee_scale or self.slo_scale
        ):
            raise ValueError(
                "step_time_scale, kv_scale, knee_scale and slo_scale vary the simulator's "
                "episodes only"
            )
        specs = workload if isinstance(workload, list) else [workload]
        if not specs:
            raise ValueError("workload list is empty")
        self.workloads = [WorkloadSpec.coerce(s) for s in specs]
        for i, spec in enumerate(self.workloads):
            unknown = sorted(set(spec.profiles) - set(names))
            if unknown:
                raise ValueError(
                    f"workload {i} ({spec.source}): profiles names {unknown[0]!r}, which is not "
                    f"one of the env's profiles {names}"
                )
        for p in self._profile_objs:
            if not self._workloads_for(p.name):
                raise ValueError(f"no workload spec applies to profile {p.name!r} (profiles:)")
        self.control_interval_s = control_interval_s
        self.control_interval_iters = control_interval_iters
        self.grid = ActionGrid(action_mode)
        self.w_lost = w_lost
        self.w_recompute = w_recompute
        self.model = model
        self.engine_kwargs = engine_kwargs or {}
        if engine == "sim":  # bad engine keywords fail here, not at the first reset
            try:
                self._make_engine(self._profile_objs[0], self.slo)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"engine_kwargs: {exc}") from None
        else:  # vLLM starts at the first reset; its model directory is checked now
            from batchpilot.envs.vllm_engine import check_model_dir

            check_model_dir(model)
        self.observer = Observer(self.slo, observation_fields)
        self.action_space = spaces.MultiDiscrete(list(self.grid.nvec))
        clip = SCALES["clip"]
        self.observation_space = spaces.Box(-clip, clip, (len(self.observer.fields),), np.float32)
        self._engine: Engine | None = None
        self._vllm_engine: Engine | None = None
        self.workload_notes = self.check_workloads()
        """Notes on the workloads (a trace shorter than its spec asks), for the caller to
        show; a spec that cannot be drawn failed here."""

    def check_workloads(self) -> list[str]:
        """Draw each workload spec once on each profile it applies to, so one that cannot be
        drawn (a replay of a source without timestamps, an unreadable trace) fails now,
        naming the spec, not at some episode's reset. Reads each trace file it names. Returns
        a note for each trace that holds fewer requests than its spec asks (every episode
        takes the whole trace)."""
        rng = np.random.default_rng(0)
        notes = []
        for i, spec in enumerate(self.workloads):
            for p in self._profile_objs:
                if spec in self._workloads_for(p.name):
                    try:
                        drawn = spec.draw(rng, p.max_model_len)
                    except (ValueError, OSError) as exc:
                        raise ValueError(
                            f"workload {i} ({spec.source} @ {spec.arrival}) on {p.name}: {exc}"
                        ) from None
                    note = is_trace_file(spec.source) and short_trace_note(
                        f"workload {i} ({spec.source})", len(drawn), spec.num_requests, "episode"
                    )
                    if note and note not in notes:
                        notes.append(note)
        return notes

    def _workloads_for(self, profile: str) -> list[WorkloadSpec]:
        return [w for w in self.workloads if not w.profiles or profile in w.profiles]

    def _make_engine(self, profile: EngineProfile, slo: SLO) -> Engine:
        """The episode's engine: a simulator of the drawn profile, or this env's own real
        engine (not `batchpilot.envs.engines.make_engine`'s one per process: the envs of a
        vectorised env step theirs in turn)."""
        if self.engine_kind == "vllm":
            if self._vllm_engine is None:  # one real engine per env: start-up is costly
                from batchpilot.envs.vllm_engine import VLLMEngine

                self._vllm_engine = VLLMEngine(self.model, slo=slo, **self.engine_kwargs)
            return self._vllm_engine
        from batchpilot.envs.sim_engine import SimEngine

        return SimEngine(profile, slo=slo, **self.engine_kwargs)

    def _reward(self, t: Telemetry) -> tuple[float, dict[str, float]]:
        credit = t.interval_good_output_tokens + t.inflight_on_track_tokens - self._on_track
        lost = t.interval_bad_output_tokens + t.inflight_off_track_output_tokens - self._off_track
        self._on_track = t.inflight_on_track_tokens
        self._off_track = t.inflight_off_track_output_tokens
        parts = {
            "credit": credit / self._offered_tps,
            "lost": -self.w_lost * lost / self._offered_tps,
            "recompute": -self.w_recompute * t.interval_recomputed_tokens / self._offered_tps,
        }
        return float(sum(parts.values())), parts

    # ------------------------------------------------------------------ gym API
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        if options is not None and not isinstance(options, dict):
            raise ValueError(f"reset options must be a dict or None, got {options!r}")
        if options:
            raise ValueError(f"reset options {sorted(options)}: this env takes none")
        super().reset(seed=seed)
        rng = self.np_random
        profile = self._profile_objs[int(rng.choice(len(self._profile_objs), p=self._profile_p))]
        scales = []
        for ranges in (self.step_time_scale, self.kv_scale, self.knee_scale):
            lo, hi = ranges.get(profile.name, (1.0, 1.0))
            # drawn only when asked for, so envs without them keep their random streams
            scales.append(lo if lo == hi else log_uniform(rng, lo, hi))
        profile = profile.scaled(*scales)
        slo = self.slo.scaled(**{k: log_uniform(rng, *r) for k, r in self.slo_scale.items()})
        self._engine = self._make_engine(profile, slo)
        self.observer.set_slo(slo)
        specs = self._workloads_for(profile.name)
        p = draw_probabilities([s.weight for s in specs])
        spec = specs[int(rng.choice(len(specs), p=p))]
        # a request fits the context and the simulator's KV cache (v0 keeps 1% of it free)
        fits = (
            self._engine.max_model_len if self.engine_kind == "vllm" else self._engine.max_tokens
        )
        self.workload = spec.draw(rng, fits, rate_factor=1 / scales[0])
        self._offered_tps = offered_output_tps(self.workload)
        limits = self.grid.reset(self._engine.max_num_seqs, self._engine.max_num_batched_tokens)
        self._telemetry = self._engine.reset(self.workload, limits)
        self._on_track = self._telemetry.inflight_on_track_tokens
        self._off_track = self._telemetry.inflight_off_track_output_tokens
        self.observer.reset()
        info = {
            "workload": self.workload.name,
            "profile": profile.name if self.engine_kind == "sim" else f"vllm:{self.model}",
            "step_time_scale": scales[0],
            "kv_scale": scales[1],
            "knee_scale": scales[2],
            "slo": str(slo),
            "offered_output_tps": self._offered_tps,
        }
        return self.observer(self._telemetry), info

    def close(self) -> None:
        """Shut the real engine down, if one was started (a simulator holds nothing)."""
        if self._vllm_engine is not None:
            self._vllm_engine.close()  # type: ignore[attr-defined]
            self._vllm_engine = self._engine = None  # a reset starts another
        super().close()

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if self._engine is None:
            raise RuntimeError("call reset() before step()")
        if self._engine.done:  # every further step would be a made-up transition
            raise RuntimeError("the episode has ended (terminated): call reset() before step()")
        limits = self.grid.apply(action)
        self._engine.set_limits(limits)
        until = None
        if self.control_interval_s is not None:
            until = self._telemetry.time_s + self.control_interval_s
        t = self._engine.advance(max_iterations=self.control_interval_iters, until_s=until)
        self._telemetry = t
        reward, parts = self._reward(t)
        info = asdict(t) | {f"reward_{k}": v for k, v in parts.items()}
        terminated = self._engine.done
        if terminated:
            info["episode_metrics"] = self._engine.result().metrics()
        return self.observer(t), reward, terminated, False, info

    def render(self) -> None:
        """Nothing: this env renders nothing (``render_mode`` None)."""

    @property
    def telemetry(self) -> Telemetry:
        """The latest telemetry."""
        if self._engine is None:
            raise RuntimeError("call reset() first")
        return self._telemetry

    @property
    def engine(self) -> Engine:
        """The engine of the current episode."""
        if self._engine is None:
            raise RuntimeError("call reset() first")
        return self._engine

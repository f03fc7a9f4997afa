"""Warm start by imitation: behaviour cloning from a teacher controller, with DAgger rounds.

The teacher (by default the lookahead oracle ``mpc``) is any controller spec. Round 0
lets the teacher drive the environment and records (observation, teacher's action);
each later round lets the current policy drive (with probability ``1 - beta`` per
decision, ``beta`` halving each round) while the teacher still labels every state the
policy visits, and the policy is refitted on everything gathered so far (Ross et al.,
DAgger). With ``stakes_knobs`` the labels of those knobs count by how much the teacher's
choice mattered (`knob_stakes`), so the mode of near-ties does not outweigh the states
where one choice wins clearly; ``seq_stakes_tbt`` weighs the ``max_num_seqs`` labels so only
where the interval's mean TBT nears the TPOT target, where the batch size decides TPOT (most
of its labels elsewhere are near-ties, and weighing them all collapsed the clone to small
limits). With ``tie_sets`` a label of those knobs is the set of grid
choices the teacher scored within `TIE_TOLERANCE` of its best (`acceptable`), and the
policy is fitted to put its probability anywhere in that set (the negative log of the set's
total probability), so where every choice ties the label pulls toward none of them (the
teacher breaks ties toward the larger value, which a plain clone learns as a preference).
With ``seq_tie_break: knee`` a ``max_num_seqs`` label is, of the teacher's near-ties, the one
nearest the decode knee (`decode_knee`: the most requests a pure-decode step serves within
the TPOT target, on the engine's measured step line), so where the cap does not matter the
clone learns a default that the SLO and the GPU set, not the grid's top, which it would keep
where the cap does matter and the SLO or GPU is one it never trained on. The line fits
prefill and decode tokens alike and puts the knee above a pure-decode step's; ``step_knee``
takes the knee from the simulated engine's step model instead (`step_knee`). Neither has
shipped: each gained a little where no run trained and lost the training suite
(training/reports/learned/README.md). With ``regret_knobs`` a label of those knobs is the
teacher's whole sweep, each grid choice's regret (`grid_regrets`: how far its horizon score
trails the best), and the policy is fitted to the least expected regret (cost-sensitive
imitation, as AggreVaTe, Ross and Bagnell 2014): where one drawn future ties every budget and
another has a burst that only large budgets drain, the clone learns the choice that is best
on average over the states it sees alike, not the tie's incumbent. It has not shipped: fitted
so (``regret_knobs: [budget]``), the committed recipe carried large budgets into the 7B's
sustained overload, where the labels' mode had held them down (0.375x the tuned pair against
0.998x; training/reports/learned/README.md, C47), and beside the stakes-weighed labels at
``regret_weight: 0.25`` still 0.851x (C48).
The policy is SB3's own policy object (`ActorCriticPolicy`), so PPO continues from exactly
what was cloned. The ``imitation`` library would fit, but pins gymnasium 0.29 and
stable-baselines3 2.2; this loop is the few lines it needs.
"""

from __future__ import annotations

import math
import multiprocessing
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from batchpilot.agents.specs import is_learned
from batchpilot.envs.action_grid import BUDGET_GRID, SEQ_GRID, nearest
from batchpilot.envs.step_models import StepModel
from batchpilot.envs.telemetry import Telemetry

KNOBS = ("max_num_seqs", "budget")
"""The action's knobs, in order, as ``stakes_knobs`` names them."""
STAKES_FLOOR = 0.1
"""The weight a tied label keeps, where a label of typical (median) stakes weighs 1 + this,
before renormalising (`label_weights`)."""
STAKES_CAP = 10.0
"""The most a label's stakes may count against the typical one (one decisive state does
not drown the rest)."""
TIE_TOLERANCE = 0.01
"""A grid choice whose horizon score trails the best by less than this (relative, as
`knob_stakes` measures leads) ties with it."""
SEQ_TIE_BREAKS = ("teacher", "knee", "step_knee")
"""How a ``max_num_seqs`` label breaks the teacher's near-ties (`ImitationSpec.seq_tie_break`)."""


@dataclass(frozen=True)
class ImitationSpec:
    """Settings of the imitation phase (the config's ``imitation`` key)."""

    teacher: str = "mpc:horizon_s=8"
    """Controller spec of the teacher (a simulator-only oracle may be used)."""
    rounds: int = 3
    """Round 0 (teacher drives) plus `rounds - 1` DAgger rounds (policy drives)."""
    episodes: int = 4
    """Episodes collected per round."""
    beta: float = 0.5
    """Probability the teacher acts in DAgger round 1; halves each later round."""
    epochs: int = 30
    batch_size: int = 256
    learning_rate: float = 1e-3
    value_epochs: int = 10
    """Epochs fitting the value head to the collected discounted returns."""
    stakes_knobs: list[str] = field(default_factory=list)
    """Knobs (`KNOBS`) whose labels weigh by their stakes (module doc; needs a teacher that
    reports its sweeps: ``mpc``); empty: every label alike. Weighting ``max_num_seqs`` too
    did worse: most of its labels are near-ties, and without them it collapses."""
    tie_sets: list[str] = field(default_factory=list)
    """Knobs (`KNOBS`) whose labels are the teacher's near-tie sets (module doc; needs a
    teacher that reports its sweeps: ``mpc``); empty: the teacher's one choice."""
    seq_stakes_tbt: float = 0.0
    """Where the interval's mean TBT is at least this share of the TPOT target, the
    ``max_num_seqs`` labels weigh by their stakes, as ``stakes_knobs`` weighs a knob
    everywhere (needs a teacher that reports its sweeps); 0: nowhere. Near the target the
    batch size decides TPOT; elsewhere most of its labels are near-ties."""
    regret_knobs: list[str] = field(default_factory=list)
    """Knobs (`KNOBS`) whose labels are the teacher's regrets of every grid choice, fitted to
    the least expected regret (module doc; needs a teacher that reports its sweeps: ``mpc``);
    not also in ``tie_sets``. The teacher's own choice keeps a floor's pull, or, for a knob
    also in ``stakes_knobs``, its stakes' weight: then the regrets are a nudge beside it."""
    regret_weight: float = 1.0
    """What the expected regret (`regret_costs`) counts for against the labels' term."""
    seq_tie_break: str = "teacher"
    """Which of the teacher's near-ties a ``max_num_seqs`` label takes (`SEQ_TIE_BREAKS`):
    ``teacher``, its own choice (the current limit, else the larger); ``knee`` and
    ``step_knee``, the one nearest the decode knee of the measured step line or of the
    simulator's step model (module doc; needs a teacher that reports its sweeps)."""

    def __post_init__(self) -> None:
        if is_learned(str(self.teacher)):
            raise ValueError(
                f"teacher {self.teacher!r}: a learned policy does not teach here; give a rule "
                "or the lookahead oracle (static, alg1, alg2, alg1+alg2, mpc: batchpilot compare "
                "--help lists them)"
            )
        for key in ("rounds", "episodes", "epochs", "batch_size"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)}")
        if not 0.0 <= self.beta <= 1.0:
            raise ValueError(f"beta must be in [0, 1], got {self.beta}")
        if not 0.0 <= self.seq_stakes_tbt < math.inf:
            raise ValueError(f"seq_stakes_tbt must be a share >= 0, got {self.seq_stakes_tbt}")
        if self.seq_stakes_tbt and "max_num_seqs" in self.stakes_knobs:
            raise ValueError(
                "seq_stakes_tbt weighs max_num_seqs where the TBT nears the TPOT "
                "target; stakes_knobs already weighs it everywhere: give one"
            )
        if self.learning_rate <= 0 or self.value_epochs < 0:
            raise ValueError("need learning_rate > 0 and value_epochs >= 0")
        if self.seq_tie_break not in SEQ_TIE_BREAKS:
            raise ValueError(
                f"seq_tie_break must be one of {SEQ_TIE_BREAKS}, "
                f"got {self.seq_tie_break!r}"
            )
        for key in ("stakes_knobs", "tie_sets", "regret_knobs"):
            knobs = list(getattr(self, key))
            unknown = [k for k in knobs if k not in KNOBS]
            if unknown:
                raise ValueError(f"{key}: {unknown[0]!r} is not one of {KNOBS}")
            if len(set(knobs)) < len(knobs):
                raise ValueError(f"{key}: a knob given twice in {knobs}; give each once")
        if "max_num_seqs" in self.regret_knobs and (
            self.seq_stakes_tbt or self.seq_tie_break != "teacher"
        ):
            raise ValueError(
                "regret_knobs names max_num_seqs, whose labels seq_stakes_tbt and "
                "seq_tie_break shape; a regret label weighs every choice already: give one"
            )
        if both := sorted(set(self.regret_knobs) & set(self.tie_sets)):
            raise ValueError(
                f"regret_knobs and tie_sets both name {both[0]!r}: a regret label already "
                "accepts each choice by how much it trails; give the knob in one"
            )
        if not 0 < self.regret_weight < math.inf:
            raise ValueError(f"regret_weight must be a number > 0, got {self.regret_weight}")
        if self.sweeps:
            from batchpilot.baselines.specs import make_controller

            if not hasattr(make_controller(self.teacher), "sweeps"):
                used = (
                    "stakes_knobs", "tie_sets", "regret_knobs", "seq_stakes_tbt", "seq_tie_break"
                )  # fmt: skip
                key = next(k for k in used if getattr(self, k) and getattr(self, k) != "teacher")
                raise ValueError(
                    f"{key} needs a teacher that reports how much each "
                    f"choice mattered (mpc); {self.teacher!r} does not"
                )

    @property
    def sweeps(self) -> bool:
        """Whether labelling reads the teacher's sweeps (for stakes, tie sets, regrets or
        the knee)."""
        return (
            bool(self.stakes_knobs or self.tie_sets or self.regret_knobs or self.seq_stakes_tbt)
            or self.seq_tie_break != "teacher"
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Episode:
    """What one collected episode leaves: states, teacher labels, how much each label's
    choice mattered (`knob_stakes` per knob; 1 where not measured), the choices each label
    accepts, rewards, metrics."""

    obs: np.ndarray
    labels: np.ndarray
    stakes: np.ndarray
    acceptable: list[np.ndarray]
    """Per knob, (labels, grid size) booleans: the choices a label accepts (`acceptable`)."""
    rewards: np.ndarray
    metrics: dict[str, float]
    tbt_over_tpot: np.ndarray
    """Per label, the interval's mean TBT over the TPOT target (0 without one)."""
    regrets: list[np.ndarray]
    """Per knob, (labels, grid size) regrets of each choice (`grid_regrets`); zeros for a
    knob not in ``regret_knobs``."""


def grid_scores(sweep: dict[int, float], grid: tuple[int, ...]) -> dict[int, float]:
    """A teacher's sweep (value -> horizon score) as grid index -> best score: values
    nearest the same grid point are one choice."""
    best: dict[int, float] = {}
    for value, score in sweep.items():
        i = nearest(grid, value)
        best[i] = max(best.get(i, -np.inf), score)
    return best


def knob_stakes(sweep: dict[int, float], grid: tuple[int, ...]) -> float:
    """How much one knob's choice mattered in a teacher's sweep (`grid_scores`): the lead
    of the best grid point over the next best, relative to the best score (+1, so an idle
    horizon scores 0)."""
    best = grid_scores(sweep, grid)
    if len(best) < 2:
        return 0.0
    first, second = sorted(best.values(), reverse=True)[:2]
    return (first - second) / (abs(first) + 1.0)


def grid_regrets(sweep: dict[int, float], grid: tuple[int, ...]) -> np.ndarray:
    """Each grid choice's regret in a teacher's sweep (`grid_scores`): how far its score
    trails the best, relative to the best (+1), as `knob_stakes` measures leads. A choice
    above the largest scored one takes its regret (the engine's cap holds the limit there);
    another the sweep lacks (a teacher grid that skips it) takes the sweep's worst, as no
    choice the teacher vouched for. An empty sweep regrets nothing."""
    best = grid_scores(sweep, grid)
    out = np.zeros(len(grid))
    if not best:
        return out
    top = max(best.values())
    regret = {i: (top - score) / (abs(top) + 1.0) for i, score in best.items()}
    largest, worst = max(regret), max(regret.values())
    for i in range(len(grid)):
        out[i] = regret.get(i, regret[largest] if i > largest else worst)
    return out


def acceptable(sweep: dict[int, float], grid: tuple[int, ...], label: int) -> np.ndarray:
    """The grid choices (booleans over `grid`) whose best score in a teacher's sweep trails
    the sweep's best by less than `TIE_TOLERANCE` (as `knob_stakes` measures leads), and
    the teacher's own choice `label` (an index into `grid`)."""
    best = grid_scores(sweep, grid)
    mask = np.zeros(len(grid), dtype=bool)
    mask[label] = True
    if best:
        top = max(best.values())
        for i, score in best.items():
            mask[i] |= (top - score) / (abs(top) + 1.0) < TIE_TOLERANCE
    return mask


def decode_knee(telemetry: Telemetry, tpot_ms: float | None) -> float:
    """The most requests one pure-decode step serves within `tpot_ms` on the engine's measured
    step line (`Telemetry.step_base_s` + `Telemetry.step_s_per_token` x requests), at least
    1; infinite before any step or without a TPOT target. The observation's
    ``step_base_over_tpot`` and ``log2_tokens_per_tpot`` entries carry the same line."""
    per_token = telemetry.step_s_per_token
    if tpot_ms is None or per_token <= 0:
        return math.inf
    return max(1.0, (tpot_ms / 1e3 - telemetry.step_base_s) / per_token)


def step_knee(step: StepModel, context: float, tpot_ms: float | None) -> float:
    """The most requests of `context` tokens each that one pure-decode step of `step` serves
    within `tpot_ms`, at least 1; infinite past the grid's top (`SEQ_GRID`) or without a TPOT
    target."""
    top = SEQ_GRID[-1]
    if tpot_ms is None:
        return math.inf

    def fits(n: int) -> bool:
        return step.decode_time(n, round(n * context)) <= tpot_ms / 1e3

    if fits(top):
        return math.inf
    lo, hi = 1, top  # fits(hi) is False; the answer is lo where fits(lo), else 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return float(lo)


def nearest_tie(mask: np.ndarray, grid: tuple[int, ...], target: float) -> int:
    """Of the grid choices `mask` accepts, the one nearest `target` on a log scale (an
    infinite one: the largest); of two as near, the larger."""
    x = math.log(max(1.0, min(target, grid[-1])))
    return int(min(np.flatnonzero(mask), key=lambda i: (round(abs(math.log(grid[i]) - x), 9), -i)))


def label_weights(
    stakes: np.ndarray, knobs: list[str], seq_rows: np.ndarray | None = None
) -> np.ndarray:
    """Per-knob weights from stakes (rows: labels, columns: `KNOBS`): for each of `knobs`,
    its stakes over the median of its non-zero ones (robust to a few huge leads), capped at
    `STAKES_CAP`, plus `STAKES_FLOOR`, rescaled to average 1; with `seq_rows` (booleans, one
    a label), the ``max_num_seqs`` labels of those rows so, the others alike. Other knobs,
    and a knob whose stakes are all 0, weigh 1."""
    w = np.ones_like(stakes, dtype=np.float64)
    every = np.ones(len(stakes), dtype=bool)
    weighed = [(KNOBS.index(name), every) for name in knobs]
    if seq_rows is not None:
        weighed.append((KNOBS.index("max_num_seqs"), seq_rows))
    for k, rows in weighed:
        column = stakes[rows, k]
        if (scale := _typical_stakes(column)) is not None:
            w[rows, k] = np.minimum(column / scale, STAKES_CAP) + STAKES_FLOOR
    return w / w.mean(axis=0, keepdims=True)


def collect_episode(
    make_env: Callable[[], gym.Env],
    teacher_spec: str,
    seed: int,
    policy: Any | None,
    beta: float,
    stakes: bool = False,
    tie_sets: tuple[str, ...] = (),
    seq_tie_break: str = "teacher",
    regret_knobs: tuple[str, ...] = (),
) -> Episode:
    """Run one episode; the teacher labels every state; who acts: see the module doc.

    `policy` is an SB3 policy (None: the teacher always acts); with `stakes`, the teacher's
    `sweeps` give each label's stakes (1 each otherwise); the knobs named in `tie_sets`
    accept the sweep's near-ties (`acceptable`), the others only the label;
    `seq_tie_break` (`ImitationSpec.seq_tie_break`) picks the ``max_num_seqs`` label among
    the near-ties; the knobs in `regret_knobs` keep each choice's regret (`grid_regrets`).
    Where the teacher drives, it applies the label.
    """
    import torch as th

    from batchpilot.baselines.specs import make_controller

    th.set_num_threads(1)
    env = make_env()
    base = env.unwrapped
    obs, _ = env.reset(seed=seed)
    teacher = make_controller(teacher_spec)
    teacher.reset(base.engine)
    rng = np.random.default_rng(seed)
    states, labels, rewards, label_stakes, tbt_over_tpot = [], [], [], [], []
    accepted: list[list[np.ndarray]] = [[] for _ in KNOBS]
    regrets: list[list[np.ndarray]] = [[] for _ in KNOBS]
    done = False
    info: dict[str, Any] = {}
    while not done:
        telemetry = base.telemetry
        label = base.grid.action_for(teacher.decide(telemetry))
        if seq_tie_break != "teacher":
            tpot_ms = base.engine.slo.tpot_ms
            if seq_tie_break == "knee":
                knee = decode_knee(telemetry, tpot_ms)
            else:  # a request decoding midway: its prompt and half its output
                context = telemetry.prompt_mean + telemetry.output_mean / 2
                knee = step_knee(base.engine.profile.step, context, tpot_ms)
            ties = acceptable(teacher.sweeps[0], SEQ_GRID, int(label[0]))
            label[0] = nearest_tie(ties, SEQ_GRID, knee)
        states.append(obs)
        labels.append(label)
        tpot_ms = base.engine.slo.tpot_ms
        tbt_over_tpot.append(telemetry.recent_tbt_s * 1e3 / tpot_ms if tpot_ms else 0.0)
        if stakes:
            seqs, budgets = teacher.sweeps
            label_stakes.append((knob_stakes(seqs, SEQ_GRID), knob_stakes(budgets, BUDGET_GRID)))
        else:
            label_stakes.append((1.0, 1.0))
        for k, (name, grid) in enumerate(zip(KNOBS, (SEQ_GRID, BUDGET_GRID), strict=True)):
            if name in tie_sets:
                mask = acceptable(teacher.sweeps[k], grid, int(label[k]))
            else:
                mask = np.arange(len(grid)) == label[k]
            accepted[k].append(mask)
            if name in regret_knobs:
                regrets[k].append(grid_regrets(teacher.sweeps[k], grid))
        action = label
        if policy is not None and rng.random() >= beta:
            action = policy.predict(obs, deterministic=True)[0]
        obs, reward, terminated, truncated, info = env.step(action)
        rewards.append(reward)
        done = terminated or truncated
    metrics = info.get("episode_metrics") or base.engine.result().metrics()
    env.close()  # after the metrics: closing a real engine's env lets its engine go
    return Episode(
        np.asarray(states, np.float32),
        np.asarray(labels, np.int64),
        np.asarray(label_stakes, np.float64),
        [np.asarray(masks, bool).reshape(-1, len(grid)) for masks, grid in
         zip(accepted, (SEQ_GRID, BUDGET_GRID), strict=True)],
        np.asarray(rewards, np.float64),
        metrics,
        np.asarray(tbt_over_tpot, np.float64),
        [np.asarray(r, np.float64) if r else np.zeros((len(labels), len(grid))) for r, grid in
         zip(regrets, (SEQ_GRID, BUDGET_GRID), strict=True)],
    )


RETURN_EPSILON = 1e-8
"""`VecNormalize`'s default ``epsilon``: rewards are divided by sqrt(return variance + it)."""


def return_statistics(episodes: list[np.ndarray], gamma: float, into: Any) -> None:
    """Set `into` (SB3's `RunningMeanStd`) to what `VecNormalize` learns of these episodes'
    rewards: the statistics of the discounted sum it keeps per env, reset at each episode's
    start, by whose spread it divides the rewards PPO trains on."""
    from stable_baselines3.common.running_mean_std import RunningMeanStd

    fitted = RunningMeanStd(shape=())
    for rewards in episodes:
        sums = np.empty(len(rewards))
        acc = 0.0
        for i, r in enumerate(rewards):
            acc = acc * gamma + r
            sums[i] = acc
        fitted.update(sums)
    into.mean, into.var, into.count = fitted.mean, fitted.var, fitted.count


def discounted_returns(rewards: np.ndarray, gamma: float) -> np.ndarray:
    out = np.empty_like(rewards)
    acc = 0.0
    for i in range(len(rewards) - 1, -1, -1):
        acc = rewards[i] + gamma * acc
        out[i] = acc
    return out


def regret_costs(regrets: np.ndarray, stakes: np.ndarray) -> np.ndarray:
    """A knob's regrets (labels x grid, `grid_regrets`) over the median of its labels'
    non-zero stakes (a typical decisive state's runner-up costs 1), capped at `STAKES_CAP`;
    all 0 where no label had stakes."""
    scale = _typical_stakes(stakes)
    return np.zeros_like(regrets) if scale is None else np.minimum(regrets / scale, STAKES_CAP)


def _typical_stakes(stakes: np.ndarray) -> float | None:
    """The median of a knob's non-zero stakes (a typical decisive label's), None if none."""
    decisive = stakes[stakes > 0]
    return float(np.median(decisive)) if len(decisive) else None


def fit(
    policy: Any,
    obs: np.ndarray,
    accepted: list[np.ndarray],
    weights: np.ndarray,
    returns: np.ndarray,
    spec: ImitationSpec,
    rng: np.random.Generator,
    costs: list[np.ndarray | None] | None = None,
) -> dict[str, float]:
    """Behaviour cloning (the negative log of the probability each knob's distribution puts
    on the choices its label accepts: the teacher's action's log-likelihood where that is
    the only one; each knob's term weighted by `weights`' column; where `costs` gives a
    knob's per-choice costs (`regret_costs`), plus the expected cost under the knob's
    distribution), then the value head on the returns (so PPO starts with a critic).
    Returns the final losses; accuracy is the share of states whose modes are accepted on
    both knobs."""
    import torch as th

    params = list(policy.parameters())
    opt = th.optim.Adam(params, lr=spec.learning_rate)
    x = th.as_tensor(obs)
    masks = [th.as_tensor(m) for m in accepted]
    costs = costs or [None] * len(masks)
    cost_t = [None if c is None else th.as_tensor(c, dtype=th.float32) for c in costs]
    w = th.as_tensor(weights, dtype=th.float32)
    v = th.as_tensor(returns, dtype=th.float32)
    n = len(x)
    policy.set_training_mode(True)
    nll = th.zeros(())
    for _ in range(spec.epochs):
        for idx in np.array_split(rng.permutation(n), max(1, n // spec.batch_size)):
            dist = policy.get_distribution(x[idx]).distribution  # one Categorical a knob
            knobs = th.stack(
                [
                    d.logits.masked_fill(~m[idx], -th.inf).logsumexp(1)
                    for d, m in zip(dist, masks, strict=True)
                ],
                1,
            )
            nll = -(w[idx] * knobs).sum(1).mean()
            loss = nll  # the expected costs join the loss; the logged nll stays comparable
            for d, c in zip(dist, cost_t, strict=True):
                if c is not None:
                    loss = loss + (d.probs * c[idx]).sum(1).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    value_loss = th.zeros(())
    for _ in range(spec.value_epochs):
        for idx in np.array_split(rng.permutation(n), max(1, n // spec.batch_size)):
            value_loss = th.nn.functional.mse_loss(policy.predict_values(x[idx]).flatten(), v[idx])
            opt.zero_grad()
            value_loss.backward()
            opt.step()
    policy.set_training_mode(False)
    with th.no_grad():
        predicted = policy.get_distribution(x).mode().numpy()
    hits = [m[np.arange(len(m)), predicted[:, k]] for k, m in enumerate(accepted)]
    stats = {
        "nll": float(nll.detach()),
        "accuracy": float(np.logical_and(*hits).mean()),
        "value_loss": float(value_loss.detach()),
    }
    for k, c in enumerate(costs):
        if c is not None:  # the modes' mean cost: 0 where every mode is a best choice
            stats[f"{KNOBS[k]}_mode_cost"] = float(c[np.arange(len(c)), predicted[:, k]].mean())
    return stats


def round_seeds(seed: int, round_: int, episodes: int) -> list[int]:
    """The env seeds of a DAgger round's episodes for training seed `seed`: round 0's are
    seed .. seed + episodes - 1, so runs of neighbouring seeds share most of them."""
    return [seed + 10_000 * round_ + i for i in range(episodes)]


class Collector:
    """Collects `dagger`'s episodes (`collect_episode`) in up to `workers` processes; the
    results do not depend on how many.

    A round-0 episode (the teacher drives) depends only on its env seed, so the runs of one
    config with several training seeds share one collector: `expect` announces the round-0
    episodes of each run, which are collected ahead (keeping the workers busy while a run
    fits its policy) and once for every run that claims them, and released when the last
    claim is collected.
    """

    def __init__(
        self, make_env: Callable[[], gym.Env], spec: ImitationSpec, workers: int = 1
    ) -> None:
        self._common = (make_env, spec.teacher)
        self._labelling = (
            spec.sweeps, tuple(spec.tie_sets), spec.seq_tie_break, tuple(spec.regret_knobs)
        )
        self._pool: ProcessPoolExecutor | None = None
        workers = min(workers, spec.episodes)
        if workers > 1:  # one pool for every round: each worker imports torch once
            ctx = multiprocessing.get_context("spawn")  # no fork of a process running torch
            self._pool = ProcessPoolExecutor(workers, mp_context=ctx)
        self._ahead: dict[int, Future[Episode]] = {}
        self._claims: Counter[int] = Counter()
        self._lock = threading.Lock()  # runs imitating side by side share the claims

    def __enter__(self) -> Collector:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)

    def expect(self, seeds: Iterable[int]) -> None:
        """Claim the round-0 episodes of these env seeds, collecting those not yet started."""
        with self._lock:
            for s in seeds:
                self._claims[s] += 1
                if s not in self._ahead:
                    self._ahead[s] = self._submit(s, None, 1.0)

    def collect(self, seeds: list[int], policy: Any | None, beta: float) -> list[Episode]:
        """The episodes of these env seeds, `policy` driving as `collect_episode` says
        (None: the teacher drives, a round-0 episode; claimed by `expect` or not)."""
        if policy is not None:
            return [f.result() for f in [self._submit(s, policy, beta) for s in seeds]]
        with self._lock:
            unclaimed = [s for s in seeds if not self._claims[s]]
        self.expect(unclaimed)
        episodes = [self._ahead[s].result() for s in seeds]
        with self._lock:
            for s in seeds:
                self._claims[s] -= 1
                if not self._claims[s]:
                    del self._claims[s], self._ahead[s]
        return episodes

    def _submit(self, seed: int, policy: Any | None, beta: float) -> Future[Episode]:
        args = (*self._common, seed, policy, beta, *self._labelling)
        if self._pool is not None:
            return self._pool.submit(collect_episode, *args)
        done: Future[Episode] = Future()
        done.set_result(collect_episode(*args))
        return done


def dagger(
    model: Any,
    collector: Collector,
    spec: ImitationSpec,
    *,
    seed: int,
    gamma: float,
    log: Callable[[dict[str, float], int], None] | None = None,
    returns: Any = None,
) -> list[dict[str, float]]:
    """Clone `spec.teacher` into `model.policy` over `spec.rounds` rounds (see module doc),
    `collector` collecting the episodes (made from the same `spec`). `log(values, round)`
    receives each round's ``imitation/*`` figures. Returns them.

    With `returns` (SB3's `RunningMeanStd`: PPO's `VecNormalize` is to start from it), it is
    set from the episodes' rewards (`return_statistics`) and the value head is fitted on
    returns divided as `VecNormalize` divides rewards: on the scale PPO's critic trains on.
    Without, on the raw returns."""
    rng = np.random.default_rng(seed)
    obs_all: list[np.ndarray] = []
    accepted_all: list[list[np.ndarray]] = []
    stakes_all: list[np.ndarray] = []
    tbt_all: list[np.ndarray] = []
    regrets_all: list[list[np.ndarray]] = []
    returns_all: list[np.ndarray] = []
    rewards_all: list[np.ndarray] = []
    history = []
    for r in range(spec.rounds):
        beta = 1.0 if r == 0 else spec.beta**r
        policy = None if r == 0 else model.policy
        episodes = collector.collect(round_seeds(seed, r, spec.episodes), policy, beta)
        for ep in episodes:
            obs_all.append(ep.obs)
            accepted_all.append(ep.acceptable)
            stakes_all.append(ep.stakes)
            tbt_all.append(ep.tbt_over_tpot)
            regrets_all.append(ep.regrets)
            returns_all.append(discounted_returns(ep.rewards, gamma))
            rewards_all.append(ep.rewards)
        targets = np.concatenate(returns_all)
        if returns is not None:
            return_statistics(rewards_all, gamma, returns)
            targets = targets / np.sqrt(returns.var + RETURN_EPSILON)
        all_stakes = np.concatenate(stakes_all)
        near = np.concatenate(tbt_all) >= spec.seq_stakes_tbt if spec.seq_stakes_tbt else None
        weights = label_weights(all_stakes, spec.stakes_knobs, near)
        costs: list[np.ndarray | None] = [None] * len(KNOBS)
        for name in spec.regret_knobs:  # the label keeps its stakes' weight, or a floor's
            k = KNOBS.index(name)
            regrets = np.concatenate([r[k] for r in regrets_all])
            costs[k] = spec.regret_weight * regret_costs(regrets, all_stakes[:, k])
            if name not in spec.stakes_knobs:
                weights[:, k] = STAKES_FLOOR
        stats = fit(
            model.policy,
            np.concatenate(obs_all),
            [np.concatenate(masks) for masks in zip(*accepted_all, strict=True)],
            weights,
            targets,
            spec,
            rng,
            costs,
        )
        stats |= {
            "beta": beta,
            "samples": float(sum(len(o) for o in obs_all)),
            "driver_goodput": float(np.mean([e.metrics["output_goodput"] for e in episodes])),
            "driver_preemptions": float(np.mean([e.metrics["num_preemptions"] for e in episodes])),
        }
        if spec.sweeps:  # the share of labels whose choice was a near-tie
            tied = (all_stakes < TIE_TOLERANCE).mean(axis=0)
            stats |= {f"{k}_tie_share": float(t) for k, t in zip(KNOBS, tied, strict=True)}
        if near is not None:  # the share of max_num_seqs labels weighed by their stakes
            stats["seq_stakes_share"] = float(near.mean())
        if log is not None:
            log(stats, r)
        history.append(stats)
    return history

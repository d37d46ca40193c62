"""Online exploration inside the user's job: what the coordinator runs once per round per bucket.

The tuner plugin holds, per (communicator, collective, log2 size bucket), a few candidate
configurations ("arms"): arm 0 the static table's row (the incumbent), arm 1 NCCL's own choice
(when different), arms 2.. alternatives the exported model proposes (at most :data:`MAX_ARMS`).
Exploration runs in rounds: the coordinator hands every rank the same :class:`Plan` (one arm index
per call of the bucket, at most ``slots`` calls); after the round a gap of calls runs arm 0 while
the ranks' GPU times are gathered; then the policy's next verdict applies: a new plan, or
:class:`Commit` for the rest of the job.

Every policy here is a pure function of what it is given (``state``, ``rng``): one object may serve
every bucket, and every rank's coordinator computes the same verdict from the same state and seed.
Every policy obeys one safety rule, "never a size made slower": it commits an arm other than 0 only
when the evidence says that arm is faster than arm 0 (:func:`faster_than_incumbent`: a one-sided
Welch t-test at level ``alpha``, 1%, with a 1% margin), else it commits arm 0.

Arm 0 is the control of every comparison, so every policy keeps it in every plan and bounds what
exploration may take (:func:`control_plan`): **arm 0 gets at least a third of each plan's slots
(rounded up) and at least as many as any single alternative**; the alternatives share the rest.
An arm with a single timed call above :data:`CATASTROPHIC` x arm 0's mean is dropped from every
later plan and commit at once (:func:`catastrophic`); arm 0 never is. A policy does not commit arm 0
while an alternative's mean is below arm 0's by more than the margin and its rounds are not spent
(:func:`settle`): it keeps running arm 0 against that alternative until the test passes, the means
cross, or the cap comes.

Policies (:data:`POLICIES`): ``round-robin`` (R rounds over all arms, then the best mean),
``halving`` (successive halving by mean), ``thompson`` (Thompson sampling on log time, commit at
P(best) > ``p_best`` or after a cap), ``ppo`` (a small MLP trained with MaskablePPO in
:mod:`ncclrl.agents.online_sim`, evaluated here in numpy from ``pretrained/online_policy.{json,npz}``).
The study that picks :data:`SHIPPED_POLICY` is docs/results/online-sim.md.
"""

from __future__ import annotations

import functools
import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

import numpy as np

from ncclrl.agents import mlp
from ncclrl.costmodel.errors import ConfigError

#: most arms per bucket the plugin holds
MAX_ARMS = 8
#: longest plan the plugin accepts
MAX_SLOTS = 64
#: the commit test's one-sided level and the least relative gain it accepts (:func:`faster_than_incumbent`)
ALPHA = 0.01
MARGIN = 0.01
#: an arm with one timed call above this many times arm 0's mean is dropped (:func:`catastrophic`)
CATASTROPHIC = 4.0
#: rounds after which round-robin and halving commit what the evidence supports (the simulated
#: coordinator's own cap, :data:`PPO_MAX_ROUNDS`, and Thompson's tuned cap are the same 48)
MAX_ROUNDS = 48


@dataclass(frozen=True)
class ArmStats:
    """What the ranks measured of one arm.

    :param n: timed calls of this arm so far (all rounds)
    :param mean_us: mean per-call GPU time (nan if ``n`` is 0)
    :param std_us: sample sd of the per-call times (nan if ``n`` < 2)
    :param max_us: the largest single timed call (nan if ``n`` is 0 or unknown)
    """

    n: int
    mean_us: float
    std_us: float
    max_us: float = math.nan


@dataclass(frozen=True)
class BucketState:
    """One bucket at a round boundary.

    :param arms: per arm, its measurements; index 0 is the incumbent (the static table's choice)
    :param prior_us: the exported model's predicted per-call time of each arm (nan if unknown)
    :param rounds: rounds finished
    :param calls: calls of this bucket issued so far (explore + gap + others)
    :param slots: plan length the coordinator allows
    """

    arms: tuple[ArmStats, ...]
    prior_us: tuple[float, ...]
    rounds: int
    calls: int
    slots: int = 16


@dataclass(frozen=True)
class Plan:
    """The next round: one arm index per call of the bucket."""

    slots: tuple[int, ...]


@dataclass(frozen=True)
class Commit:
    """Run ``arm`` for the rest of the job."""

    arm: int


Verdict = Plan | Commit


# -- shared rules -----------------------------------------------------------------------------------


def round_robin(arms: Sequence[int], slots: int) -> Plan:
    """``arms`` in turn, each the same number of times, as many whole turns as fit in ``slots``
    (at least one call each; more arms than slots: the first ``slots``). No policy plans with it
    any more (:func:`control_plan` keeps arm 0's share); kept for callers that want plain turns."""
    arms = [int(a) for a in arms][: max(int(slots), 1)]
    reps = max(int(slots) // len(arms), 1)
    return Plan(tuple(arms * reps))


def control_slots(slots: int) -> int:
    """Arm 0's least share of a plan of ``slots`` calls: a third, rounded up."""
    return -(-int(slots) // 3)


def _interleave(counts: dict[int, int]) -> tuple[int, ...]:
    """A sequence holding each arm ``counts[arm]`` times, each arm's calls spread evenly over it
    (stride scheduling: next the arm least far along its own share; ties to the lower index)."""
    done = dict.fromkeys(counts, 0)
    out = []
    for _ in range(sum(counts.values())):
        a = min((a for a, c in counts.items() if done[a] < c), key=lambda a: ((done[a] + 0.5) / counts[a], a))
        out.append(a)
        done[a] += 1
    return tuple(out)


def control_plan(alts: Sequence[int], slots: int) -> Plan:
    """A plan of ``slots`` calls: arm 0 (the control) and the alternatives ``alts``. The share rule:
    arm 0 gets at least :func:`control_slots` (a third, rounded up) and at least as many calls as
    any one alternative; each alternative the same number, as many as that allows; arm 0 the rest.
    Alternatives that do not fit (more than ``slots`` minus arm 0's third) are the last ones of
    ``alts``, left out. No alternative (or one slot): arm 0 alone. Calls are interleaved."""
    s = max(int(slots), 1)
    n0 = control_slots(s)
    alts = [a for a in dict.fromkeys(int(a) for a in alts) if a != 0][: s - n0]
    if not alts:
        return Plan((0,) * s)
    k = len(alts)
    r = max(1, min(s // (k + 1), (s - n0) // k))
    return Plan(_interleave({0: s - r * k} | dict.fromkeys(alts, r)))


def catastrophic(state: BucketState, k: float = CATASTROPHIC) -> set[int]:
    """Arms (never arm 0) with a timed call (``max_us``) above ``k`` x arm 0's mean: dropped from
    every later plan and never committed. Nothing while arm 0 has no timed call or ``max_us`` is
    unknown (nan)."""
    a0 = state.arms[0]
    if a0.n < 1 or not (math.isfinite(a0.mean_us) and a0.mean_us > 0):
        return set()
    lim = k * a0.mean_us
    return {i for i, a in enumerate(state.arms) if i and a.n > 0 and math.isfinite(a.max_us) and a.max_us > lim}


def live_alternatives(state: BucketState) -> list[int]:
    """The alternatives (arms 1..) not :func:`catastrophic`."""
    bad = catastrophic(state)
    return [i for i in range(1, len(state.arms)) if i not in bad]


def faster_than_incumbent(state: BucketState, arm: int, alpha: float = ALPHA, margin: float = MARGIN) -> bool:
    """Whether the evidence says ``arm`` is faster than arm 0: its mean, times ``1 + margin``, below
    arm 0's by more than the one-sided ``1 - alpha`` Student-t quantile (Welch-Satterthwaite degrees
    of freedom) of the difference's standard error, each arm with at least 2 timed calls. Arm 0: True."""
    if arm == 0:
        return True
    a, b = state.arms[arm], state.arms[0]
    if a.n < 2 or b.n < 2 or not (math.isfinite(a.std_us) and math.isfinite(b.std_us)):
        return False
    va, vb = a.std_us ** 2 / a.n, b.std_us ** 2 / b.n
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / max(va ** 2 / (a.n - 1) + vb ** 2 / (b.n - 1), 1e-300) if se > 0 else float(a.n + b.n - 2)
    return a.mean_us * (1.0 + margin) + _t_quantile(1.0 - alpha, df) * se < b.mean_us


@functools.lru_cache(maxsize=4096)
def _t_quantile_cached(q: float, df: int) -> float:
    from scipy.stats import t

    return float(t.ppf(q, df))


def _t_quantile(q: float, df: float) -> float:
    return _t_quantile_cached(q, max(int(df), 1))


def warm_up() -> None:
    """Load now what the commit test loads on first use (scipy's t quantile): a coordinator calls it at
    start, so a job's first verdict does not wait on imports while every rank waits on the verdict."""
    _t_quantile(1.0 - ALPHA, 10)


def safe_best(state: BucketState, among: Sequence[int] | None = None, alpha: float = ALPHA) -> Commit:
    """Commit the arm of least mean among ``among`` (default: all) that passes
    :func:`faster_than_incumbent` and is not :func:`catastrophic`; arm 0 when none does."""
    among = range(len(state.arms)) if among is None else among
    bad = catastrophic(state)
    ok = [a for a in among
          if a != 0 and a not in bad and state.arms[a].n > 0 and faster_than_incumbent(state, a, alpha)]
    return Commit(min(ok, key=lambda a: state.arms[a].mean_us) if ok else 0)


def contender(state: BucketState, among: Sequence[int], margin: float = MARGIN) -> int | None:
    """The alternative of least mean among ``among`` whose mean, times ``1 + margin``, is below arm
    0's (one the commit test could pass with more evidence); None if there is none."""
    a0 = state.arms[0]
    if a0.n < 1 or not math.isfinite(a0.mean_us):
        return None
    ok = [a for a in among if a != 0 and state.arms[a].n > 0 and math.isfinite(state.arms[a].mean_us)
          and state.arms[a].mean_us * (1.0 + margin) < a0.mean_us]
    return min(ok, key=lambda a: state.arms[a].mean_us) if ok else None


def settle(state: BucketState, among: Sequence[int], max_rounds: int, alpha: float = ALPHA) -> Verdict:
    """The end of exploring ``among``: commit the best arm that passes the commit test
    (:func:`safe_best`); else, while rounds remain (``state.rounds < max_rounds``) and an alternative's
    mean is below arm 0's (:func:`contender`), the next plan is arm 0 against that alternative
    (arm 0 is not committed on too little evidence); else arm 0."""
    c = safe_best(state, among, alpha)
    if c.arm:
        return c
    b = contender(state, [a for a in among if a not in catastrophic(state)])
    if b is not None and state.rounds < max_rounds:
        return control_plan([b], state.slots)
    return Commit(0)


def active_arms(state: BucketState) -> list[int]:
    """Arms still explored: arm 0 always, and the alternatives timed as often as the most timed
    alternative (a plan of :func:`control_plan` gives each alternative of it the same calls, so one
    left out falls behind), less the :func:`catastrophic` ones."""
    n = [a.n for a in state.arms[1:]]
    top = max(n) if n else 0
    bad = catastrophic(state)
    return [0] + [i for i, k in enumerate(n, 1) if k == top and k > 0 and i not in bad]


def _check(n_arms: int, slots: int) -> None:
    if not 1 <= n_arms <= MAX_ARMS:
        raise ConfigError("n_arms", f"must be 1..{MAX_ARMS}, got {n_arms}")
    if not 1 <= slots <= MAX_SLOTS:
        raise ConfigError("slots", f"must be 1..{MAX_SLOTS}, got {slots}")


# -- policies ---------------------------------------------------------------------------------------


class OnlinePolicy(ABC):
    """Decides, once per round, what a bucket runs next."""

    name: str = ""

    def first(self, n_arms: int, prior_us: tuple[float, ...], slots: int, rng: np.random.Generator) -> Verdict:
        """The first round's plan (no evidence yet): arm 0 and every alternative (:func:`control_plan`);
        one arm, or a single slot (no room for arm 0 beside an alternative): commit arm 0.

        :param n_arms: arms of the bucket (arm 0 the incumbent)
        :param prior_us: the exported model's predicted time per arm (nan if unknown)
        :param slots: plan length allowed
        :param rng: the coordinator's generator (the same seed on every rank)
        """
        _check(n_arms, slots)
        return Commit(0) if n_arms == 1 or slots < 2 else control_plan(range(1, n_arms), slots)

    @abstractmethod
    def decide(self, state: BucketState, rng: np.random.Generator) -> Verdict:
        """The verdict after a round: the next plan, or commit.

        :param state: the bucket's measurements so far
        :param rng: the coordinator's generator (the same seed on every rank)
        """


class RoundRobin(OnlinePolicy):
    """``rounds`` rounds of arm 0 and every alternative not :func:`catastrophic`, then commit the
    best mean if it beats arm 0; else, while an alternative's mean is below arm 0's and fewer than
    ``max_rounds`` rounds are done, arm 0 against it (:func:`settle`).

    :param rounds: rounds of exploration before committing
    :param alpha: one-sided level of the commit test
    :param max_rounds: rounds after which it commits what the test supports (else arm 0)
    """

    name = "round-robin"

    def __init__(self, rounds: int = 2, alpha: float = ALPHA, max_rounds: int = MAX_ROUNDS) -> None:
        if rounds < 1:
            raise ConfigError("rounds", f"must be >= 1, got {rounds}")
        if max_rounds < rounds:
            raise ConfigError("max_rounds", f"must be >= rounds ({rounds}), got {max_rounds}")
        self.rounds, self.alpha, self.max_rounds = int(rounds), float(alpha), int(max_rounds)

    def decide(self, state: BucketState, rng: np.random.Generator) -> Verdict:
        alts = live_alternatives(state)
        if not alts:
            return Commit(0)
        if state.rounds < self.rounds:
            return control_plan(alts, state.slots)
        return settle(state, alts, self.max_rounds, self.alpha)


class Halving(OnlinePolicy):
    """Successive halving of the alternatives against arm 0, the control, which every plan keeps
    (:func:`control_plan`): every ``rounds_per_stage`` rounds keep the better half (by mean) of the
    alternatives still explored, only those whose mean is below arm 0's by more than the margin
    (:func:`contender`); a :func:`catastrophic` alternative leaves at once. With one alternative
    left, at each stage's end, :func:`settle`: commit it once it passes the commit test, keep running
    it against arm 0 while its mean is below arm 0's and fewer than ``max_rounds`` rounds are done,
    else commit arm 0 (none left: arm 0). At ``max_rounds``: :func:`settle` over those explored.

    :param rounds_per_stage: rounds between halvings
    :param alpha: one-sided level of the commit test
    :param max_rounds: rounds after which it commits what the test supports (else arm 0)
    """

    name = "halving"

    def __init__(self, rounds_per_stage: int = 1, alpha: float = ALPHA, max_rounds: int = MAX_ROUNDS) -> None:
        if rounds_per_stage < 1:
            raise ConfigError("rounds_per_stage", f"must be >= 1, got {rounds_per_stage}")
        if max_rounds < 1:
            raise ConfigError("max_rounds", f"must be >= 1, got {max_rounds}")
        self.rounds_per_stage, self.alpha, self.max_rounds = int(rounds_per_stage), float(alpha), int(max_rounds)

    def decide(self, state: BucketState, rng: np.random.Generator) -> Verdict:
        alts = [a for a in active_arms(state) if a != 0]
        if not alts:
            return Commit(0)
        if state.rounds % self.rounds_per_stage and state.rounds < self.max_rounds:
            return control_plan(alts, state.slots)  # within a stage: the same arms again
        if len(alts) > 1 and state.rounds < self.max_rounds:
            a0 = state.arms[0].mean_us
            half = sorted(alts, key=lambda a: state.arms[a].mean_us)[: (len(alts) + 1) // 2]
            alts = [a for a in half if state.arms[a].mean_us * (1.0 + MARGIN) < a0]
            if len(alts) > 1:
                return control_plan(alts, state.slots)
        return settle(state, alts, self.max_rounds, self.alpha)


def log_posterior(state: BucketState, prior_sd: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """Per arm, a Gaussian posterior of its log mean time: from the measurements (log of the mean,
    delta-method sd ``cv / sqrt(n)``) when an arm has 2 or more, else from the model's prediction
    (sd ``prior_sd``; arm 0's mean when the model has none)."""
    k = len(state.arms)
    mu, sd = np.empty(k), np.empty(k)
    ref = state.arms[0].mean_us if state.arms[0].n else 1.0
    for i, a in enumerate(state.arms):
        if a.n >= 2 and math.isfinite(a.std_us) and a.mean_us > 0:
            cv = a.std_us / a.mean_us
            mu[i], sd[i] = math.log(a.mean_us), max(cv / math.sqrt(a.n), 1e-3)
        else:
            p = state.prior_us[i] if i < len(state.prior_us) else float("nan")
            mu[i] = math.log(p if math.isfinite(p) and p > 0 else ref)
            sd[i] = prior_sd if math.isfinite(p) and p > 0 else 2 * prior_sd
    return mu, sd


class Thompson(OnlinePolicy):
    """Thompson sampling on log time: each slot beyond arm 0's share (:func:`control_plan`'s rule:
    a third, rounded up) runs the arm whose posterior draw is least, no alternative more often than
    arm 0's share, the rest arm 0; :func:`catastrophic` arms are never drawn. Commit when one arm is
    best with probability above ``p_best`` (Monte Carlo) and, if not arm 0, passes the commit test;
    arm 0 so only while no alternative's mean is below arm 0's (:func:`contender`). After
    ``cap_rounds`` rounds commit the best arm that passes the test (else arm 0).

    :param p_best: the commit threshold
    :param cap_rounds: rounds after which it commits the best mean regardless
    :param draws: Monte Carlo draws for P(best)
    :param alpha: one-sided level of the commit test
    """

    name = "thompson"

    def __init__(self, p_best: float = 0.95, cap_rounds: int = 16, draws: int = 2000, alpha: float = ALPHA) -> None:
        if not 0.5 < p_best < 1:
            raise ConfigError("p_best", f"must be in (0.5, 1), got {p_best}")
        if cap_rounds < 1:
            raise ConfigError("cap_rounds", f"must be >= 1, got {cap_rounds}")
        self.p_best, self.cap_rounds, self.draws, self.alpha = float(p_best), int(cap_rounds), int(draws), float(alpha)

    def decide(self, state: BucketState, rng: np.random.Generator) -> Verdict:
        k = len(state.arms)
        alts = live_alternatives(state)
        if k == 1 or not alts:
            return Commit(0)
        if state.rounds >= self.cap_rounds:
            return safe_best(state, alpha=self.alpha)
        mu, sd = log_posterior(state)
        mu[[a for a in range(1, k) if a not in alts]] = np.inf  # dropped arms are never best, never drawn
        best = np.argmin(mu + sd * rng.standard_normal((self.draws, k)), axis=1)
        p = np.bincount(best, minlength=k) / self.draws
        lead = int(np.argmax(p))
        if p[lead] > self.p_best:
            # a leader not yet shown faster than arm 0 keeps being sampled; arm 0 is not committed
            # while an alternative's mean is below its own
            if lead and faster_than_incumbent(state, lead, self.alpha):
                return Commit(lead)
            if lead == 0 and contender(state, alts) is None:
                return Commit(0)
        n0 = control_slots(state.slots)
        picks = np.argmin(mu + sd * rng.standard_normal((state.slots - n0, k)), axis=1)
        cnt = np.minimum(np.bincount(picks, minlength=k), n0)
        counts = {a: int(cnt[a]) for a in range(1, k) if cnt[a]}
        return Plan(_interleave({0: state.slots - sum(counts.values())} | counts))


# -- the learned policy -----------------------------------------------------------------------------

#: the learned policy's actions at a round boundary
ACTIONS = ("continue", "drop-worst", "commit-best", "commit-incumbent")
CONTINUE, DROP, COMMIT_BEST, COMMIT_INCUMBENT = range(4)
#: per-arm features, then global ones
ARM_FEATURES = ("exists", "active", "log_ratio", "evidence", "prior_log_ratio", "cv")
GLOBAL_FEATURES = ("rounds_frac", "horizon_frac", "log_horizon", "log_left", "active_frac")
OBS_DIM = MAX_ARMS * len(ARM_FEATURES) + len(GLOBAL_FEATURES)
#: a bucket's calls over the job when the coordinator does not say (a stated guess)
DEFAULT_HORIZON_CALLS = 20_000
#: rounds after which the learned policy is made to commit (its training environment's cap)
PPO_MAX_ROUNDS = 48


def observe(state: BucketState, horizon_calls: int, max_rounds: int = PPO_MAX_ROUNDS) -> np.ndarray:
    """The learned policy's observation of ``state`` (:data:`OBS_DIM` floats, every one in [-1, 1]):
    per arm slot (padded to :data:`MAX_ARMS`) whether it exists, whether it is still explored, its
    log mean relative to arm 0, its evidence of being faster than arm 0 (Welch z / 5), the model's
    predicted log ratio to arm 0, its coefficient of variation; then rounds done / ``max_rounds``,
    the share of the horizon elapsed, log10 of the horizon / 7, log10 of the calls left / 7, and the
    share of arms still explored."""
    obs = np.zeros((MAX_ARMS, len(ARM_FEATURES)))
    act = set(active_arms(state))
    a0 = state.arms[0]
    p0 = state.prior_us[0] if state.prior_us else float("nan")
    for i, a in enumerate(state.arms[:MAX_ARMS]):
        obs[i, 0] = 1.0
        obs[i, 1] = float(i in act)
        if a.n and a0.n and a.mean_us > 0 and a0.mean_us > 0:
            obs[i, 2] = np.clip(math.log(a.mean_us / a0.mean_us), -1.0, 1.0)
        if a.n >= 2 and a0.n >= 2 and math.isfinite(a.std_us) and math.isfinite(a0.std_us):
            se = math.sqrt(a.std_us ** 2 / a.n + a0.std_us ** 2 / a0.n)
            obs[i, 3] = np.clip((a0.mean_us - a.mean_us) / max(se, 1e-9) / 5.0, -1.0, 1.0) if i else 0.0
            obs[i, 5] = min(a.std_us / max(a.mean_us, 1e-9), 1.0)
        p = state.prior_us[i] if i < len(state.prior_us) else float("nan")
        if math.isfinite(p) and math.isfinite(p0) and p > 0 and p0 > 0:
            obs[i, 4] = np.clip(math.log(p / p0), -1.0, 1.0)
    h = max(int(horizon_calls), 1)
    glob = [min(state.rounds / max_rounds, 1.0), min(state.calls / h, 1.0), min(math.log10(h) / 7.0, 1.0),
            min(math.log10(max(h - state.calls, 1)) / 7.0, 1.0), len(act) / MAX_ARMS]
    return np.concatenate([obs.ravel(), glob]).astype(np.float32)


def action_mask(state: BucketState, max_rounds: int = PPO_MAX_ROUNDS) -> np.ndarray:
    """Which of :data:`ACTIONS` are allowed: exploring stops at ``max_rounds`` or when no
    alternative is left to explore; dropping needs two alternatives still explored (arm 0 is never
    dropped: it is every comparison's reference)."""
    alts = [a for a in active_arms(state) if a != 0]
    more = state.rounds < max_rounds and len(alts) >= 1
    return np.array([more, more and len(alts) >= 2, True, True])


def apply_action(state: BucketState, action: int, alpha: float = ALPHA) -> Verdict:
    """What an action of :data:`ACTIONS` means: continue over arm 0 and the alternatives still
    explored (:func:`active_arms`: :func:`catastrophic` ones are gone; :func:`control_plan`'s share
    rule); drop the alternative of worst mean and continue over the rest; commit the best arm that
    passes the commit test (else arm 0); commit arm 0. Nothing left to explore: arm 0."""
    if action == COMMIT_INCUMBENT or len(state.arms) == 1:
        return Commit(0)
    if action == COMMIT_BEST:
        return safe_best(state, alpha=alpha)
    alts = [a for a in active_arms(state) if a != 0]
    if action == DROP:
        if len(alts) >= 2:
            alts.remove(max(alts, key=lambda a: state.arms[a].mean_us))
    elif action != CONTINUE:
        raise ConfigError("action", f"must be 0..{len(ACTIONS) - 1}, got {action}")
    return control_plan(alts, state.slots) if alts else Commit(0)


def policy_path() -> Path:
    """The shipped weights' metadata file (``pretrained/online_policy.json``; weights beside it, ``.npz``)."""
    return Path(str(files("ncclrl.agents") / "pretrained" / "online_policy.json"))


class PPOPolicy(OnlinePolicy):
    """The learned policy: an MLP (tanh hidden layers) on :func:`observe`, the most probable allowed
    action of :data:`ACTIONS` taken (deterministic). Its first round is every arm in turn.

    :param layers: (weight ``(in, out)``, bias) per layer, the last one the action logits
    :param meta: architecture, features and training settings
    :param horizon_calls: the bucket's expected calls over the job (the coordinator's estimate:
        expected steps x calls per step; default :data:`DEFAULT_HORIZON_CALLS`)
    """

    name = "ppo"

    def __init__(self, layers: list[tuple[np.ndarray, np.ndarray]], meta: dict[str, Any],
                 horizon_calls: int | None = None) -> None:
        self.layers, self.meta = layers, meta
        self.horizon_calls = int(horizon_calls or DEFAULT_HORIZON_CALLS)
        self.max_rounds = int(meta.get("max_rounds", PPO_MAX_ROUNDS))
        self.alpha = float(meta.get("alpha", ALPHA))
        if layers[0][0].shape[0] != OBS_DIM or layers[-1][0].shape[1] != len(ACTIONS):
            raise ConfigError("online_policy", f"weights of shape {layers[0][0].shape} -> {layers[-1][0].shape} "
                              f"do not fit {OBS_DIM} features -> {len(ACTIONS)} actions")

    def logits(self, obs: np.ndarray) -> np.ndarray:
        return mlp.forward(self.layers, obs)

    def act(self, state: BucketState) -> int:
        """The action the policy takes in ``state``."""
        lg = self.logits(observe(state, self.horizon_calls, self.max_rounds))
        return int(np.argmax(np.where(action_mask(state, self.max_rounds), lg, -np.inf)))

    def decide(self, state: BucketState, rng: np.random.Generator) -> Verdict:
        return apply_action(state, self.act(state), self.alpha)

    def save(self, path: str | Path) -> Path:
        """Write ``path`` (.json: metadata) and its .npz (weights)."""
        return mlp.save(path, self.layers, dict(self.meta) | {
            "obs_dim": OBS_DIM, "actions": list(ACTIONS), "arm_features": list(ARM_FEATURES),
            "global_features": list(GLOBAL_FEATURES)})

    @classmethod
    def load(cls, path: str | Path | None = None, horizon_calls: int | None = None) -> PPOPolicy:
        """The policy saved at ``path`` (default: the shipped one, :func:`policy_path`)."""
        layers, meta = mlp.load(path if path is not None else policy_path(), "online_policy",
                                "train them with docs/results/scripts/online_sim.py")
        return cls(layers, meta, horizon_calls)


# -- the registry -----------------------------------------------------------------------------------

POLICIES: tuple[str, ...] = ("round-robin", "halving", "thompson", "ppo")
#: the policy the study (docs/results/online-sim.md) says to ship
SHIPPED_POLICY: str = "halving"
#: the baselines' parameters tuned on the training stream (docs/results/online-sim.md)
TUNED: dict[str, dict[str, Any]] = {"round-robin": {"rounds": 1}, "halving": {"rounds_per_stage": 1},
                                    "thompson": {"cap_rounds": 48, "p_best": 0.9, "draws": 1000}}


def make_policy(name: str, **kw: Any) -> OnlinePolicy:
    """The policy ``name`` of :data:`POLICIES`, its tuned parameters (:data:`TUNED`) updated by ``kw``;
    ``ppo`` takes ``path`` (weights; default the shipped ones) and ``horizon_calls``."""
    key = str(name).strip().lower()
    if key not in POLICIES:
        raise ConfigError("policy", f"unknown value {name!r}; allowed: {', '.join(POLICIES)}")
    if key == "ppo":
        return PPOPolicy.load(kw.pop("path", None), kw.pop("horizon_calls", None))
    args = TUNED.get(key, {}) | kw
    return {"round-robin": RoundRobin, "halving": Halving, "thompson": Thompson}[key](**args)


__all__ = ["ACTIONS", "CATASTROPHIC", "MAX_ARMS", "MAX_ROUNDS", "MAX_SLOTS", "OBS_DIM", "POLICIES", "SHIPPED_POLICY",
           "TUNED", "ArmStats", "BucketState", "Commit", "Halving", "OnlinePolicy", "PPOPolicy", "Plan", "RoundRobin",
           "Thompson", "action_mask", "active_arms", "apply_action", "catastrophic", "contender", "control_plan",
           "control_slots", "faster_than_incumbent", "live_alternatives", "make_policy", "observe", "round_robin",
           "safe_best", "settle", "warm_up"]

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


@dataclass(frozen=True)
class ArmStats:
    """What the ranks measured of one arm.

    :param n: timed calls of this arm so far (all rounds)
    :param mean_us: mean per-call GPU time (nan if ``n`` is 0)
    :param std_us: sample sd of the per-call times (nan if ``n`` < 2)
    """

    n: int
    mean_us: float
    std_us: float


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
    (at least one call each; more arms than slots: the first ``slots``)."""
    arms = [int(a) for a in arms][: max(int(slots), 1)]
    reps = max(int(slots) // len(arms), 1)
    return Plan(tuple(arms * reps))


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


def safe_best(state: BucketState, among: Sequence[int] | None = None, alpha: float = ALPHA) -> Commit:
    """Commit the arm of least mean among ``among`` (default: all) that passes
    :func:`faster_than_incumbent`; arm 0 when none does."""
    among = range(len(state.arms)) if among is None else among
    ok = [a for a in among if a != 0 and state.arms[a].n > 0 and faster_than_incumbent(state, a, alpha)]
    return Commit(min(ok, key=lambda a: state.arms[a].mean_us) if ok else 0)


def active_arms(state: BucketState) -> list[int]:
    """Arms still explored: those timed as often as the most timed arm (a plan of
    :func:`round_robin` gives each arm of it the same calls, so an arm left out falls behind)."""
    n = [a.n for a in state.arms]
    top = max(n) if n else 0
    return [i for i, k in enumerate(n) if k == top and k > 0]


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
        """The first round's plan (no evidence yet): every arm in turn; one arm: commit it.

        :param n_arms: arms of the bucket (arm 0 the incumbent)
        :param prior_us: the exported model's predicted time per arm (nan if unknown)
        :param slots: plan length allowed
        :param rng: the coordinator's generator (the same seed on every rank)
        """
        _check(n_arms, slots)
        return Commit(0) if n_arms == 1 else round_robin(range(n_arms), slots)

    @abstractmethod
    def decide(self, state: BucketState, rng: np.random.Generator) -> Verdict:
        """The verdict after a round: the next plan, or commit.

        :param state: the bucket's measurements so far
        :param rng: the coordinator's generator (the same seed on every rank)
        """


class RoundRobin(OnlinePolicy):
    """``rounds`` rounds over every arm, then commit the best mean (if it beats arm 0).

    :param rounds: rounds of exploration before committing
    :param alpha: one-sided level of the commit test
    """

    name = "round-robin"

    def __init__(self, rounds: int = 2, alpha: float = ALPHA) -> None:
        if rounds < 1:
            raise ConfigError("rounds", f"must be >= 1, got {rounds}")
        self.rounds, self.alpha = int(rounds), float(alpha)

    def decide(self, state: BucketState, rng: np.random.Generator) -> Verdict:
        if state.rounds < self.rounds and len(state.arms) > 1:
            return round_robin(range(len(state.arms)), state.slots)
        return safe_best(state, alpha=self.alpha)


class Halving(OnlinePolicy):
    """Successive halving: every ``rounds_per_stage`` rounds keep the better half (by mean) of the
    arms still explored; with one left, commit it if it beats arm 0.

    :param rounds_per_stage: rounds between halvings
    :param alpha: one-sided level of the commit test
    """

    name = "halving"

    def __init__(self, rounds_per_stage: int = 1, alpha: float = ALPHA) -> None:
        if rounds_per_stage < 1:
            raise ConfigError("rounds_per_stage", f"must be >= 1, got {rounds_per_stage}")
        self.rounds_per_stage, self.alpha = int(rounds_per_stage), float(alpha)

    def decide(self, state: BucketState, rng: np.random.Generator) -> Verdict:
        act = active_arms(state)
        if len(act) <= 1:
            return safe_best(state, act, self.alpha)
        if state.rounds % self.rounds_per_stage:
            return round_robin(act, state.slots)
        keep = sorted(act, key=lambda a: state.arms[a].mean_us)[: (len(act) + 1) // 2]
        if len(keep) == 1:
            return safe_best(state, keep, self.alpha)
        return round_robin(sorted(keep), state.slots)


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
    """Thompson sampling on log time: each slot runs the arm whose posterior draw is least; commit
    when one arm is best with probability above ``p_best`` (Monte Carlo) and, if not arm 0, passes
    the commit test; after ``cap_rounds`` rounds commit the best arm that passes it (else arm 0).

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
        if k == 1:
            return Commit(0)
        if state.rounds >= self.cap_rounds:
            return safe_best(state, alpha=self.alpha)
        mu, sd = log_posterior(state)
        best = np.argmin(mu + sd * rng.standard_normal((self.draws, k)), axis=1)
        p = np.bincount(best, minlength=k) / self.draws
        lead = int(np.argmax(p))
        if p[lead] > self.p_best and (lead == 0 or faster_than_incumbent(state, lead, self.alpha)):
            return Commit(lead)  # a leader not yet shown faster than arm 0 keeps being sampled
        picks = np.argmin(mu + sd * rng.standard_normal((state.slots, k)), axis=1)
        return Plan(tuple(int(a) for a in picks))


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
    """Which of :data:`ACTIONS` are allowed: exploring stops at ``max_rounds``; dropping needs two
    alternatives still explored (arm 0 is never dropped: it is every comparison's reference)."""
    alts = [a for a in active_arms(state) if a != 0]
    more = state.rounds < max_rounds and len(state.arms) > 1
    return np.array([more, more and len(alts) >= 2, True, True])


def apply_action(state: BucketState, action: int, alpha: float = ALPHA) -> Verdict:
    """What an action of :data:`ACTIONS` means: continue round-robin over the arms still explored
    (arm 0 always among them); drop the alternative of worst mean and continue over the rest; commit
    the best arm that passes the commit test (else arm 0); commit arm 0."""
    if action == COMMIT_INCUMBENT or len(state.arms) == 1:
        return Commit(0)
    if action == COMMIT_BEST:
        return safe_best(state, alpha=alpha)
    act = sorted(set(active_arms(state)) | {0})
    if action == DROP:
        alts = [a for a in act if a != 0]
        if len(alts) >= 2:
            act.remove(max(alts, key=lambda a: state.arms[a].mean_us))
    elif action != CONTINUE:
        raise ConfigError("action", f"must be 0..{len(ACTIONS) - 1}, got {action}")
    return round_robin(act, state.slots)


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
TUNED: dict[str, dict[str, Any]] = {"round-robin": {"rounds": 2}, "halving": {"rounds_per_stage": 2},
                                    "thompson": {"cap_rounds": 48, "p_best": 0.95, "draws": 1000}}


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


__all__ = ["ACTIONS", "MAX_ARMS", "MAX_SLOTS", "OBS_DIM", "POLICIES", "SHIPPED_POLICY", "TUNED", "ArmStats",
           "BucketState", "Commit", "Halving", "OnlinePolicy", "PPOPolicy", "Plan", "RoundRobin", "Thompson",
           "action_mask", "active_arms", "apply_action", "faster_than_incumbent", "make_policy", "observe",
           "round_robin", "safe_best"]

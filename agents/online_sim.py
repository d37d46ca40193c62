"""A simulated training job for the online policies (:mod:`ncclrl.agents.online`), their Gymnasium
environment (``ncclrl/OnlineExplore-v0``, registered when this module is imported) and the learned
policy's training.

**A problem** is one bucket (one collective at one size on one communicator) of one training job:

* the platform: a preset drawn with :func:`ncclrl.costmodel.platforms.draw_platform`, misspecified
  (its simulator parameters randomized, :class:`~ncclrl.costmodel.platforms.Quirks` beyond the
  simulator: the truth); the exported model is the preset's nominal simulator (the prior);
* the bucket, from a synthetic profile (the recorded profiles, ``data/h100x1-jobs-*/profiles`` and
  ``docs/results/job-benchmark/fsdp-profile.yaml``, are 2-GPU test models of 64-130 KiB calls; only
  their shape is kept): ``ddp``-like, an AllReduce of 64 KiB-256 MiB (log-uniform) called 1-32
  times a step (gradient buckets); ``fsdp``-like, an AllGather (2 calls per layer and step:
  forward and backward) or a ReduceScatter (1 per layer) of 256 KiB-512 MiB, 8-80 layers;
* the job: ``steps`` log-uniform in [200, 20000], so ``steps x calls_per_step`` calls of the bucket;
* compute interference (``interference=True``): every call overlaps compute of ``ratio`` x the
  call's NCCL-default isolated time (``ratio`` log-uniform [0.3, 3]; 30% of it HBM-bound), through
  :meth:`ncclrl.costmodel.simulator.Simulator.interference`: each channel holds an SM
  (``sms_per_channel`` of ``gpu_sms``) and moves HBM bytes the compute lacks, and the call itself
  slows under the load (``load_bw_loss``, ``load_lat_frac``, randomized with the platform). A call's
  cost to the step is ``max(t_loaded - compute, t_loaded x (1 - compute_rate))``; what the ranks
  measure is the call's own GPU time ``t_loaded``. Without interference both are the isolated time;
* the arms: arm 0 the static table's row: half the problems a table chosen by the model alone
  (least predicted isolated time), half one chosen on one offline measuring job (least isolated
  truth x that job's per-point residual), NCCL's default kept unless 1% faster either way; arm 1
  NCCL's default when different; then the model's best predicted alternatives (by predicted step
  cost) up to 3-8 arms in all.

**A noise draw** (one run of the job): a job shift of sd ``shift_sd`` (10%) shared by every arm, a
per-arm residual of the fitted model (:meth:`JobNoise.draw_resid`, Student-t) that holds for the
whole job (the job's own truth: it counts in the cost too), and per call a multiplicative noise of
the fitted per-sample sd with the residual's heavy (Student-t) tail. Each arm's j-th timed call has
the same noise under every policy (common random numbers).

**The total** of a run is the cost of all the bucket's calls over the job: exploration calls at
their arm's cost, the gap's calls at arm 0's, the rest at the committed arm's (never committed: arm
0's after the last round). Its expected cost per call is used (never a noisy draw of it).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from ncclrl.agents import mlp
from ncclrl.agents.online import (
    ACTIONS,
    COMMIT_BEST,
    OBS_DIM,
    PPO_MAX_ROUNDS,
    BucketState,
    Commit,
    OnlinePolicy,
    Plan,
    PPOPolicy,
    action_mask,
    apply_action,
    control_plan,
    make_policy,
    observe,
    safe_best,
)
from ncclrl.agents.online import ArmStats as _ArmStats
from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.noise import JobNoise
from ncclrl.costmodel.platforms import draw_platform
from ncclrl.costmodel.replica import default_decisions
from ncclrl.costmodel.simulator import Configs, Simulator
from ncclrl.costmodel.topology import load_topology
from ncclrl.costmodel.workload import DEFAULT_MEM_FRAC, Choice, candidates

PROFILES = ("ddp", "fsdp")
PRESETS = ("h200-1x4", "dgx-h100-2n", "dgx-h100-16n", "a100-16x4-ib", "h200-2x2-sock")


@dataclass(frozen=True)
class SimConfig:
    """The simulated job's settings.

    :param slots: plan length the coordinator allows
    :param gap_calls: calls after each round that run arm 0 while timings are gathered
    :param max_rounds: rounds after which the coordinator commits the best safe arm itself
    :param shift_sd: sd (log) of the per-job shift shared by every arm
    :param min_steps: fewest training steps of a job
    :param max_steps: most training steps of a job
    :param compute_ratio: range of the overlapped compute per call, in multiples of the call's
        NCCL-default isolated time (log-uniform)
    :param measured_static: share of problems whose static table was chosen on an offline job
    :param min_arms: fewest arms per bucket
    :param max_arms: most arms per bucket
    """

    slots: int = 16
    gap_calls: int = 4
    max_rounds: int = PPO_MAX_ROUNDS
    shift_sd: float = 0.10
    min_steps: int = 200
    max_steps: int = 20_000
    compute_ratio: tuple[float, float] = (0.3, 3.0)
    measured_static: float = 0.5
    min_arms: int = 3
    max_arms: int = 8


@dataclass
class OnlineProblem:
    """One bucket of one job.

    :param preset: the platform's preset
    :param profile: ``ddp`` or ``fsdp``
    :param collective: the bucket's collective
    :param nbytes: its size
    :param calls_per_step: its calls per training step
    :param steps: the job's steps
    :param interference: whether its calls overlap compute
    :param arms: the arms' configurations (arm 0 the static table's)
    :param cost_us: per arm, the expected cost of one call to the step (us) on the truth
    :param meas_us: per arm, the expected measured GPU time of one call (us) on the truth
    :param prior_us: per arm, the model's predicted measured time (us)
    :param default_arm: the arm that is NCCL's default
    :param static_from: ``model`` or ``measured``: how arm 0 was chosen
    :param nbytes_noise: the size the noise model is read at
    :param noise: the platform's fitted noise
    """

    preset: str
    profile: str
    collective: str
    nbytes: int
    calls_per_step: int
    steps: int
    interference: bool
    arms: list[Choice]
    cost_us: np.ndarray
    meas_us: np.ndarray
    prior_us: np.ndarray
    default_arm: int
    static_from: str
    noise: JobNoise = field(repr=False, default_factory=JobNoise.zero)

    @property
    def n_calls(self) -> int:
        return int(self.steps * self.calls_per_step)

    @property
    def n_arms(self) -> int:
        return len(self.arms)


def _configs(topo: Any, coll: int, nbytes: int, choices: list[Choice]) -> Configs:
    d = default_decisions(topo, coll, np.array([nbytes]))
    algo = [int(d.algo[0]) if c.algo == "default" else N.parse_name("algorithm", c.algo, N.ALGOS) for c in choices]
    proto = [int(d.proto[0]) if c.algo == "default" else N.parse_name("protocol", c.proto, N.PROTOS) for c in choices]
    return Configs.make(coll, nbytes, algo, proto, [c.channels for c in choices])


def _times(sim: Simulator, iso: np.ndarray, cfg: Configs, compute_us: float) -> tuple[np.ndarray, np.ndarray]:
    """Per configuration: (measured GPU time, cost to the step) under ``compute_us`` of overlapped compute."""
    if compute_us <= 0:
        return iso, iso
    inter = sim.interference(cfg, np.full(len(cfg), compute_us), DEFAULT_MEM_FRAC, t_iso_us=iso, validate=False)
    return np.asarray(inter.nccl_us, dtype=float), np.asarray(inter.cost_us, dtype=float)


def draw_problem(rng: np.random.Generator, profile: str, interference: bool, cfg: SimConfig | None = None,
                 ) -> OnlineProblem:
    """One problem (see the module's docstring) drawn from ``rng``."""
    cfg = cfg or SimConfig()
    if profile not in PROFILES:
        raise ConfigError("profile", f"unknown value {profile!r}; allowed: {', '.join(PROFILES)}")
    preset = str(rng.choice(PRESETS))
    plat = draw_platform(preset, rng, misspecified=True)
    prior = Simulator(load_topology(preset))
    topo = plat.sim.topo
    if profile == "ddp":
        coll_name = "allreduce"
        nbytes = int(2 ** rng.uniform(16, 28))
        cps = int(round(math.exp(rng.uniform(0, math.log(32)))))
    else:
        coll_name = str(rng.choice(["allgather", "reducescatter"]))
        nbytes = int(2 ** rng.uniform(18, 29))
        cps = int(rng.integers(8, 81)) * (2 if coll_name == "allgather" else 1)
    q = 4 * (topo.nranks if coll_name != "allreduce" else 1)
    nbytes = max(q, nbytes // q * q)
    steps = int(round(math.exp(rng.uniform(math.log(cfg.min_steps), math.log(cfg.max_steps)))))
    coll = N.parse_name("collective", coll_name, N.COLLECTIVES)
    cands = candidates(topo, coll_name)
    cc = _configs(topo, coll, nbytes, cands)
    iso_true, iso_prior = plat.time_us(cc), prior.time_us(cc, validate=False)
    compute = 0.0
    if interference:
        lo, hi = cfg.compute_ratio
        compute = float(math.exp(rng.uniform(math.log(lo), math.log(hi)))) * float(iso_true[0])
    meas_true, cost_true = _times(plat.sim, iso_true, cc, compute)
    meas_prior, cost_prior = _times(prior, iso_prior, cc, compute)
    # candidates the same as another one (same prior time): keep the first
    _, first = np.unique(np.round(np.log(iso_prior), 9), return_index=True)
    keep = np.zeros(len(cands), bool)
    keep[first] = True
    keep[0] = True
    noise = plat.noise or JobNoise.load()
    if rng.random() < cfg.measured_static:
        static_from = "measured"
        offline = iso_true * np.exp(noise.draw_resid(np.full(len(cands), nbytes), rng))
    else:
        static_from, offline = "model", iso_prior
    offline = np.where(keep, offline, np.inf)
    s = int(np.argmin(offline))
    s = s if offline[s] < offline[0] * 0.99 else 0
    arms = [s] + ([0] if s != 0 else [])
    k = int(rng.integers(cfg.min_arms, cfg.max_arms + 1))
    for j in np.argsort(np.where(keep, cost_prior, np.inf)):
        if len(arms) >= k or not keep[j]:
            break
        if j not in arms:
            arms.append(int(j))
    return OnlineProblem(preset, profile, coll_name, nbytes, cps, steps, interference, [cands[j] for j in arms],
                         cost_true[arms], meas_true[arms], meas_prior[arms], arms.index(0), static_from, noise)


def draw_problems(n: int, stream: int, profile: str, interference: bool, cfg: SimConfig | None = None,
                  ) -> list[OnlineProblem]:
    """``n`` problems from seed stream ``stream`` (stream 1: training and tuning; 2: judging)."""
    tag = (PROFILES.index(profile), int(interference))
    return [draw_problem(np.random.default_rng([int(stream), *tag, i]), profile, interference, cfg) for i in range(n)]


# -- one run of the job ------------------------------------------------------------------------------

_BUF = 1024


class BucketRun:
    """One run of a problem's job under one noise draw, round by round.

    :param problem: the bucket
    :param seed: the noise draw (the same seed: the same job effects and per-call noise per arm)
    :param cfg: the simulated job's settings
    """

    def __init__(self, problem: OnlineProblem, seed: int, cfg: SimConfig | None = None) -> None:
        self.p, self.cfg = problem, cfg or SimConfig()
        rng = np.random.default_rng([int(seed), 7])
        k = problem.n_arms
        job = math.exp(self.cfg.shift_sd * rng.standard_normal()) * np.exp(
            problem.noise.draw_resid(np.full(k, problem.nbytes), rng))
        self.cost = problem.cost_us * job
        self.meas = problem.meas_us * job
        sd = float(problem.noise.sample_sd(problem.nbytes))
        df = problem.noise.resid_df
        z = rng.standard_t(df, (k, _BUF)) * math.sqrt((df - 2) / df) if math.isfinite(df) else \
            rng.standard_normal((k, _BUF))
        self.sample_log = sd * z
        self.n = np.zeros(k, np.int64)
        self.s1 = np.zeros(k)
        self.s2 = np.zeros(k)
        self.mx = np.full(k, math.nan)
        self.calls = self.rounds = 0
        self.total_us = 0.0
        self.committed: int | None = None
        self.commit_call = problem.n_calls
        self.done = False

    def state(self) -> BucketState:
        arms = []
        for n, s1, s2, mx in zip(self.n, self.s1, self.s2, self.mx, strict=True):
            m = s1 / n if n else float("nan")
            v = max((s2 - n * m * m) / (n - 1), 0.0) if n >= 2 else float("nan")
            arms.append(_ArmStats(int(n), float(m), float(math.sqrt(v)) if n >= 2 else float("nan"), float(mx)))
        return BucketState(tuple(arms), tuple(float(x) for x in self.p.prior_us), self.rounds, self.calls,
                           self.cfg.slots)

    def apply(self, verdict: Plan | Commit) -> float:
        """Run ``verdict`` (a round and its gap, or the rest of the job); the cost it adds (us)."""
        total_calls, k = self.p.n_calls, self.p.n_arms
        if isinstance(verdict, Commit):
            if not 0 <= verdict.arm < k:
                raise ConfigError("commit", f"arm {verdict.arm} outside 0..{k - 1}")
            c = (total_calls - self.calls) * float(self.cost[verdict.arm])
            self.committed, self.commit_call = int(verdict.arm), self.calls
            self.calls, self.done = total_calls, True
            self.total_us += c
            return c
        plan = np.asarray(verdict.slots, dtype=np.int64)
        if plan.size < 1 or plan.size > self.cfg.slots or plan.min() < 0 or plan.max() >= k:
            raise ConfigError("plan", f"{len(verdict.slots)} slots of arms {sorted(set(verdict.slots))}: needs "
                              f"1..{self.cfg.slots} slots of arms 0..{k - 1}")
        m = min(plan.size, total_calls - self.calls)
        cnt = np.bincount(plan[:m], minlength=k)
        for a in np.flatnonzero(cnt):
            idx = (self.n[a] + np.arange(cnt[a])) % _BUF
            x = self.meas[a] * np.exp(self.sample_log[a, idx])
            self.s1[a] += x.sum()
            self.s2[a] += float(x @ x)
            self.mx[a] = float(x.max()) if math.isnan(self.mx[a]) else max(self.mx[a], float(x.max()))
            self.n[a] += cnt[a]
        c = float(cnt @ self.cost)
        self.calls += m
        self.rounds += 1
        g = min(self.cfg.gap_calls, total_calls - self.calls)
        c += g * float(self.cost[0])
        self.calls += g
        self.total_us += c
        self.done = self.calls >= total_calls
        return c

    def result(self) -> dict[str, Any]:
        """The run's totals and its references (each the whole job at one arm)."""
        n = self.p.n_calls
        static, default, best = n * self.cost[0], n * self.cost[self.p.default_arm], n * self.cost.min()
        arm = self.committed
        return {"total_us": self.total_us, "rel_static": self.total_us / static, "rel_default": self.total_us / default,
                "rel_oracle": self.total_us / best, "committed": -1 if arm is None else arm,
                "slower_commit": bool(arm is not None and self.cost[arm] > self.cost[0] * (1 + 1e-9)),
                "slower_total": bool(self.total_us > static * (1 + 1e-9)),
                "commit_frac": self.commit_call / n, "commit_rounds": self.rounds,
                "best_arm": int(np.argmin(self.cost)), "oracle_vs_static": best / static,
                "default_vs_static": default / static}


def run_episode(problem: OnlineProblem, policy: OnlinePolicy, seed: int, cfg: SimConfig | None = None,
                ) -> dict[str, Any]:
    """``policy`` on one run of ``problem``'s job (noise draw ``seed``); past ``cfg.max_rounds`` rounds
    the coordinator commits the best safe arm. A :class:`PPOPolicy` is told the job's calls."""
    cfg = cfg or SimConfig()
    run = BucketRun(problem, seed, cfg)
    if isinstance(policy, PPOPolicy):
        policy.horizon_calls = problem.n_calls
    prng = np.random.default_rng([int(seed), 11])
    verdict = policy.first(problem.n_arms, tuple(float(x) for x in problem.prior_us), cfg.slots, prng)
    while True:
        run.apply(verdict)
        if run.done:
            break
        st = run.state()
        verdict = safe_best(st) if run.rounds >= cfg.max_rounds else policy.decide(st, prng)
    return run.result()


# -- the environment -------------------------------------------------------------------------------


class OnlineExploreEnv(gym.Env):
    """One episode: one run of one problem's job, decided at each round boundary by one of
    :data:`~ncclrl.agents.online.ACTIONS` (the first round is arm 0 and every alternative,
    :func:`~ncclrl.agents.online.control_plan`, as every policy's).

    Reward: minus each round's cost (and the committed rest of the job), divided by the whole job at
    arm 0; at the end plus the ``paired`` baseline's total on the same problem and noise draw
    (common random numbers), so an episode's return is the baseline's total minus the policy's in
    units of the static table's. An action the mask forbids acts as commit-best.

    :param problems: the problems to draw from (default: 8 small ones of stream 0)
    :param cfg: the simulated job's settings
    :param paired: the baseline (:func:`make_policy` name) to pair with, "" for none
    :param paired_kw: its parameters
    """

    metadata = {"render_modes": []}

    def __init__(self, problems: list[OnlineProblem] | None = None, cfg: SimConfig | None = None,
                 paired: str = "round-robin", paired_kw: dict[str, Any] | None = None) -> None:
        self.cfg = cfg or SimConfig()
        self.problems = problems if problems is not None else \
            draw_problems(4, 0, "ddp", False, self.cfg) + draw_problems(4, 0, "fsdp", True, self.cfg)
        self.paired = make_policy(paired, **(paired_kw or {})) if paired else None
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (OBS_DIM,), np.float32)
        self.action_space = gym.spaces.Discrete(len(ACTIONS))
        self.run: BucketRun | None = None

    def _obs(self) -> np.ndarray:
        return observe(self.run.state(), self.problem.n_calls, self.cfg.max_rounds)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.problem = self.problems[int(self.np_random.integers(len(self.problems)))]
        job = int(self.np_random.integers(1 << 31))
        self.run = BucketRun(self.problem, job, self.cfg)
        self.norm = self.problem.n_calls * float(self.run.cost[0])
        self.base = run_episode(self.problem, self.paired, job, self.cfg)["total_us"] if self.paired else 0.0
        self.pending = -self.run.apply(control_plan(range(1, self.problem.n_arms), self.cfg.slots)) / self.norm
        return self._obs(), {}

    def action_masks(self) -> np.ndarray:
        return action_mask(self.run.state(), self.cfg.max_rounds)

    def step(self, action: int):
        st = self.run.state()
        a = int(action)
        if not action_mask(st, self.cfg.max_rounds)[a]:
            a = COMMIT_BEST
        reward = self.pending - self.run.apply(apply_action(st, a)) / self.norm
        self.pending = 0.0
        info: dict[str, Any] = {}
        if self.run.done:
            reward += self.base / self.norm
            info = {"rel_static": self.run.total_us / self.norm,
                    "vs_paired": (self.base - self.run.total_us) / self.norm}
        return self._obs(), float(reward), bool(self.run.done), False, info


# -- training -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainConfig:
    """MaskablePPO's settings for the online policy.

    :param total_timesteps: decisions to train on
    :param n_envs: episodes stepped together
    :param n_steps: steps per environment between updates
    :param batch_size: minibatch size
    :param n_epochs: passes over each rollout
    :param learning_rate: Adam's step size
    :param ent_coef: entropy bonus
    :param hidden: width of each of the two tanh hidden layers
    :param paired: baseline the reward is paired with ("" for none)
    :param seed: training seed
    """

    total_timesteps: int = 60_000
    n_envs: int = 8
    n_steps: int = 128
    batch_size: int = 256
    n_epochs: int = 5
    learning_rate: float = 3e-4
    ent_coef: float = 0.01
    hidden: int = 64
    paired: str = "round-robin"
    seed: int = 0


def train(problems: list[OnlineProblem], tcfg: TrainConfig, cfg: SimConfig | None = None,
          paired_kw: dict[str, Any] | None = None, log=print) -> PPOPolicy:
    """Train the online policy on ``problems`` with MaskablePPO; the policy comes back as numpy."""
    import torch
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.vec_env import DummyVecEnv

    torch.set_num_threads(1)
    cfg = cfg or SimConfig()
    envs = [OnlineExploreEnv(problems, cfg, tcfg.paired, paired_kw) for _ in range(tcfg.n_envs)]
    vec = DummyVecEnv([(lambda e=e: e) for e in envs])
    t0 = time.time()
    model = MaskablePPO("MlpPolicy", vec, n_steps=tcfg.n_steps, batch_size=tcfg.batch_size, n_epochs=tcfg.n_epochs,
                        learning_rate=tcfg.learning_rate, ent_coef=tcfg.ent_coef, gamma=1.0, gae_lambda=0.95,
                        seed=tcfg.seed, verbose=0, device="cpu",
                        policy_kwargs={"net_arch": {"pi": [tcfg.hidden, tcfg.hidden], "vf": [tcfg.hidden, tcfg.hidden]},
                                       "activation_fn": torch.nn.Tanh})
    model.learn(tcfg.total_timesteps)
    layers = mlp.policy_layers(model)
    meta = {"train": asdict(tcfg), "sim": asdict(cfg), "paired_kw": paired_kw or {}, "problems": len(problems),
            "max_rounds": cfg.max_rounds, "train_s": round(time.time() - t0, 1)}
    log(f"# seed {tcfg.seed}: trained {tcfg.total_timesteps} steps in {time.time() - t0:.0f} s")
    return PPOPolicy(layers, meta)


if "ncclrl/OnlineExplore-v0" not in gym.registry:
    gym.register(id="ncclrl/OnlineExplore-v0", entry_point="ncclrl.agents.online_sim:OnlineExploreEnv")


__all__ = ["PRESETS", "PROFILES", "BucketRun", "OnlineExploreEnv", "OnlineProblem", "SimConfig", "TrainConfig",
           "draw_problem", "draw_problems", "run_episode", "train"]

"""The job composer as a learned policy: its environment, its training with MaskablePPO, and the
numpy policy that runs it.

:class:`ComposeEnv` (``ncclrl/Compose-v0``) plays one :class:`ncclrl.agents.compose.ComposeRun`
per episode on a problem drawn from a pool; each step the agent composes the next job or stops.
Its observation is, per knob setting and size band, what the model says about that band's
candidates (expected improvement, knowledge gradient, the best posterior gain over the current
table, its uncertainty), how much of it is measured and confirmed, the band's share of the step
and the predicted GPU-time of its jobs, relative to the served GPU-time; and, for the run, the
budget left, what was spent, the current table's predicted gain and the horizon. Its reward is the
change of the run's net value (points: :meth:`ComposeRun.net_value`), so an episode's return is
the run's net value; with ``paired``, the net value a baseline composer reached on the same
problem and noise draw is subtracted at the end (common random numbers: the expected gradient is
unchanged, its variance falls).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from ncclrl.agents import mlp
from ncclrl.agents.compose import (
    BAND_CHOICES,
    CANDIDATES,
    FIRST,
    MAX_KNOBS,
    N_ACTIONS,
    N_BANDS,
    STOP,
    Action,
    ComposeConfig,
    ComposeProblem,
    Composer,
    ComposeRun,
    JobsRule,
    PerSecond,
    SweepRace,
    play,
)
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.units import plural

CELL_FEATURES = ("valid", "share", "ei_pts", "ei_rate4", "ei_rate_all", "kg_rate1", "kg_rate4", "best_gain",
                 "leader_sd", "measured", "nccl_jobs", "leader_jobs", "in_table", "rows", "cost_all", "cost_one",
                 "knob_gain", "knob_jobs")
RUN_FEATURES = ("left", "spent", "table_gain", "jobs", "job_sigma", "knobs", "first", "horizon", "sweep_cost")
N_OBS = MAX_KNOBS * N_BANDS * len(CELL_FEATURES) + len(RUN_FEATURES)
#: the jobs a macro policy chooses among (beside stop): what each baseline would run next, its stop
#: rule ignored; the leaders of the most promising setting again; NCCL's defaults again
MACROS = ("jobs", "ei-shape", "kg/s", "confirm", "defaults")
MACRO_FEATURES = ("valid", "ei_rate", "kg_rate", "cost", "points", "in_table", "all_bands", "candidates")
N_MACRO_OBS = N_OBS + len(MACROS) * len(MACRO_FEATURES)
#: baselines an episode's return can be paired with ("" for none)
PAIRED = ("", "jobs", "sweep-race", "kg/s", "ei/s", "ucb/s")


def _lg(x: np.ndarray | float) -> np.ndarray:
    """A signed log scale for ratios and points."""
    x = np.asarray(x, dtype=float)
    return np.sign(x) * np.log1p(np.abs(x))


def acquisition_sums(run: ComposeRun) -> tuple[np.ndarray, np.ndarray]:
    """Per action, the expected improvement and the knowledge gradient of its job's points."""
    return run.job_sums(PerSecond("ei").point_value(run)), run.job_sums(PerSecond("kg").point_value(run))


def observe(run: ComposeRun, sums: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """The observation of ``run`` (module docs), float32, clipped to [-10, 10]; ``sums``:
    :func:`acquisition_sums` when the caller has them already."""
    p = run.p
    f = np.zeros((MAX_KNOBS, N_BANDS, len(CELL_FEATURES)))
    nk = p.n_knobs
    cost, count = run.job_costs()
    ei_all, kg_all = sums if sums is not None else acquisition_sums(run)
    serve = p.serve_gpu_s

    def per(vals: np.ndarray) -> np.ndarray:  # per action (flat) -> [knob, band choice, candidates]
        return vals[1:].reshape(MAX_KNOBS, BAND_CHOICES, len(CANDIDATES))[:, :N_BANDS]

    ei_sum = per(ei_all)
    kg_sum = per(kg_all)
    c = per(cost)
    ok = per(count) > 0
    f[:, :, 0] = ok[:, :, 0]
    band_share = np.bincount(p.band, run.share, N_BANDS)
    f[:nk, :, 1] = band_share * 10
    f[:, :, 2] = _lg(ei_sum[:, :, 2] * 100)
    safe = np.where(ok, c, 1.0)
    f[:, :, 3] = np.where(ok[:, :, 2], _lg(ei_sum[:, :, 2] * serve / safe[:, :, 2]), 0)
    f[:, :, 4] = np.where(ok[:, :, 3], _lg(ei_sum[:, :, 3] * serve / safe[:, :, 3]), 0)
    f[:, :, 5] = np.where(ok[:, :, 0], _lg(kg_sum[:, :, 0] * serve / safe[:, :, 0]), 0)
    f[:, :, 6] = np.where(ok[:, :, 2], _lg(kg_sum[:, :, 2] * serve / safe[:, :, 2]), 0)
    imp = run.improvement() * run.share[p.cell]
    kb = p.knob * N_BANDS + p.band[p.cell]
    best = np.full(nk * N_BANDS, 0.0)
    np.maximum.at(best, kb[p.candidate], imp[p.candidate])
    f[:nk, :, 7] = _lg(best.reshape(nk, N_BANDS) * 100)
    lead = p.candidate & (run.rank == 0)
    sd = np.bincount(kb[lead], run.std[lead], nk * N_BANDS) / np.maximum(np.bincount(kb[lead], None, nk * N_BANDS), 1)
    f[:nk, :, 8] = sd.reshape(nk, N_BANDS) * 10
    cand = np.bincount(kb[p.candidate], None, nk * N_BANDS)
    meas = np.bincount(kb[p.candidate & (run.n > 0)], None, nk * N_BANDS)
    f[:nk, :, 9] = (meas / np.maximum(cand, 1)).reshape(nk, N_BANDS)
    nd = np.where(p.nccl >= 0, run.n[np.maximum(p.nccl, 0)], 99)
    for b in range(N_BANDS):
        cells = p.band == b
        if cells.any():
            f[:nk, b, 10] = np.minimum(nd[:, cells].min(axis=1), 3) / run.cfg.min_jobs
    top = p.candidate & (run.n > 0)
    best_n = np.zeros(nk * N_BANDS)
    order = np.argsort(-run.mean[top])
    idx = np.flatnonzero(top)[order]
    seen = set()
    for i in idx:  # each (knob, band)'s best measured point: how often it was measured
        g = int(kb[i])
        if g not in seen:
            seen.add(g)
            best_n[g] = min(run.n[i], 3) / run.cfg.min_jobs
    f[:nk, :, 11] = best_n.reshape(nk, N_BANDS)
    f[run.table_knob, :, 12] = 1.0
    rows = np.bincount(p.band[run.rows >= 0], None, N_BANDS) if (run.rows >= 0).any() else np.zeros(N_BANDS)
    n_band = np.bincount(p.band, None, N_BANDS)
    f[run.table_knob, :, 13] = rows / np.maximum(n_band, 1)
    f[:, :, 14] = np.where(ok[:, :, 3], _lg(c[:, :, 3] / serve * 100), 0)
    f[:, :, 15] = np.where(ok[:, :, 0], _lg(c[:, :, 0] / serve * 100), 0)
    dk = np.where(p.nccl >= 0, run.mean[np.maximum(p.nccl, 0)], 0.0)
    f[:nk, :, 16] = (dk @ run.share)[:, None] * 10
    f[:nk, :, 17] = (np.minimum(run.jobs, 6) / 3)[:, None]
    left = p.budget_gpu_s - run.spent_gpu_s
    sweep = float(cost[Action(0, N_BANDS, 0).index]) if math.isfinite(cost[Action(0, N_BANDS, 0).index]) else 0.0
    g = np.array([_lg(left / serve * 100), _lg(run.spent_gpu_s / serve * 100), run.table_gain() * 10,
                  len(run.history) / run.cfg.max_jobs, p.noise.shift_sd * 10, nk / MAX_KNOBS,
                  float(not run.history), math.log10(serve / max(sweep * nk, 1e-9)), _lg(sweep / serve * 100)])
    return np.clip(np.concatenate([f.ravel(), g]), -10, 10).astype(np.float32)


def propose(run: ComposeRun) -> list[Action | None]:
    """Per :data:`MACROS`, the job it would run next (``None``: none valid)."""
    ok = run.valid()
    if not run.history:
        return [FIRST if ok[FIRST.index] else None] + [None] * (len(MACROS) - 1)
    out: list[Action | None] = [JobsRule().choose(run, stop=False),
                                PerSecond("ei", shape=(N_BANDS, 1)).choose(run, stop=False),
                                PerSecond("kg").choose(run, stop=False)]
    p = run.p
    lead = np.where(p.nccl >= 0, run.mean[np.maximum(p.nccl, 0)], -np.inf)  # per (knob, size)
    best = np.full((p.n_knobs, p.n_cells), -np.inf)
    np.maximum.at(best, (p.knob[p.candidate], p.cell[p.candidate]), run.mean[p.candidate])
    gain = np.maximum(lead, best) @ run.share
    k = int(np.argmax(np.where(run.jobs > 0, gain, -np.inf))) if (run.jobs > 0).any() else 0
    out += [Action(k, N_BANDS, 1), Action(0, N_BANDS, 1)]
    return [a if a is not None and ok[a.index] else None for a in out]


def observe_macros(run: ComposeRun, props: list[Action | None]) -> np.ndarray:
    """:func:`observe` and, per macro, :data:`MACRO_FEATURES` of the job it proposes."""
    cost, count = run.job_costs()
    ei, kg = acquisition_sums(run)
    serve = run.p.serve_gpu_s
    m = np.zeros((len(MACROS), len(MACRO_FEATURES)))
    for j, a in enumerate(props):
        if a is None:
            continue
        i = a.index
        m[j] = [1.0, _lg(ei[i] * serve / cost[i]), _lg(kg[i] * serve / cost[i]), _lg(cost[i] / serve * 100),
                count[i] / 100, float(a.knob == run.table_knob), float(a.band == N_BANDS),
                CANDIDATES.index(a.candidates) / 3]
    return np.concatenate([observe(run, (ei, kg)), np.clip(m.ravel(), -10, 10).astype(np.float32)])


class ComposeEnv(gym.Env):
    """Composed tuning runs as episodes, for training the job composer.

    ## Description
    Each episode is one :class:`ncclrl.agents.compose.ComposeRun` on a problem drawn uniformly from
    ``problems`` (or from ``weights`` when given) with a fresh noise draw. Each step the agent
    composes the next job (knob setting, size band or all bands, candidates per size) or stops.
    The first job is NCCL's defaults with every configuration under them, or stop.

    ## Action Space
    ``Discrete(N_ACTIONS)``: 0 stops; ``Action(k, b, c).index`` composes a job. Actions whose job is
    empty, names a knob setting the problem lacks, or is predicted to overrun the budget are masked
    (``action_masks``).

    ## Observation Space
    ``Box(N_OBS)``: :data:`CELL_FEATURES` per (knob setting, band), then :data:`RUN_FEATURES`.

    ## Rewards
    The change of the run's net value in points (:meth:`ComposeRun.net_value`); with ``paired``,
    minus a baseline's net value on the same problem and noise at the episode's end.

    ## Episode End
    Terminated when the agent stops, the budget left pays for no job, or ``max_jobs`` jobs ran.

    ## Arguments
    ``problems`` (list of :class:`ComposeProblem`), ``cfg`` (:class:`ComposeConfig`), ``paired`` (a
    baseline composer's name or ``""``), ``weights`` (sampling weight per problem).

    ## Version History
    - v0: first version
    """

    metadata = {"render_modes": []}

    def __init__(self, problems: list[ComposeProblem], cfg: ComposeConfig | None = None, paired: str = "",
                 weights: np.ndarray | None = None, macros: bool = False) -> None:
        if not problems:
            raise ConfigError("problems", "need at least one problem")
        if paired not in PAIRED:
            raise ConfigError("paired", f"unknown baseline {paired!r}; allowed: {', '.join(PAIRED)}, '' (none)")
        self.problems, self.cfg, self.paired = problems, cfg or ComposeConfig(), paired
        self.weights = None if weights is None else np.asarray(weights, dtype=float) / np.sum(weights)
        self.macros = macros
        self.action_space = gym.spaces.Discrete(1 + len(MACROS) if macros else N_ACTIONS)
        self.observation_space = gym.spaces.Box(-10.0, 10.0, (N_MACRO_OBS if macros else N_OBS,), np.float32)
        self.run: ComposeRun | None = None
        self.index = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.index = int(self.np_random.choice(len(self.problems), p=self.weights))
        noise_seed = int(self.np_random.integers(1 << 31))
        self.noise_seed = noise_seed
        p = self.problems[self.index]
        self.run = ComposeRun(p, np.random.default_rng([noise_seed, 7, p.noise_key]), self.cfg)
        self.value = self.run.net_value()
        return self._obs(), {}

    def _obs(self) -> np.ndarray:
        if not self.macros:
            return observe(self.run)
        self.props = propose(self.run)
        return observe_macros(self.run, self.props)

    def action_masks(self) -> np.ndarray:
        if self.macros:
            return np.array([True] + [a is not None for a in self.props])
        return self.run.valid()

    def step(self, action: int):
        run = self.run
        if self.macros:
            a = None if int(action) == STOP else self.props[int(action) - 1]
        else:
            a = None if int(action) == STOP else Action.of(int(action))
            if a is not None and not run.valid()[int(action)]:
                a = None  # a masked action stops the run
        going = run.step(a)
        if going and not run.valid()[1:].any():
            going, run.done = False, True
        v = run.net_value()
        reward, self.value = v - self.value, v
        info: dict[str, Any] = {}
        if not going and self.paired:
            base = paired_baseline(self.paired)
            ref = play(run.p, base, 0, self.cfg, noise_seed=self.noise_seed).net_value
            reward -= ref
            info["baseline"] = ref
        if not going:
            info["net_value"] = v
        return self._obs(), float(reward), not going, False, info


def paired_baseline(name: str) -> Composer:
    if name == "jobs":
        return JobsRule()
    return SweepRace() if name == "sweep-race" else PerSecond(name.split("/")[0])


# -- the numpy policy --------------------------------------------------------------------------

SHIPPED = "shipped"


def composer_path(name: str) -> Path:
    """A composer's JSON: ``shipped`` is the one installed with ncclrl, anything else a path."""
    if name == SHIPPED:
        from importlib.resources import files

        return Path(str(files("ncclrl.agents") / "pretrained" / "composer.json"))
    return Path(name)


class PolicyComposer(Composer):
    """A trained composer: an MLP (tanh) from :func:`observe`'s vector to one logit per action,
    invalid actions masked; the most probable valid action is taken. Shipped as ``composer.json``
    (architecture, features, training settings) + ``composer.npz`` (weights); scoring needs only numpy.

    :param layers: (weight, bias) per layer, the last one the action logits
    :param meta: what the JSON says
    """

    name = "ppo"

    def __init__(self, layers: list[tuple[np.ndarray, np.ndarray]], meta: dict[str, Any]) -> None:
        self.macros = bool(meta.get("macros", False))
        n_in, n_out = (N_MACRO_OBS, 1 + len(MACROS)) if self.macros else (N_OBS, N_ACTIONS)
        if not layers or layers[-1][0].shape[1] != n_out or layers[0][0].shape[0] != n_in:
            raise ConfigError("composer", f"weights must map {n_in} features to {n_out} actions")
        self.layers, self.meta = layers, meta

    def logits(self, obs: np.ndarray) -> np.ndarray:
        return mlp.forward(self.layers, obs)

    def act(self, run: ComposeRun) -> Action | None:
        if self.macros:
            props = propose(run)
            ok = np.array([True] + [a is not None for a in props])
            i = int(np.argmax(np.where(ok, self.logits(observe_macros(run, props)), -np.inf)))
            return None if i == STOP else props[i - 1]
        z = np.where(run.valid(), self.logits(observe(run)), -np.inf)
        i = int(np.argmax(z))
        return None if i == STOP else Action.of(i)

    def save(self, path: str | Path) -> Path:
        return mlp.save(path, self.layers, {
            **self.meta, "cell_features": list(CELL_FEATURES), "run_features": list(RUN_FEATURES),
            "macros": self.macros, "macro_features": list(MACRO_FEATURES) if self.macros else [],
            "actions": ["stop", *MACROS] if self.macros else N_ACTIONS})

    @classmethod
    def load(cls, path: str | Path) -> PolicyComposer:
        layers, meta = mlp.load(path, "composer", "train one with ncclrl composer")
        if meta.get("cell_features") != list(CELL_FEATURES) or meta.get("run_features") != list(RUN_FEATURES) \
                or (meta.get("macros") and meta.get("actions") != ["stop", *MACROS]):
            raise ConfigError("composer", f"{Path(path).with_suffix('.json')} was trained on other features; "
                              "retrain it")
        return cls(layers, meta)


def is_composer(path: str | Path) -> bool:
    """Whether the JSON at ``path`` is a job composer's (else a per-point strategy's); a composer's
    weights (``composer.npz``) name the composer whose JSON is beside them."""
    p = Path(path)
    if p.suffix.lower() == ".npz":
        p = p.with_suffix(".json")
    try:
        return "cell_features" in json.loads(p.read_text())
    except (OSError, ValueError):
        return False


# -- training ----------------------------------------------------------------------------------


#: ``tensorboard=none``: no training curves
NO_CURVES = "none"


@dataclass
class TrainConfig:
    """MaskablePPO's settings for the composer.

    :param total_timesteps: jobs composed in training (steps)
    :param n_envs: episodes stepped together
    :param n_steps: steps per environment between updates
    :param batch_size: minibatch size
    :param n_epochs: passes over each rollout
    :param learning_rate: Adam's step size
    :param ent_coef: entropy bonus
    :param hidden: width of each of the two hidden layers
    :param paired: baseline subtracted from each episode's return ("" for none)
    :param reweight_every: episodes between reweighting the problems towards those where the policy
        trails the paired baseline most (0: uniform sampling; needs paired)
    :param macros: choose among the macros (what each baseline would run next) instead of composing
        jobs from knob setting, band and candidates
    :param seed: training seed
    :param tensorboard: folder for SB3's TensorBoard curves ("" or none: no curves)
    """

    total_timesteps: int = 80_000
    n_envs: int = 8
    n_steps: int = 128
    batch_size: int = 256
    n_epochs: int = 5
    learning_rate: float = 3e-4
    ent_coef: float = 0.01
    hidden: int = 128
    paired: str = "sweep-race"
    reweight_every: int = 0
    macros: bool = False
    seed: int = 0
    tensorboard: str = ""

    def __post_init__(self) -> None:
        for name in ("total_timesteps", "n_envs", "n_steps", "batch_size", "n_epochs", "hidden"):
            if getattr(self, name) < 1:
                raise ConfigError(f"train.{name}", f"must be >= 1, got {getattr(self, name)}")
        if (self.n_envs * self.n_steps) % self.batch_size:
            raise ConfigError("train.batch_size", f"must divide n_envs * n_steps ({self.n_envs * self.n_steps})")
        if self.paired not in PAIRED:
            raise ConfigError("train.paired", f"unknown baseline {self.paired!r}; allowed: {', '.join(PAIRED)}, "
                              "'' (none)")
        if self.reweight_every and not self.paired:
            raise ConfigError("train.reweight_every", "needs train.paired (a baseline to trail)")
        if not self.learning_rate > 0:
            raise ConfigError("train.learning_rate", f"must be a number > 0 (Adam's step size), got "
                              f"{self.learning_rate}")
        if not self.ent_coef >= 0:
            raise ConfigError("train.ent_coef", f"must be a number >= 0 (0: no entropy bonus), got {self.ent_coef}")
        if self.reweight_every < 0:
            raise ConfigError("train.reweight_every", f"must be >= 0 (0: uniform sampling), got {self.reweight_every}")


def train(problems: list[ComposeProblem], cfg: TrainConfig, compose: ComposeConfig | None = None,
          log=print) -> PolicyComposer:
    """Train a composer on ``problems`` with MaskablePPO; the policy network comes back as numpy."""
    import torch
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.vec_env import DummyVecEnv

    torch.set_num_threads(1)
    compose = compose or ComposeConfig()
    weights = np.ones(len(problems))
    envs = [ComposeEnv(problems, compose, cfg.paired, weights, cfg.macros) for _ in range(cfg.n_envs)]
    vec = DummyVecEnv([(lambda e=e: e) for e in envs])
    model = MaskablePPO("MlpPolicy", vec, n_steps=cfg.n_steps, batch_size=cfg.batch_size, n_epochs=cfg.n_epochs,
                        learning_rate=cfg.learning_rate, ent_coef=cfg.ent_coef, gamma=1.0, gae_lambda=0.95,
                        seed=cfg.seed, verbose=0,
                        tensorboard_log=None if cfg.tensorboard in ("", NO_CURVES) else cfg.tensorboard,
                        policy_kwargs={"net_arch": {"pi": [cfg.hidden, cfg.hidden], "vf": [cfg.hidden, cfg.hidden]},
                                       "activation_fn": torch.nn.Tanh})
    trail = np.zeros(len(problems))  # per problem, running mean of (baseline - policy) net value
    seen = np.zeros(len(problems))
    t0 = time.time()

    class Track(BaseCallback):
        episodes = 0

        def _on_step(self) -> bool:
            for env_i, (done, info) in enumerate(zip(self.locals["dones"], self.locals["infos"], strict=True)):
                if not done or "net_value" not in info:
                    continue
                Track.episodes += 1
                i = envs[env_i].index
                if "baseline" in info:
                    trail[i] += 0.2 * ((info["baseline"] - info["net_value"]) - trail[i]) if seen[i] else \
                        info["baseline"] - info["net_value"]
                    seen[i] = 1
                self.logger.record_mean("compose/net_value", info["net_value"])
                if "baseline" in info:
                    self.logger.record_mean("compose/vs_baseline", info["net_value"] - info["baseline"])
                if cfg.reweight_every and Track.episodes % cfg.reweight_every == 0:
                    w = 1.0 + np.clip(trail, 0, None) / max(float(np.clip(trail, 0, None).mean()), 1e-9)
                    for e in envs:
                        e.weights = w / w.sum()
            return True

    model.learn(cfg.total_timesteps, callback=Track(), tb_log_name=f"compose-seed{cfg.seed}")
    layers = mlp.policy_layers(model)
    meta = {"macros": cfg.macros, "train": asdict(cfg), "compose": asdict(compose), "problems": len(problems),
            "episodes": Track.episodes, "train_s": round(time.time() - t0, 1)}
    log(f"# trained {plural(cfg.total_timesteps, 'step')} ({plural(Track.episodes, 'episode')}) in "
        f"{time.time() - t0:.0f} s")
    return PolicyComposer(layers, meta)


if "ncclrl/Compose-v0" not in gym.registry:
    gym.register(id="ncclrl/Compose-v0", entry_point="ncclrl.agents.compose_train:ComposeEnv")

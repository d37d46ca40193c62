"""Training the search strategy with MaskablePPO over simulated tuning runs.

An episode is one tuning run (:class:`ncclrl.agents.search.Search`) on a platform drawn from the
training families (:mod:`ncclrl.costmodel.platforms`: nominal and misspecified), one collective,
with a budget drawn log-uniformly in [``min_budget``, ``max_budget``]. A step is one pick from the
shortlist (or stop). The reward after each measured round is the change, in percent, of the
decided table's fraction of the optimum on the platform's true times, minus ``cost_pct`` per point
measured: what the run ends with is the final table's quality minus the cost of what it measured.

The network scores every shortlisted candidate with the same small MLP over its features
(:data:`ncclrl.agents.search.FEATURES`), as MetaBO (Volpp et al., ICLR 2020) does for
acquisition functions; the value head reads the mean and max of the candidates' hidden layer.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from sb3_contrib import MaskablePPO
from sb3_contrib.common.maskable.policies import MaskableActorCriticPolicy
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv
from torch import nn

from ncclrl.agents.problem import Evaluator, Oracle, Problem, platform_measure
from ncclrl.agents.search import N_FEATURES, PolicyController, Search, SearchConfig
from ncclrl.agents.strategy_config import AgentConfig, ExperimentConfig
from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.platforms import FAMILIES, draw_platform
from ncclrl.costmodel.workload import calls_by_size


class StrategyEnv(gym.Env):
    """Tuning runs as episodes, for training the search strategy.

    ## Description
    Each episode tunes one collective over 8 B - 1 GiB on a platform drawn from ``families``
    (with ``cfg.profile``: a job's sizes of one of its collectives, judged on its communication
    time per step); the agent picks, one at a time, the next point to measure from a shortlist,
    or stops.

    ## Action Space
    ``Discrete(shortlist + 1)``: a shortlist entry, or the last action, *stop*. Entries beyond the
    shortlist's length are masked (``action_masks``).

    ## Observation Space
    ``Box((shortlist + 1) * len(FEATURES))``: each entry's features (zeros where masked), the stop
    row last.

    ## Rewards
    After each measured round: the change in percent of the decided table's fraction of the
    optimum, minus ``cost_pct`` per point measured.

    ## Episode End
    Terminated when the budget is spent, nothing is left to measure, or the agent stops.

    ## Arguments
    ``cfg`` (:class:`ExperimentConfig`), ``search`` (:class:`ncclrl.agents.search.SearchConfig`).

    ## Version History
    - v0: first version; ``cfg.profile`` (a job's problems) added without changing the spaces
    """

    metadata = {"render_modes": []}

    def __init__(self, cfg: ExperimentConfig, search: SearchConfig | None = None) -> None:
        cfg.check()
        self.cfg, self.search_cfg = cfg, search or SearchConfig()
        self.k = self.search_cfg.shortlist
        self.action_space = gym.spaces.Discrete(self.k + 1)
        self.observation_space = gym.spaces.Box(-5.0, 5.0, ((self.k + 1) * N_FEATURES,), np.float32)
        self.presets = [p for f in cfg.families for p in FAMILIES[f]]
        self._mask = np.zeros(self.k + 1, dtype=bool)
        self.work = cfg.job()

    def _obs(self) -> np.ndarray:
        short, f = self.search.observe()
        o = np.zeros((self.k + 1, N_FEATURES), np.float32)
        o[: len(short)] = f[:-1]
        o[-1] = f[-1]
        self._mask[:] = False
        self._mask[: len(short)] = True
        self._mask[-1] = True
        self._n = len(short)
        return o.ravel()

    def action_masks(self) -> np.ndarray:
        return self._mask.copy()

    def quality(self) -> float:
        return self.oracle.score(self.space_decision()).fraction

    def space_decision(self):
        t = self.search.table
        return self.search.space.decision(t.knob, t.rows)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        rng = self.np_random
        preset = self.presets[int(rng.integers(len(self.presets)))]
        plat = draw_platform(preset, rng, bool(rng.random() < self.cfg.misspecified))
        if self.work is not None:  # the job's problem on this platform: one of its collectives
            calls = calls_by_size(self.work, plat.topo.nodes, plat.topo.nranks)
            names = sorted(calls, key=N.COLLECTIVES.index)
            name = names[int(rng.integers(len(names)))]
            coll = N.COLLECTIVES.index(name)
            problem = Problem(plat.topo, [coll], {coll: sorted(calls[name])},
                              weights={(coll, b): n for b, n in calls[name].items()})
        else:
            coll = N.COLLECTIVES.index(self.cfg.collectives[int(rng.integers(len(self.cfg.collectives)))])
            problem = Problem.make(plat.topo, [coll])
        budget = int(math.exp(rng.uniform(math.log(self.cfg.min_budget), math.log(self.cfg.max_budget))))
        self.oracle = Oracle(problem, plat)
        # the strategy picks points: its budgets are drawn in points (a GPU-time that never binds first)
        n = max(budget, problem.n_cells + 1)
        self.ev = Evaluator(problem, platform_measure(plat, rng), 1e12, max_points=n)
        self.search = Search(problem, self.ev, None, self.search_cfg)
        self.search.start()
        self.q = self.quality()
        self.info = {"preset": preset, "budget": self.ev.budget, "misspecified": plat.quirks is not None}
        return self._obs(), dict(self.info)

    def step(self, action: int):
        a = int(action)
        stop = a == self.k or a >= self._n
        used = self.ev.points
        rounds = self.search.rounds
        go = self.search.act(len(self.search._shortlist) if stop else a)
        reward = 0.0
        if self.search.rounds != rounds:
            q = self.quality()
            reward = 100.0 * (q - self.q) - self.cfg.cost_pct * (self.ev.points - used)
            self.q = q
        done = not go or not self.search.affords_more()
        if done and self.search.pending:
            used = self.ev.points
            self.search.flush()
            q = self.quality()
            reward += 100.0 * (q - self.q) - self.cfg.cost_pct * (self.ev.points - used)
            self.q = q
        obs = np.zeros(self.observation_space.shape, np.float32) if done else self._obs()
        info = dict(self.info, fraction=self.q, used=self.ev.points, gpu_s=self.ev.gpu_s) if done else {}
        return obs, float(reward), done, False, info


class _Rows(nn.Module):
    """Per-candidate scores (the policy's logits) and a pooled summary for the value head."""

    def __init__(self, rows: int, hidden: int) -> None:
        super().__init__()
        self.rows = rows
        self.body = nn.Sequential(nn.Linear(N_FEATURES, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh())
        self.head = nn.Linear(hidden, 1)
        self.latent_dim_pi = rows
        self.latent_dim_vf = 2 * hidden

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.forward_actor(x), self.forward_critic(x)

    def forward_actor(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x.view(x.shape[0], self.rows, N_FEATURES))
        return self.head(h).squeeze(-1)

    def forward_critic(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x.view(x.shape[0], self.rows, N_FEATURES))
        return torch.cat([h.mean(dim=1), h.max(dim=1).values], dim=-1)


class RowPolicy(MaskableActorCriticPolicy):
    """MaskablePPO's policy with :class:`_Rows` in place of the MLP extractor and no action layer."""

    def __init__(self, *args, hidden: int = 64, **kwargs) -> None:
        self._hidden = hidden
        super().__init__(*args, **kwargs)

    def _build_mlp_extractor(self) -> None:
        self.mlp_extractor = _Rows(self.action_space.n, self._hidden)

    def _build(self, lr_schedule) -> None:
        super()._build(lr_schedule)
        self.action_net = nn.Identity()
        self.optimizer = self.optimizer_class(self.parameters(), lr=lr_schedule(1), **self.optimizer_kwargs)


def to_controller(model: MaskablePPO, meta: dict[str, Any]) -> PolicyController:
    """The trained network as numpy layers (no torch needed to use it)."""
    rows: _Rows = model.policy.mlp_extractor
    layers = [(lin.weight.detach().cpu().numpy().T.copy(), lin.bias.detach().cpu().numpy().copy())
              for lin in (rows.body[0], rows.body[2], rows.head)]
    return PolicyController(layers, meta)


def train(agent: AgentConfig, experiment: ExperimentConfig, search: SearchConfig | None = None,
          init: PolicyController | None = None, log=print, tensorboard_dir: str | None = None) -> PolicyController:
    """Train a strategy on ``experiment``'s platforms, from scratch or, with ``init``, from its
    weights (the same architecture); returns it (save with :meth:`PolicyController.save`).
    ``tensorboard_dir``: SB3's training curves (episode return and length, losses, entropy) are
    written there as TensorBoard event files (``tensorboard --logdir DIR``)."""
    agent.check()
    experiment.check()
    torch.set_num_threads(1)
    search = search or SearchConfig()

    def make(rank: int):
        def _f():
            env = Monitor(StrategyEnv(experiment, search))  # episode returns and lengths for the training curves
            env.reset(seed=agent.seed * 1000 + rank)
            return env
        return _f

    env = DummyVecEnv([make(i) for i in range(agent.n_envs)])
    hidden = agent.hidden if init is None else int(init.layers[0][0].shape[1])
    model = MaskablePPO(RowPolicy, env, n_steps=agent.n_steps, batch_size=agent.batch_size,
                        learning_rate=agent.learning_rate, ent_coef=agent.ent_coef, gamma=agent.gamma, seed=agent.seed,
                        device="cpu", verbose=0, policy_kwargs={"hidden": hidden}, tensorboard_log=tensorboard_dir)
    if init is not None:
        load_layers(model, init)
    t0 = time.time()
    model.learn(total_timesteps=agent.total_timesteps, tb_log_name="strategy")
    log(f"# trained {agent.total_timesteps} picks in {time.time() - t0:.0f} s")
    meta = {"trained": {"agent": asdict(agent), "experiment": asdict(experiment)}, "search": asdict(search),
            "train_s": round(time.time() - t0, 1)}
    if init is not None:
        meta["init"] = init.meta.get("trained")
    return to_controller(model, meta)


def load_layers(model: MaskablePPO, ctl: PolicyController) -> None:
    """Put ``ctl``'s weights into ``model``'s candidate network (the inverse of :func:`to_controller`)."""
    rows: _Rows = model.policy.mlp_extractor
    if len(ctl.layers) != 3:
        raise ConfigError("strategy", f"expected 3 layers, the strategy has {len(ctl.layers)}")
    with torch.no_grad():
        for lin, (w, b) in zip((rows.body[0], rows.body[2], rows.head), ctl.layers, strict=True):
            if tuple(lin.weight.shape) != w.T.shape:
                raise ConfigError("strategy", f"layer shape {w.T.shape} does not fit {tuple(lin.weight.shape)}")
            lin.weight.copy_(torch.as_tensor(w.T, dtype=lin.weight.dtype))
            lin.bias.copy_(torch.as_tensor(b, dtype=lin.bias.dtype))


if "ncclrl/Strategy-v0" not in gym.registry:
    gym.register(id="ncclrl/Strategy-v0", entry_point="ncclrl.agents.strategy_train:StrategyEnv")

__all__ = ["AgentConfig", "ExperimentConfig", "RowPolicy", "StrategyEnv", "load_layers", "to_controller", "train"]

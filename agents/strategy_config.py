"""What the search strategy is trained on and with: the experiment (platform families, budgets,
a job's profile) and MaskablePPO's settings. Kept apart from :mod:`ncclrl.agents.strategy_train`
so that commands read and check these settings without loading PyTorch."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.platforms import FAMILIES
from ncclrl.costmodel.topology import load_topology
from ncclrl.costmodel.workload import Workload, load_workload


@dataclass
class ExperimentConfig:
    """What the strategy is trained on.

    :param families: platform families to draw from (:data:`ncclrl.costmodel.platforms.FAMILIES`)
    :param misspecified: share of episodes on platforms with effects the simulator lacks
    :param collectives: collectives an episode draws from
    :param min_budget: smallest budget of an episode (points)
    :param max_budget: largest budget of an episode
    :param cost_pct: reward cost of one measured point, in percent of the optimum
    :param profile: a job profile (ncclrl profile): every episode is the job's problem on the drawn
        platform (its sizes of one of its collectives, every call on the platform's whole job), judged
        on the job's communication time per step; ``collectives`` are then the profile's
    """

    families: list[str] = field(default_factory=lambda: list(FAMILIES))
    misspecified: float = 0.5
    collectives: list[str] = field(default_factory=lambda: ["allreduce", "allgather", "reducescatter", "broadcast"])
    min_budget: int = 50
    max_budget: int = 1000
    cost_pct: float = 0.001
    profile: str = ""

    def check(self) -> None:
        for f in self.families:
            if f not in FAMILIES:
                raise ConfigError("experiment.families", f"unknown family {f!r}; allowed: {', '.join(FAMILIES)}")
        if not self.families:
            raise ConfigError("experiment.families", f"need at least one of {', '.join(FAMILIES)}")
        for c in self.collectives:
            N.parse_name("experiment.collectives", c, N.COLLECTIVES)
        if not self.collectives:
            raise ConfigError("experiment.collectives", f"need at least one of {', '.join(N.COLLECTIVES)}")
        if not 0 <= self.misspecified <= 1:
            raise ConfigError("experiment.misspecified", f"must be in [0, 1], got {self.misspecified}")
        if not 1 <= self.min_budget <= self.max_budget:
            raise ConfigError("experiment.min_budget", f"need 1 <= min_budget <= max_budget, got "
                              f"{self.min_budget}, {self.max_budget}")
        if self.cost_pct < 0:
            raise ConfigError("experiment.cost_pct", f"must be >= 0, got {self.cost_pct}")
        if self.profile:
            self.job()

    def job(self) -> Workload | None:
        """The profile's workload (``None`` without one); a problem is one ``ConfigError`` line."""
        if not self.profile:
            return None
        if not Path(self.profile).is_file():
            raise ConfigError("experiment.profile", f"file not found: {self.profile}")
        try:
            return load_workload(self.profile, topology=load_topology(FAMILIES[self.families[0]][0]))
        except ConfigError as e:
            raise ConfigError("experiment.profile", str(e).split(": ", 1)[1] if e.field == "profile"
                              else str(e)) from None


@dataclass
class AgentConfig:
    """MaskablePPO's settings and budget.

    :param total_timesteps: picks to train on
    :param n_envs: episodes stepped together
    :param n_steps: steps per environment between updates
    :param batch_size: minibatch size; must divide n_envs * n_steps
    :param hidden: width of the candidate network's two hidden layers
    :param learning_rate: Adam's learning rate
    :param ent_coef: entropy bonus
    :param gamma: discount per pick
    :param seed: seed of the networks, the platform draws and the measurement noise
    """

    total_timesteps: int = 150_000
    n_envs: int = 4
    n_steps: int = 256
    batch_size: int = 256
    hidden: int = 64
    learning_rate: float = 3e-4
    ent_coef: float = 0.01
    gamma: float = 0.995
    seed: int = 0

    def check(self) -> None:
        for k in ("total_timesteps", "n_envs", "n_steps", "batch_size", "hidden"):
            if getattr(self, k) < 1:
                raise ConfigError(f"agent.{k}", f"must be >= 1, got {getattr(self, k)}")
        if (self.n_envs * self.n_steps) % self.batch_size:
            raise ConfigError("agent.batch_size", f"must divide n_envs * n_steps = {self.n_envs * self.n_steps}")
        if not self.learning_rate > 0:
            raise ConfigError("agent.learning_rate", f"must be > 0, got {self.learning_rate}")
        if not 0 < self.gamma <= 1:
            raise ConfigError("agent.gamma", f"must be in (0, 1], got {self.gamma}")

"""Training the stopping agent with MaskablePPO (sb3-contrib) on :class:`ConfirmStopEnv`."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from ncclrl.agents import mlp
from ncclrl.agents.stopping.env import ConfirmStopEnv
from ncclrl.agents.stopping.policy import PolicyStopper
from ncclrl.agents.stopping.run import TuningProblem
from ncclrl.costmodel.errors import ConfigError


@dataclass(frozen=True)
class StopTrainConfig:
    """:param total_timesteps: agent decisions trained on
    :param n_steps: decisions per environment per update
    :param hidden: units of each of the two tanh layers
    :param tensorboard: folder of the TensorBoard curves ("" none)
    """

    total_timesteps: int = 12_000
    n_envs: int = 4
    n_steps: int = 128
    batch_size: int = 128
    n_epochs: int = 8
    learning_rate: float = 3e-4
    ent_coef: float = 0.01
    hidden: int = 64
    seed: int = 0
    tensorboard: str = ""

    def __post_init__(self) -> None:
        for name in ("total_timesteps", "n_envs", "n_steps", "batch_size", "n_epochs", "hidden"):
            if getattr(self, name) < 1:
                raise ConfigError(f"train.{name}", f"must be >= 1, got {getattr(self, name)}")
        if not (self.learning_rate > 0 and self.ent_coef >= 0):
            raise ConfigError("train.learning_rate", "learning_rate must be > 0 and ent_coef >= 0")


def train(problems: list[TuningProblem], cfg: StopTrainConfig, log=print) -> PolicyStopper:
    """Train an agent on ``problems``; the policy network comes back as numpy."""
    import torch
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.vec_env import DummyVecEnv

    torch.set_num_threads(1)
    envs = [ConfirmStopEnv(problems) for _ in range(cfg.n_envs)]
    vec = DummyVecEnv([(lambda e=e: e) for e in envs])
    model = MaskablePPO("MlpPolicy", vec, n_steps=cfg.n_steps, batch_size=cfg.batch_size, n_epochs=cfg.n_epochs,
                        learning_rate=cfg.learning_rate, ent_coef=cfg.ent_coef, gamma=1.0, gae_lambda=0.95,
                        seed=cfg.seed, verbose=0, tensorboard_log=cfg.tensorboard or None,
                        policy_kwargs={"net_arch": {"pi": [cfg.hidden, cfg.hidden], "vf": [cfg.hidden, cfg.hidden]},
                                       "activation_fn": torch.nn.Tanh})
    t0 = time.time()

    class Track(BaseCallback):
        episodes = 0

        def _on_step(self) -> bool:
            for done, info in zip(self.locals["dones"], self.locals["infos"], strict=True):
                if done and "net_value" in info:
                    Track.episodes += 1
                    self.logger.record_mean("stop/net_value", info["net_value"])
                    if "rule" in info:
                        self.logger.record_mean("stop/vs_rule", info["net_value"] - info["rule"])
            return True

    model.learn(cfg.total_timesteps, callback=Track(), tb_log_name=f"stop-seed{cfg.seed}")
    layers = mlp.policy_layers(model)
    log(f"# trained {cfg.total_timesteps} decisions ({Track.episodes} episodes) in {time.time() - t0:.0f} s")
    return PolicyStopper(layers, {"train": asdict(cfg), "problems": len(problems), "episodes": Track.episodes,
                                  "train_s": round(time.time() - t0, 1)})

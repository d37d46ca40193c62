"""Pretraining a MaskablePPO policy in simulation, with domain randomization over platforms."""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path

import numpy as np
from sb3_contrib import MaskablePPO
from stable_baselines3.common.callbacks import BaseCallback, CallbackList, CheckpointCallback
from stable_baselines3.common.vec_env import DummyVecEnv

from ncclrl.costmodel.errors import ConfigError
from ncclrl.envs import spaces as S
from ncclrl.envs.nccl_env import NcclTuneEnv
from ncclrl.envs.sim import SimBackend


@dataclass
class AgentConfig:
    """MaskablePPO settings. Each episode is one decision, so ``gamma`` is irrelevant (0).

    :param total_timesteps: decisions to train on (the main job's budget: a few minutes on 2 cores)
    :param n_envs: simulated environments stepped together
    :param n_steps: steps per environment between updates
    :param batch_size: minibatch size; must divide n_envs * n_steps
    :param n_epochs: passes over each rollout
    :param learning_rate: Adam's learning rate
    :param ent_coef: entropy bonus
    :param net_arch: hidden layer widths of the policy and value networks
    :param seed: seed of the networks, the platform draws and the simulated noise
    :param device: torch device (cpu is fastest for these small networks)
    :param checkpoint_every: save the policy every this many steps (run folder's checkpoints/)
    """

    total_timesteps: int = 200_000
    n_envs: int = 8
    n_steps: int = 256
    batch_size: int = 512
    n_epochs: int = 4
    learning_rate: float = 1e-3
    ent_coef: float = 0.01
    net_arch: list[int] = field(default_factory=lambda: [256, 256])
    seed: int = 0
    device: str = "cpu"
    checkpoint_every: int = 50_000

    def check(self) -> None:
        if self.total_timesteps < 1:
            raise ConfigError("agent.total_timesteps", f"must be >= 1, got {self.total_timesteps}")
        if self.n_envs < 1 or self.n_steps < 1:
            raise ConfigError("agent.n_envs", "n_envs and n_steps must be >= 1")
        if (self.n_envs * self.n_steps) % self.batch_size:
            raise ConfigError("agent.batch_size", f"must divide n_envs * n_steps = {self.n_envs * self.n_steps}, "
                              f"got {self.batch_size}; e.g. {self.n_envs * self.n_steps // 2}")


class TuningMetrics(BaseCallback):
    """TensorBoard scalars: reward, speedup over NCCL's default, regret against the exhaustive
    optimum (simulator), invalid-action rate (must stay 0)."""

    def __init__(self) -> None:
        super().__init__()
        self._r: list[float] = []
        self._regret: list[float] = []
        self._invalid = 0
        self._n = 0

    def _on_step(self) -> bool:
        for r, info in zip(self.locals["rewards"], self.locals["infos"], strict=True):
            self._n += 1
            self._invalid += int(info.get("invalid_action", False))
            self._r.append(float(r))
            if "regret" in info:
                self._regret.append(info["regret"])
        return True

    def _on_rollout_end(self) -> None:
        if not self._r:
            return
        r = np.array(self._r)
        self.logger.record("tuning/reward_mean", float(r.mean()))
        self.logger.record("tuning/speedup_geomean", float(np.exp(r.mean())))
        if self._regret:
            self.logger.record("tuning/regret_mean", float(np.mean(self._regret)))
            self.logger.record("tuning/fraction_of_optimum", float(np.exp(-np.mean(self._regret))))
        self.logger.record("tuning/invalid_action_rate", self._invalid / max(self._n, 1))
        self._r.clear()
        self._regret.clear()


def make_vec_env(topologies: list[str], cfg: AgentConfig, randomize: float, randomize_scale: float,
                 noise: bool, collectives: list[str] | None, min_bytes: int, max_bytes: int) -> DummyVecEnv:
    def factory(rank: int):
        def _make():
            backends = [SimBackend(t, noise=noise, seed=cfg.seed * 1000 + rank) for t in topologies]
            env = NcclTuneEnv(backends=backends, collectives=collectives, min_bytes=min_bytes, max_bytes=max_bytes,
                              randomize=randomize, randomize_scale=randomize_scale, with_optimum=True)
            env.reset(seed=cfg.seed * 1000 + rank)
            return env
        return _make

    return DummyVecEnv([factory(i) for i in range(cfg.n_envs)])


def pretrain(topologies: list[str], cfg: AgentConfig, run_dir: Path, randomize: float = 0.5,
             randomize_scale: float = 1.0, noise: bool = True, collectives: list[str] | None = None,
             min_bytes: int = 8, max_bytes: int = 1 << 30, progress_bar: bool = True) -> MaskablePPO:
    """Train MaskablePPO on simulated platforms drawn around ``topologies``; save under ``run_dir``."""
    cfg.check()
    run_dir.mkdir(parents=True, exist_ok=True)
    venv = make_vec_env(topologies, cfg, randomize, randomize_scale, noise, collectives, min_bytes, max_bytes)
    model = MaskablePPO("MlpPolicy", venv, n_steps=cfg.n_steps, batch_size=cfg.batch_size, n_epochs=cfg.n_epochs,
                        learning_rate=cfg.learning_rate, gamma=0.0, gae_lambda=1.0, ent_coef=cfg.ent_coef,
                        policy_kwargs={"net_arch": list(cfg.net_arch)}, seed=cfg.seed, device=cfg.device,
                        tensorboard_log=str(run_dir / "tb"), verbose=0)
    callbacks = CallbackList([
        TuningMetrics(),
        CheckpointCallback(save_freq=max(cfg.checkpoint_every // cfg.n_envs, 1), save_path=str(run_dir / "checkpoints"),
                           name_prefix="policy"),
    ])
    model.learn(total_timesteps=cfg.total_timesteps, callback=callbacks, progress_bar=progress_bar,
                tb_log_name="pretrain")
    save_policy(model, run_dir / "policy.zip")
    return model


def save_policy(model: MaskablePPO, path: Path) -> None:
    model.save(str(path))


# the policy shipped with ncclrl (package data), pretrained by `ncclrl pretrain` with its defaults
PRETRAINED = Path(str(files("ncclrl.agents"))) / "pretrained" / "policy.zip"


def checkpoint_path(name: str | Path | None) -> Path:
    """``pretrained`` (or nothing) is the policy shipped with ncclrl; anything else a path to a ``policy.zip``."""
    return PRETRAINED if name in (None, "", "pretrained") else Path(name)


def load_policy(path: str | Path) -> MaskablePPO:
    """Load a checkpoint (``pretrained``: the one shipped with ncclrl) and check it matches this
    version's observation/action layout."""
    p = checkpoint_path(path)
    if not p.exists():
        raise ConfigError("checkpoint", f"file not found: {p}")
    try:
        model = MaskablePPO.load(str(p), device="cpu")
    except Exception as e:  # zip/pickle errors of a file that is not a policy
        raise ConfigError("checkpoint", f"{p} is not a MaskablePPO checkpoint ({type(e).__name__})") from None
    obs_shape = model.observation_space.shape
    if obs_shape != (S.OBS_DIM,) or getattr(model.action_space, "n", None) != S.N_ACTIONS:
        raise ConfigError("checkpoint", f"{p} has observation shape {obs_shape} and "
                          f"{getattr(model.action_space, 'n', '?')} actions; this ncclrl expects ({S.OBS_DIM},) and "
                          f"{S.N_ACTIONS} (observation layout v{S.OBS_VERSION}): retrain with `ncclrl pretrain`")
    return model


def policy_scores(model: MaskablePPO, obs: np.ndarray, masks: np.ndarray) -> np.ndarray:
    """Masked action log-probabilities of a batch of observations, shape ``(n, N_ACTIONS)``."""
    import torch

    with torch.no_grad():
        t = torch.as_tensor(obs, dtype=torch.float32)
        dist = model.policy.get_distribution(t)
        logits = dist.distribution.logits.cpu().numpy()
    return np.where(masks, logits, -np.inf)

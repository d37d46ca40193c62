"""Gymnasium environments of ncclrl. Importing this package registers them."""

from gymnasium.envs.registration import register

from ncclrl.envs.backend import Backend
from ncclrl.envs.nccl_env import NcclTuneEnv
from ncclrl.envs.sim import SimBackend

register(id="ncclrl/NcclTune-v0", entry_point="ncclrl.envs.nccl_env:NcclTuneEnv")

__all__ = ["Backend", "NcclTuneEnv", "SimBackend"]

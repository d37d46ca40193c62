"""Gymnasium environments of ncclrl. Importing this package registers them."""

from gymnasium.envs.registration import register

from ncclrl.envs.backend import Backend, SimBackend
from ncclrl.envs.nccl_env import NcclTuneEnv

register(id="ncclrl/NcclTune-v0", entry_point="ncclrl.envs.nccl_env:NcclTuneEnv")

__all__ = ["Backend", "NcclTuneEnv", "SimBackend"]

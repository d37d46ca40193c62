"""ncclrl's model of NCCL: topologies, a replica of NCCL's default decision, and a simulator."""

from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.replica import Decisions, build_model, cost_table, default_decisions
from ncclrl.costmodel.simulator import Configs, SimParams, Simulator
from ncclrl.costmodel.topology import Topology, load_topology, preset_names

__all__ = [
    "ConfigError",
    "Configs",
    "Decisions",
    "SimParams",
    "Simulator",
    "Topology",
    "build_model",
    "cost_table",
    "default_decisions",
    "load_topology",
    "preset_names",
]

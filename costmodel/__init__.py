"""ncclrl's model of NCCL: topologies, a replica of NCCL's default decision, and a simulator."""

from costmodel.errors import ConfigError
from costmodel.replica import Decisions, build_model, cost_table, default_decisions
from costmodel.simulator import Configs, SimParams, Simulator
from costmodel.topology import Topology, load_topology, preset_names

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

"""Typed platform descriptions and their YAML presets (``conf/topologies/*.yaml``).

A :class:`Topology` says what NCCL sees of a cluster: GPUs, nodes, the intra-node fabric, the
inter-node network, the CPU, the NCCL version, and what NCCL's topology search settled on
(channels per communicator, per-channel bandwidths). It also carries the raw ``sim`` block that
:class:`ncclrl.costmodel.simulator.SimParams` reads.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from importlib.resources import files
from pathlib import Path
from typing import Any

import yaml

from ncclrl.costmodel.errors import ConfigError, choice

GPU_ARCHS = ("volta", "ampere", "hopper", "blackwell")
FABRICS = ("nvswitch", "nvlink", "pcie")
NETWORKS = ("none", "ib", "roce", "socket")
CPU_VENDORS = ("intel", "amd", "arm", "mixed")
TREE_PATTERNS = ("balanced", "split", "tree")

# the presets ship as package data (ncclrl/conf/topologies/*.yaml)
TOPOLOGY_DIR = Path(str(files("ncclrl.conf"))) / "topologies"


@dataclass(frozen=True)
class IntraFabric:
    """The fabric inside a node.

    :param fabric: ``nvswitch`` (NVLink through NVSwitch), ``nvlink`` (point-to-point NVLink) or ``pcie``
    :param links_per_gpu: NVLinks per GPU (0 for PCIe)
    :param link_bw_gbps: bandwidth of one link as NCCL's topology search counts it, GB/s
    :param channel_bw_gbps: per-channel bandwidth NCCL's ring search assigned (``bwIntra``), GB/s
    :param bus_bw_gbps: what one GPU can push through the fabric in a ring (the fabric's ceiling), GB/s
    """

    fabric: str = "nvswitch"
    links_per_gpu: int = 18
    link_bw_gbps: float = 20.6
    channel_bw_gbps: float = 15.0
    bus_bw_gbps: float = 0.0

    @property
    def ceiling_gbps(self) -> float:
        if self.bus_bw_gbps > 0:
            return self.bus_bw_gbps
        if self.fabric == "pcie":
            return 24.0
        return self.links_per_gpu * self.link_bw_gbps


@dataclass(frozen=True)
class Network:
    """The network between nodes.

    :param kind: ``none`` (one node), ``ib`` (InfiniBand), ``roce`` or ``socket`` (TCP sockets)
    :param nics_per_node: NICs NCCL uses per node
    :param nic_bw_gbps: bandwidth of one NIC, GB/s (400 Gb/s = 50 GB/s)
    :param nic_latency_us: one-way latency of one message through a NIC, us
    :param channel_bw_gbps: per-channel inter-node bandwidth NCCL's search assigned (``bwInter``), GB/s
    :param latency_us: extra graph latency NCCL adds per inter-node hop (``latencyInter``), us
    """

    kind: str = "none"
    nics_per_node: int = 0
    nic_bw_gbps: float = 0.0
    nic_latency_us: float = 0.0
    channel_bw_gbps: float = 0.0
    latency_us: float = 0.0


@dataclass(frozen=True)
class NcclSettings:
    """What NCCL settled on for a communicator on this platform, and its per-process defaults.

    :param version: NCCL version string, e.g. ``2.28.9``
    :param channels: collective channels of a communicator (NCCL INFO "24 coll channels")
    :param tree_pattern: the tree graph's pattern (``balanced``, ``split`` or plain ``tree``)
    :param ring_same_channels: the ring graph's ``sameChannels`` (Broadcast/Reduce latency)
    :param nvls: NVLink SHARP (NVLS) usable by NCCL on this platform
    :param collnet: a CollNet (in-network reduction) network is present
    :param socket_nthreads: ``NCCL_SOCKET_NTHREADS`` default on this platform
    :param nsocks_perthread: ``NCCL_NSOCKS_PERTHREAD`` default on this platform
    :param nvls_channels: channels NVLS uses when enabled
    """

    version: str = "2.28.9"
    channels: int = 24
    tree_pattern: str = "balanced"
    ring_same_channels: bool = True
    nvls: bool = False
    collnet: bool = False
    socket_nthreads: int = 1
    nsocks_perthread: int = 1
    nvls_channels: int = 16


@dataclass(frozen=True)
class Topology:
    """A platform as NCCL sees it."""

    name: str
    gpu_arch: str
    gpu_model: str
    nodes: int
    gpus_per_node: int
    intra: IntraFabric = field(default_factory=IntraFabric)
    net: Network = field(default_factory=Network)
    cpu_vendor: str = "intel"
    cpu_arch: str = "x86"
    nccl: NcclSettings = field(default_factory=NcclSettings)
    description: str = field(default="", compare=False)
    # The simulator's parameters; not part of what NCCL sees, so not part of equality/hash.
    sim: dict[str, Any] = field(default_factory=dict, compare=False)

    # -- derived --------------------------------------------------------------------------
    @property
    def nranks(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def ppn(self) -> int:
        return self.gpus_per_node

    @property
    def compcap_row(self) -> int:
        return GPU_ARCHS.index(self.gpu_arch)

    @property
    def nodes_index(self) -> int:
        """Column of NCCL's per-node-count constant tables: 1 node, 2 nodes, more."""
        return min(self.nodes, 3) - 1

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        return d

    def with_sim(self, sim: dict[str, Any], name: str | None = None) -> Topology:
        return replace(self, sim=sim, name=name or self.name)

    def with_nccl(self, **changes: Any) -> Topology:
        """The platform with NCCL settings changed (``version=``, ``channels=``, ...); itself if none change."""
        if all(getattr(self.nccl, k) == v for k, v in changes.items()):
            return self
        return replace(self, nccl=replace(self.nccl, **changes))

    def shape(self, nodes: int, nranks: int) -> Topology:
        """The platform as a communicator of ``nranks`` ranks spread evenly over ``nodes`` of this
        job's nodes sees it (a tensor-parallel group inside a node, a data-parallel group of one
        rank per node): the same GPUs, fabric, network, NCCL settings and simulator parameters,
        ``nodes`` nodes of ``nranks / nodes`` GPUs. The job's own shape returns the job itself;
        any other is named ``<job>@<nodes>x<ranks per node>``.

        :param nodes: nodes the communicator spans, 1 .. the job's nodes
        :param nranks: ranks of the communicator, a multiple of ``nodes`` with at most
            ``gpus_per_node`` ranks per node
        """
        where = f"shape [{nodes}, {nranks}]"
        for key, v in (("nodes", nodes), ("nranks", nranks)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(where, f"{key} must be a whole number >= 1, got {v!r}")
        if nodes > self.nodes:
            raise ConfigError(where, f"spans {nodes} nodes; {self.name} has {self.nodes}")
        if nranks < nodes:
            raise ConfigError(where, f"{nranks} ranks cannot span {nodes} nodes (nranks counts every rank: one "
                              f"rank on each of {nodes} nodes is [{nodes}, {nodes}])")
        if nranks % nodes:
            raise ConfigError(where, f"{nranks} ranks do not divide evenly over {nodes} nodes")
        if nranks // nodes > self.gpus_per_node:
            raise ConfigError(where, f"{nranks // nodes} ranks per node; {self.name} has {self.gpus_per_node} GPUs "
                              "per node")
        if (nodes, nranks) == (self.nodes, self.nranks):
            return self
        return replace(self, nodes=nodes, gpus_per_node=nranks // nodes,
                       name=f"{self.name}@{nodes}x{nranks // nodes}")


# -- loading and validation ----------------------------------------------------------------


def _num(d: dict, key: str, where: str, typ: type = float, minimum: float | None = 0.0,
         default: Any = None) -> Any:
    if key not in d:
        if default is None:
            raise ConfigError(f"{where}.{key}", "missing (required)")
        return default
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ConfigError(f"{where}.{key}", f"must be a number, got {v!r}")
    if typ is int and (not float(v).is_integer()):
        raise ConfigError(f"{where}.{key}", f"must be a whole number, got {v!r}")
    if not math.isfinite(float(v)):
        raise ConfigError(f"{where}.{key}", f"must be finite, got {v!r}")
    if minimum is not None and v < minimum:
        raise ConfigError(f"{where}.{key}", f"must be >= {minimum}, got {v!r}")
    return typ(v)


def _section(d: dict, key: str) -> dict:
    v = d.get(key, {})
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise ConfigError(key, f"must be a mapping, got {type(v).__name__}")
    return v


def _check_keys(d: dict, allowed: tuple[str, ...], where: str) -> None:
    for k in d:
        if k not in allowed:
            raise ConfigError(f"{where}.{k}" if where else str(k),
                              f"unknown field; allowed: {', '.join(allowed)}")


def topology_from_dict(d: dict[str, Any], name: str | None = None) -> Topology:
    """Build and validate a :class:`Topology` from a parsed YAML mapping."""
    if not isinstance(d, dict):
        raise ConfigError("topology", f"must be a mapping, got {type(d).__name__}")
    _check_keys(d, ("name", "description", "gpu", "nodes", "gpus_per_node", "cpu", "intra", "net",
                    "nccl", "sim", "nccl_version"), "")
    gpu = _section(d, "gpu")
    _check_keys(gpu, ("arch", "model"), "gpu")
    arch = choice("gpu.arch", gpu.get("arch", "hopper"), GPU_ARCHS)
    nodes = _num(d, "nodes", "topology", int, 1)
    gpn = _num(d, "gpus_per_node", "topology", int, 1)
    cpu = _section(d, "cpu")
    _check_keys(cpu, ("vendor", "arch"), "cpu")
    vendor = choice("cpu.vendor", cpu.get("vendor", "intel"), CPU_VENDORS)
    cpu_arch = choice("cpu.arch", cpu.get("arch", "x86"), ("x86", "arm", "power"))

    it = _section(d, "intra")
    _check_keys(it, ("fabric", "links_per_gpu", "link_bw_gbps", "channel_bw_gbps", "bus_bw_gbps"), "intra")
    fabric = choice("intra.fabric", it.get("fabric", "nvswitch"), FABRICS)
    intra = IntraFabric(
        fabric=fabric,
        links_per_gpu=_num(it, "links_per_gpu", "intra", int, 0, 0 if fabric == "pcie" else 18),
        link_bw_gbps=_num(it, "link_bw_gbps", "intra", float, 0, 20.6),
        channel_bw_gbps=_num(it, "channel_bw_gbps", "intra", float, 0.001),
        bus_bw_gbps=_num(it, "bus_bw_gbps", "intra", float, 0, 0.0),
    )

    nt = _section(d, "net")
    _check_keys(nt, ("kind", "nics_per_node", "nic_bw_gbps", "nic_latency_us", "channel_bw_gbps",
                     "latency_us"), "net")
    kind = choice("net.kind", nt.get("kind", "none"), NETWORKS)
    net = Network(
        kind=kind,
        nics_per_node=_num(nt, "nics_per_node", "net", int, 0, 0),
        nic_bw_gbps=_num(nt, "nic_bw_gbps", "net", float, 0, 0.0),
        nic_latency_us=_num(nt, "nic_latency_us", "net", float, 0, 0.0),
        channel_bw_gbps=_num(nt, "channel_bw_gbps", "net", float, 0, 0.0),
        latency_us=_num(nt, "latency_us", "net", float, 0, 0.0),
    )
    if nodes > 1:
        if kind == "none":
            raise ConfigError("net.kind", f"a topology of {nodes} nodes needs a network; "
                              f"allowed: {', '.join(NETWORKS[1:])}")
        for key in ("nics_per_node", "nic_bw_gbps", "channel_bw_gbps"):
            if getattr(net, key) <= 0:
                raise ConfigError(f"net.{key}", f"must be > 0 on a topology of {nodes} nodes")

    nc = _section(d, "nccl")
    _check_keys(nc, ("version", "channels", "tree_pattern", "ring_same_channels", "nvls", "collnet",
                     "socket_nthreads", "nsocks_perthread", "nvls_channels"), "nccl")
    version = str(nc.get("version", d.get("nccl_version", "2.28.9")))
    parts = version.split(".")
    if len(parts) < 2 or not all(p.isdigit() for p in parts):
        raise ConfigError("nccl.version", f"must look like 2.28.9, got {version!r}")
    nvls = nc.get("nvls", False)
    collnet = nc.get("collnet", False)
    for key, v in (("nvls", nvls), ("collnet", collnet), ("ring_same_channels",
                                                           nc.get("ring_same_channels", True))):
        if not isinstance(v, bool):
            raise ConfigError(f"nccl.{key}", f"must be true or false, got {v!r}")
    nccl = NcclSettings(
        version=version,
        channels=_num(nc, "channels", "nccl", int, 1, 24),
        tree_pattern=choice("nccl.tree_pattern", nc.get("tree_pattern", "balanced"), TREE_PATTERNS),
        ring_same_channels=bool(nc.get("ring_same_channels", True)),
        nvls=nvls,
        collnet=collnet,
        socket_nthreads=_num(nc, "socket_nthreads", "nccl", int, 1, 1),
        nsocks_perthread=_num(nc, "nsocks_perthread", "nccl", int, 1, 1),
        nvls_channels=_num(nc, "nvls_channels", "nccl", int, 1, 16),
    )
    if nccl.channels > 64:
        raise ConfigError("nccl.channels", f"must be <= 64 (NCCL's MAXCHANNELS), got {nccl.channels}")
    if nvls and arch not in ("hopper", "blackwell"):
        raise ConfigError("nccl.nvls", f"NVLS needs hopper or blackwell GPUs, not {arch}")
    if nvls and fabric != "nvswitch":
        raise ConfigError("nccl.nvls", f"NVLS needs an nvswitch fabric, not {fabric}")
    sim = d.get("sim", {}) or {}
    if not isinstance(sim, dict):
        raise ConfigError("sim", f"must be a mapping, got {type(sim).__name__}")
    tname = str(d.get("name", name or "unnamed"))
    return Topology(name=tname, gpu_arch=arch, gpu_model=str(gpu.get("model", arch)), nodes=nodes,
                    gpus_per_node=gpn, intra=intra, net=net, cpu_vendor=vendor, cpu_arch=cpu_arch,
                    nccl=nccl, description=str(d.get("description", "")), sim=dict(sim))


def preset_names() -> list[str]:
    return sorted(p.stem for p in TOPOLOGY_DIR.glob("*.yaml"))


def load_topology(name_or_path: str | Path | Topology) -> Topology:
    """A preset name from ``ncclrl/conf/topologies/`` or a path to a YAML file (e.g. a calibrated preset)."""
    if isinstance(name_or_path, Topology):
        return name_or_path
    s = str(name_or_path)
    path = Path(s)
    if not (s.endswith((".yaml", ".yml")) or path.exists()):
        path = TOPOLOGY_DIR / f"{s}.yaml"
        if not path.exists():
            raise ConfigError("topology", f"unknown preset {s!r}; allowed: {', '.join(preset_names())} "
                              "or a path to a .yaml file")
    if not path.exists():
        raise ConfigError("topology", f"file not found: {s}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise ConfigError("topology", f"malformed YAML in {path}{where}") from None
    if data is None:
        raise ConfigError("topology", f"empty YAML file {path}")
    return topology_from_dict(data, name=path.stem)


def dump_topology(topo: Topology, path: str | Path) -> None:
    """Write ``topo`` as YAML in the same schema :func:`load_topology` reads."""
    d = {
        "name": topo.name,
        "description": topo.description,
        "gpu": {"arch": topo.gpu_arch, "model": topo.gpu_model},
        "nodes": topo.nodes,
        "gpus_per_node": topo.gpus_per_node,
        "cpu": {"vendor": topo.cpu_vendor, "arch": topo.cpu_arch},
        "intra": asdict(topo.intra),
        "net": asdict(topo.net),
        "nccl": asdict(topo.nccl),
        "sim": topo.sim,
    }
    Path(path).write_text(yaml.safe_dump(d, sort_keys=False))

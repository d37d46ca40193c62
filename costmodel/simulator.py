"""The simulator: the time of ANY NCCL configuration on a topology, the ground truth of the
simulated environment.

It follows NCCL's structure (the same hop counts per algorithm, the same per-call channel choice
and the same spreading of work over channels as :mod:`ncclrl.costmodel.replica`) but replaces NCCL's
constants by parameters of the platform, and adds the effects NCCL's own model leaves out:

* a fixed launch cost per call and an overhead per extra channel (CTA);
* per-channel bandwidth per (algorithm, protocol) -- protocol efficiency -- and a fabric ceiling
  that channels share, combined by a soft minimum (contention: ``(x^-q + y^-q)^(-1/q)``);
* pipelining by chunk size: a pipeline fill of ``fill_steps`` chunks, and an overhead per loop
  of chunks (so a larger ``NCCL_BUFFSIZE`` costs fill and a smaller one costs loops);
* inter-node networks with per-flow ceilings: on TCP sockets the flows are
  channels x ``NCCL_SOCKET_NTHREADS`` x ``NCCL_NSOCKS_PERTHREAD``, each flow capped, each helper
  thread capped, the node's NICs capped;
* seeded multiplicative noise whose size grows as the message shrinks (latency-bound calls are
  noisy), with rare slow outliers;
* interference with compute that runs at the same time (:meth:`Simulator.interference`): NCCL
  runs one CTA per channel, each on an SM the compute kernels then lack, and moves HBM traffic the
  compute competes for, so overlapped compute slows down as the channels rise; the compute in turn
  slows NCCL (bus bandwidth down, latency up, in proportion to the load). With no load
  (:meth:`Simulator.time_us` without ``load``, or a load of 0) every time is exactly the isolated one.

Every parameter is named with its unit; :data:`PARAM_DOC` documents them and
:data:`RANDOMIZATION` gives the bounds used for domain randomization.
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.replica import (
    auto_channels,
    build_model,
    check_algo_allowed,
    chunk_bytes,
    default_decisions,
    eligible_mask,
    scheduled_channels,
)
from ncclrl.costmodel.topology import Topology, load_topology

# CTA copy rate of one channel with the Simple protocol, GB/s (Hopper measured ~24.5 on H200).
_SIMPLE_CH_BW = {"volta": 10.0, "ampere": 18.0, "hopper": 24.0, "blackwell": 36.0}
# Relative per-channel rate of each protocol and of Tree against Ring (H200 measurements).
_PROTO_CH_FRAC = np.array([0.26, 0.78, 1.0])
_TREE_CH_FRAC = np.array([0.87, 0.77, 0.83])
_PROTO_CAP_FRAC = np.array([0.5, 0.93, 0.98])

# Published per-GPU figures: SMs and peak HBM bandwidth (GB/s) of each model's SXM part (V100 SXM2
# 80 / 900, A100 80GB 108 / 2039, A40 84 / 696, H100 SXM 132 / 3350, H200 132 / 4800, B200 148 /
# 8000); a model not listed takes its architecture's flagship.
GPU_SPECS: dict[str, tuple[float, float]] = {
    "V100": (80.0, 900.0), "A100": (108.0, 2039.0), "A40": (84.0, 696.0), "H100": (132.0, 3350.0),
    "H200": (132.0, 4800.0), "B200": (148.0, 8000.0),
}
_ARCH_GPU = {"volta": "V100", "ampere": "A100", "hopper": "H100", "blackwell": "B200"}
# HBM bytes per byte of payload per protocol: LL carries a 4-byte flag with every 4 bytes of data,
# LL128 8 bytes of flags per 128-byte line, Simple none.
_PROTO_LINE_FACTOR = np.array([2.0, 128.0 / 120.0, 1.0])


def gpu_specs(topo: Topology) -> tuple[float, float]:
    """(SMs, peak HBM GB/s) of the topology's GPU model (its architecture's flagship if unknown)."""
    model = topo.gpu_model.upper()
    for name, spec in GPU_SPECS.items():
        if name in model:
            return spec
    return GPU_SPECS[_ARCH_GPU[topo.gpu_arch]]

PARAM_DOC: dict[str, str] = {
    "launch_us": "host cost of one call (enqueue + kernel launch), us; back-to-back calls overlap it "
                 "with the previous call's device time",
    "overlap_exp": "how fully host and device time overlap: t = (host^r + device^r)^(1/r); 1 = none",
    "channel_us": "extra cost per channel beyond the first (CTA launch and sync), us",
    "base_us": "[algo][proto] fixed algorithm/protocol latency, us",
    "hop_us": "[algo][proto] latency of one intra-node step, us",
    "net_hop_us": "[proto] latency of one inter-node step, us (adds the NIC latency)",
    "channel_bw_gbps": "[algo][proto] bus bandwidth one channel reaches alone, GB/s",
    "cap_gbps": "[algo][proto] intra-node ceiling all channels share, GB/s of bus bandwidth",
    "contention_exp": "sharpness q of the soft minimum between channels' sum and the ceiling",
    "fill_steps": "[algo] chunks of pipeline fill before the bandwidth term applies",
    "loop_us": "[proto] overhead per loop of chunks on a channel, us",
    "flow_bw_gbps": "bandwidth of one network flow (socket or QP), GB/s",
    "thread_bw_gbps": "bandwidth one socket helper thread can drive (sockets only), GB/s",
    "net_eff": "[proto] fraction of the network's bandwidth a protocol's payload gets (LL sends flags too)",
    "net_flows": "[algo] concurrent network flows per channel (Tree sends up and down at once)",
    "noise_small": "lognormal sigma of a latency-bound call",
    "noise_large": "lognormal sigma of a bandwidth-bound call",
    "outlier_prob": "probability of a slow outlier",
    "outlier_scale": "an outlier is up to this fraction slower",
    "sock_send_us": "sockets: extra latency of an inter-node step whose data does not ride inline with the "
                    "control message (larger than NCCL_SOCKET_INLINE), us",
    "sock_thread_us": "sockets: the same when helper threads carry the data (NCCL_SOCKET_NTHREADS), us",
    "gpu_sms": "streaming multiprocessors (SMs) per GPU, count (published per model; not randomized)",
    "sms_per_channel": "SMs one channel keeps from concurrent compute while a call runs, SMs (NCCL runs one "
                       "CTA per channel; below 1 when compute blocks still fit beside it)",
    "hbm_gbps": "HBM bandwidth per GPU that NCCL and compute share, GB/s",
    "hbm_bytes_per_bus_byte": "[proto] HBM bytes NCCL moves per byte of bus traffic (read the source, write "
                              "the peer's buffer, read it to reduce; LL/LL128 flags), bytes/byte",
    "load_bw_loss": "fraction of NCCL's bus bandwidth lost while compute runs for the whole call "
                    "(SM scheduling, HBM and L2 contention), 0-1",
    "load_lat_frac": "fractional rise of a call's latency (fixed, hop and per-channel terms) while compute "
                     "runs for the whole call (CTAs wait for SMs the compute holds), 0-",
}

# (low, high) multiplicative bounds for domain randomization (absolute for contention_exp).
RANDOMIZATION: dict[str, tuple[float, float]] = {
    "launch_us": (0.6, 1.6),
    "overlap_exp": (0.8, 1.25),
    "channel_us": (0.5, 2.0),
    "base_us": (0.7, 1.4),
    "hop_us": (0.6, 1.7),
    "net_hop_us": (0.6, 1.7),
    "channel_bw_gbps": (0.75, 1.3),
    "cap_gbps": (0.8, 1.2),
    "contention_exp": (3.0, 10.0),
    "fill_steps": (0.5, 2.0),
    "loop_us": (0.5, 2.0),
    "flow_bw_gbps": (0.6, 1.6),
    "thread_bw_gbps": (0.6, 1.6),
    "net_eff": (0.85, 1.05),
    "net_flows": (0.8, 1.25),
    "noise_small": (0.7, 1.4),
    "noise_large": (0.7, 1.4),
    "outlier_prob": (0.5, 2.0),
    "outlier_scale": (0.7, 1.3),
    "sock_send_us": (0.5, 2.0),
    "sock_thread_us": (0.5, 2.0),
    "gpu_sms": (1.0, 1.0),
    "sms_per_channel": (0.6, 1.0),
    "hbm_gbps": (0.75, 1.0),
    "hbm_bytes_per_bus_byte": (0.67, 1.5),
    "load_bw_loss": (0.5, 2.0),
    "load_lat_frac": (0.5, 2.0),
}

#: the interference parameters; :meth:`SimParams.randomized` draws them from a stream of their own
#: (derived from the generator's state without advancing it), so that every other parameter, and
#: whatever the caller draws next, comes out as it did before they existed
INTERFERENCE_PARAMS = ("gpu_sms", "sms_per_channel", "hbm_gbps", "hbm_bytes_per_bus_byte", "load_bw_loss",
                       "load_lat_frac")

TABLE_PARAMS = ("base_us", "hop_us", "channel_bw_gbps", "cap_gbps")
PROTO_PARAMS = ("net_hop_us", "loop_us", "net_eff", "hbm_bytes_per_bus_byte")
ALGO_PARAMS = ("fill_steps", "net_flows")


@dataclass
class SimParams:
    """Parameters of one simulated platform (see :data:`PARAM_DOC` for units)."""

    launch_us: float
    overlap_exp: float
    channel_us: float
    base_us: np.ndarray
    hop_us: np.ndarray
    net_hop_us: np.ndarray
    channel_bw_gbps: np.ndarray
    cap_gbps: np.ndarray
    contention_exp: float
    fill_steps: np.ndarray
    loop_us: np.ndarray
    flow_bw_gbps: float
    thread_bw_gbps: float
    net_eff: np.ndarray
    net_flows: np.ndarray
    noise_small: float
    noise_large: float
    outlier_prob: float
    outlier_scale: float
    sock_send_us: float = 0.0
    sock_thread_us: float = 0.0
    gpu_sms: float = 132.0
    sms_per_channel: float = 1.0
    hbm_gbps: float = 3350.0
    hbm_bytes_per_bus_byte: np.ndarray = field(default_factory=lambda: 3.0 * _PROTO_LINE_FACTOR)
    load_bw_loss: float = 0.15
    load_lat_frac: float = 0.25

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def defaults(cls, topo: Topology) -> SimParams:
        """Plausible parameters derived from the topology alone (before any calibration)."""
        intra_hw = N.HW_NVLINK if topo.intra.fabric in ("nvswitch", "nvlink") else N.HW_PCI
        simple = _SIMPLE_CH_BW[topo.gpu_arch]
        if topo.intra.fabric == "pcie":
            simple = min(simple, 12.0)
        ring = simple * _PROTO_CH_FRAC
        ch = np.tile(ring, (N.NUM_ALGOS, 1))
        ch[N.TREE] = ring * _TREE_CH_FRAC
        ceiling = topo.intra.ceiling_gbps
        cap = np.tile(ceiling * _PROTO_CAP_FRAC, (N.NUM_ALGOS, 1))
        cap[N.TREE] *= 0.7
        kind = topo.net.kind
        nic_lat = topo.net.nic_latency_us
        if kind == "socket":
            flow, thread = 2.0, 3.0
        else:
            flow, thread = max(topo.net.nic_bw_gbps, 1.0), 1e6
        return cls(
            launch_us=8.0,
            overlap_exp=4.0,
            channel_us=0.05,
            base_us=N.BASE_LAT_US.copy(),
            hop_us=N.HW_LAT_US[intra_hw].copy(),
            net_hop_us=N.HW_LAT_US[N.HW_NET, N.RING].copy() + nic_lat,
            channel_bw_gbps=ch,
            cap_gbps=cap,
            contention_exp=5.0,
            fill_steps=np.array([1.0, 0.2, 0.5, 0.5, 0.5, 0.5, 1.0]),
            loop_us=np.array([0.02, 0.1, 0.3]),
            flow_bw_gbps=flow,
            thread_bw_gbps=thread,
            net_eff=np.array([0.5, 0.9, 0.95]),
            net_flows=np.array([1.5, 1.0, 1.0, 1.0, 1.0, 1.5, 1.0]),
            noise_small=0.12,
            noise_large=0.015,
            outlier_prob=0.02,
            outlier_scale=0.5,
            # h200-2x2-sock probe (data/h200x4-2026-11-21/probe-socket-inline.csv): inline 64 KiB
            # saves ~12 us at 512 B-2 KiB; 2 threads x 2
            # sockets cost 1.5-3x at 1-64 KiB
            sock_send_us=3.0 if kind == "socket" else 0.0,
            sock_thread_us=12.0 if kind == "socket" else 0.0,
            gpu_sms=gpu_specs(topo)[0],
            hbm_gbps=gpu_specs(topo)[1],
        )

    @classmethod
    def from_topology(cls, topo: Topology) -> SimParams:
        """Defaults, overridden by the topology's ``sim`` block."""
        p = cls.defaults(topo)
        p.update(topo.sim)
        return p

    def update(self, d: dict[str, Any]) -> None:
        for key, value in d.items():
            if key not in PARAM_DOC:
                raise ConfigError(f"sim.{key}", f"unknown parameter; allowed: {', '.join(PARAM_DOC)}")
            if key in TABLE_PARAMS:
                if not isinstance(value, dict):
                    raise ConfigError(f"sim.{key}", "must map algorithm names to [ll, ll128, simple]")
                arr = getattr(self, key)
                for algo, row in value.items():
                    a = N.parse_name(f"sim.{key}", algo, N.ALGOS)
                    arr[a] = _vector(f"sim.{key}.{algo}", row, N.NUM_PROTOS)
            elif key in PROTO_PARAMS:
                setattr(self, key, _vector(f"sim.{key}", value, N.NUM_PROTOS))
            elif key in ALGO_PARAMS:
                if not isinstance(value, dict):
                    raise ConfigError(f"sim.{key}", "must map algorithm names to a number")
                arr = getattr(self, key)
                for algo, v in value.items():
                    arr[N.parse_name(f"sim.{key}", algo, N.ALGOS)] = _vector(f"sim.{key}.{algo}", [v], 1)[0]
            else:
                setattr(self, key, float(_vector(f"sim.{key}", [value], 1)[0]))

    def to_dict(self) -> dict[str, Any]:
        """The ``sim`` block of a topology YAML (round-trips through :meth:`update`)."""
        out: dict[str, Any] = {}
        for key in PARAM_DOC:
            v = getattr(self, key)
            if key in TABLE_PARAMS:
                out[key] = {N.ALGOS[a]: [round(float(x), 6) for x in v[a]] for a in range(N.NUM_ALGOS)}
            elif key in PROTO_PARAMS:
                out[key] = [round(float(x), 6) for x in v]
            elif key in ALGO_PARAMS:
                out[key] = {N.ALGOS[a]: round(float(v[a]), 6) for a in range(N.NUM_ALGOS)}
            else:
                out[key] = round(float(v), 6)
        return out

    def copy(self) -> SimParams:
        return copy.deepcopy(self)

    def randomized(self, rng: np.random.Generator, scale: float = 1.0) -> SimParams:
        """A platform drawn around this one: every parameter within :data:`RANDOMIZATION`'s
        bounds (log-uniform; ``scale`` in [0, 1] shrinks the bounds)."""
        p = self.copy()
        state = repr(rng.bit_generator.state).encode()
        side = np.random.default_rng(int.from_bytes(hashlib.sha256(state).digest()[:8], "little"))
        for key, (lo, hi) in RANDOMIZATION.items():
            if key == "contention_exp":
                p.contention_exp = float(rng.uniform(self.contention_exp + (lo - self.contention_exp) * scale,
                                                     self.contention_exp + (hi - self.contention_exp) * scale))
                continue
            # interference parameters come from a side stream, so the other draws stay as they were
            g = side if key in INTERFERENCE_PARAMS else rng
            llo, lhi = np.log(lo) * scale, np.log(hi) * scale
            v = getattr(p, key)
            if isinstance(v, np.ndarray):
                setattr(p, key, v * np.exp(g.uniform(llo, lhi, size=v.shape)))
            else:
                setattr(p, key, float(v * np.exp(g.uniform(llo, lhi))))
        # Keep the physical ordering that makes protocols what they are.
        p.cap_gbps = np.maximum(p.cap_gbps, 1e-3)
        p.load_bw_loss = min(p.load_bw_loss, 0.9)
        return p


def _vector(field_name: str, value: Any, n: int) -> np.ndarray:
    arr = np.atleast_1d(np.asarray(value, dtype=object))
    if arr.size != n:
        raise ConfigError(field_name, f"must have {n} value(s), got {arr.size}")
    try:
        out = arr.astype(float)
    except (TypeError, ValueError):
        raise ConfigError(field_name, f"must be numbers, got {value!r}") from None
    if not np.all(np.isfinite(out)) or np.any(out < 0):
        raise ConfigError(field_name, f"must be finite and >= 0, got {value!r}")
    return out


# -- configurations ---------------------------------------------------------------------------


@dataclass
class Configs:
    """A batch of configurations, one entry per call to time (all arrays of equal length).

    ``channels`` 0 means NCCL's own per-call choice; ``comm_channels`` 0 the communicator's
    default (``NCCL_MIN/MAX_NCHANNELS`` otherwise); ``buffsize_bytes`` 0 NCCL's default
    (``NCCL_BUFFSIZE``); ``socket_nthreads``/``nsocks_perthread`` 0 the topology's defaults;
    ``socket_inline_bytes`` 0 NCCL's default inline size (``NCCL_SOCKET_INLINE``, 128 B).
    """

    coll: np.ndarray
    nbytes: np.ndarray
    algo: np.ndarray
    proto: np.ndarray
    channels: np.ndarray
    comm_channels: np.ndarray
    buffsize_bytes: np.ndarray
    socket_nthreads: np.ndarray
    nsocks_perthread: np.ndarray
    socket_inline_bytes: np.ndarray

    @classmethod
    def make(cls, coll: Any, nbytes: Any, algo: Any, proto: Any, channels: Any = 0, comm_channels: Any = 0,
             buffsize_bytes: Any = 0, socket_nthreads: Any = 0, nsocks_perthread: Any = 0,
             socket_inline_bytes: Any = 0) -> Configs:
        arrays = np.broadcast_arrays(*(np.asarray(x) for x in (
            coll, nbytes, algo, proto, channels, comm_channels, buffsize_bytes, socket_nthreads,
            nsocks_perthread, socket_inline_bytes)))
        out = [np.array(a, dtype=np.int64).ravel() for a in arrays]  # own, writable copies
        return cls(*out)

    def __len__(self) -> int:
        return int(self.nbytes.size)

    def validate(self, topo: Topology) -> None:
        """One-line errors for impossible entries (checked once per batch, vectorized)."""
        if np.any(self.nbytes <= 0):
            raise ConfigError("nbytes", f"must be > 0, got {int(self.nbytes[self.nbytes <= 0][0])}")
        for name, hi in (("coll", 5), ("algo", N.NUM_ALGOS), ("proto", N.NUM_PROTOS)):
            arr = getattr(self, name)
            if np.any((arr < 0) | (arr >= hi)):
                raise ConfigError(name, f"index out of range 0..{hi - 1}")
        for name in ("channels", "comm_channels"):
            arr = getattr(self, name)
            if np.any((arr < 0) | (arr > N.MAX_CHANNELS)):
                raise ConfigError(name, f"must be 0 (NCCL's choice) or 1..{N.MAX_CHANNELS}")
        for name in ("buffsize_bytes", "socket_nthreads", "nsocks_perthread", "socket_inline_bytes"):
            if np.any(getattr(self, name) < 0):
                raise ConfigError(name, "must be >= 0 (0 = NCCL's default)")
        if np.any(self.socket_nthreads * np.maximum(self.nsocks_perthread, 1) > 64):
            raise ConfigError("socket_nthreads", "NCCL allows at most 64 sockets per connection "
                              "(socket_nthreads x nsocks_perthread)")
        ok = eligible_mask(topo)[self.coll, self.algo, self.proto]
        if not np.all(ok):
            i = int(np.argmin(ok))
            check_algo_allowed(topo, int(self.coll[i]), int(self.algo[i]), int(self.proto[i]))


# -- the simulator ----------------------------------------------------------------------------


def _hops(topo: Topology, coll: np.ndarray, algo: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Intra-node steps, inter-node steps and algorithm bandwidth multiplier per entry."""
    n, nn = topo.nranks, topo.nodes
    ppn = n // nn
    log_nn = float(np.ceil(np.log2(nn))) if nn > 1 else 0.0
    ar = coll == N.ALLREDUCE
    agrs = (coll == N.ALLGATHER) | (coll == N.REDUCESCATTER)
    ring_steps = np.where(ar, 2 * (n - 1), np.where(agrs, n - 1, n - 1)).astype(float)
    ring_inter = np.where(ar, 2 * (nn - 1), nn - 1).astype(float) if nn > 1 else np.zeros(coll.shape)
    intra = np.zeros(coll.shape)
    inter = np.zeros(coll.shape)
    is_ring = algo == N.RING
    intra = np.where(is_ring, ring_steps - ring_inter, intra)
    inter = np.where(is_ring, ring_inter, inter)
    is_tree = algo == N.TREE
    intra = np.where(is_tree, 2.0 * (ppn - 1), intra)
    inter = np.where(is_tree, 2.0 * log_nn, inter)
    intra = np.where(algo == N.PAT, 0.0, intra)
    inter = np.where(algo == N.PAT, log_nn + n / 3.5, inter)
    intra = np.where(algo == N.NVLS, 1.0, intra)
    inter = np.where(algo == N.NVLS, 1.0 if nn > 1 else 0.0, inter)
    intra = np.where(algo == N.NVLS_TREE, 1.0, intra)
    inter = np.where(algo == N.NVLS_TREE, 2.0 * log_nn, inter)
    intra = np.where(algo == N.COLLNET_DIRECT, 2.0, intra)
    inter = np.where(algo == N.COLLNET_DIRECT, 1.0, inter)
    intra = np.where(algo == N.COLLNET_CHAIN, 2.0 * (ppn - 1), intra)
    inter = np.where(algo == N.COLLNET_CHAIN, 1.0, inter)
    return intra, inter, ring_steps


def _softmin(x: np.ndarray, y: np.ndarray | float, q: float) -> np.ndarray:
    x = np.maximum(x, 1e-9)
    y = np.maximum(y, 1e-9)
    m = np.minimum(x, y)
    # (x^-q + y^-q)^(-1/q) computed relative to the smaller term for stability.
    return m * ((m / x) ** q + (m / y) ** q) ** (-1.0 / q)


@dataclass
class Interference:
    """Per call, under overlapped compute (:meth:`Simulator.interference`).

    :param nccl_us: the call's time while the compute runs, us
    :param compute_rate: the compute's throughput while the call runs, 0-1 of its isolated speed
    :param cost_us: what the call adds to the step beyond the compute, us
    :param load: the fraction of the call the compute overlaps, 0-1
    """

    nccl_us: np.ndarray
    compute_rate: np.ndarray
    cost_us: np.ndarray
    load: np.ndarray


class Simulator:
    """Times configurations on one simulated platform.

    :param topology: a :class:`Topology`, a preset name or a YAML path
    :param params: simulator parameters (default: the topology's ``sim`` block over defaults)
    :param seed: seed of the noise generator used by :meth:`sample`
    """

    def __init__(self, topology: Topology | str, params: SimParams | None = None, seed: int | None = 0) -> None:
        self.topo = load_topology(topology)
        self.params = params if params is not None else SimParams.from_topology(self.topo)
        self.model = build_model(self.topo)
        self.rng = np.random.default_rng(seed)

    # -- noise-free time -------------------------------------------------------------------
    def time_us(self, cfg: Configs, validate: bool = True, load: Any = None) -> np.ndarray:
        """Expected time (us) of each configuration, noise-free.

        :param load: per entry (or one for all), the fraction 0-1 of the call during which compute
            runs on the same GPUs (:data:`PARAM_DOC` ``load_bw_loss``, ``load_lat_frac``); None or 0:
            the isolated time, exactly
        """
        return self._time(cfg, validate, load)[0]

    def channels_used(self, cfg: Configs, validate: bool = True) -> np.ndarray:
        """Channels (CTAs, one SM each) each configuration's call runs on: the tuner's count or
        NCCL's per-call choice, capped by the communicator's, after NCCL's cell scheduler."""
        if validate:
            cfg.validate(self.topo)
        return self._channels(cfg)

    def _channels(self, cfg: Configs) -> np.ndarray:
        topo = self.topo
        comm_ch = np.where(cfg.comm_channels > 0, cfg.comm_channels, topo.nccl.channels)
        auto, _ = auto_channels(self.model, cfg.nbytes, cfg.algo, cfg.proto, comm_ch)
        maxc = np.where(cfg.channels > 0, np.minimum(cfg.channels, comm_ch), auto)
        return scheduled_channels(cfg.coll, cfg.nbytes, cfg.proto, maxc, comm_ch, topo.nranks).astype(float)

    def _time(self, cfg: Configs, validate: bool = True, load: Any = None) -> tuple[np.ndarray, np.ndarray]:
        topo, p = self.topo, self.params
        if validate:
            cfg.validate(topo)
        coll, nbytes, algo, proto = cfg.coll, cfg.nbytes, cfg.algo, cfg.proto
        n, nn = topo.nranks, topo.nodes
        k = self._channels(cfg)

        intra_hops, inter_hops, ring_steps = _hops(topo, coll, algo)
        lat = (p.base_us[algo, proto] + intra_hops * p.hop_us[algo, proto]
               + inter_hops * p.net_hop_us[proto] + p.channel_us * (k - 1.0))

        q = p.contention_exp
        bus = _softmin(k * p.channel_bw_gbps[algo, proto], p.cap_gbps[algo, proto], q)
        if nn > 1:
            if topo.net.kind == "socket":
                nthr = np.where(cfg.socket_nthreads > 0, cfg.socket_nthreads, topo.nccl.socket_nthreads)
                nsock = np.where(cfg.nsocks_perthread > 0, cfg.nsocks_perthread, topo.nccl.nsocks_perthread)
                per_ch = _softmin(nthr * nsock * p.flow_bw_gbps, nthr * p.thread_bw_gbps, q)
            else:
                per_ch = np.full(k.shape, p.flow_bw_gbps)
            per_ch = per_ch * p.net_flows[algo] * p.net_eff[proto]
            nic = topo.net.nics_per_node * topo.net.nic_bw_gbps * p.net_eff[proto]
            net_bus = _softmin(k * per_ch, nic, q)
            bus = _softmin(bus, net_bus, q)
        if load is not None:
            u = np.clip(np.broadcast_to(np.asarray(load, dtype=float), k.shape), 0.0, 1.0)
            if np.any(u > 0):  # compute on the same GPUs: less bandwidth, more latency (none at u = 0)
                lat = lat * (1.0 + p.load_lat_frac * u)
                bus = bus * (1.0 - min(p.load_bw_loss, 0.9) * u)
        bw_time = nbytes * N.bus_factor(coll, n) / (1000.0 * bus)

        # Pipelining: fill with one chunk per fill step, then a cost per loop of chunks.
        per_ch_bytes = nbytes / k
        chunk = chunk_bytes(topo, coll, algo, proto, per_ch_bytes.astype(np.int64), cfg.buffsize_bytes)
        chunk = np.maximum(chunk, 1).astype(float)
        slices = np.where(algo == N.RING, np.where(coll == N.ALLREDUCE, n, np.maximum(ring_steps, 1)), 1.0)
        piece = np.minimum(chunk, per_ch_bytes / slices)
        loops = np.ceil(per_ch_bytes / (chunk * slices))
        fill = p.fill_steps[algo] * piece / (1000.0 * bus / k)
        if nn > 1 and topo.net.kind == "socket":
            # NCCL's socket transport: a message up to NCCL_SOCKET_INLINE rides with its size on the
            # control socket; a larger one is a second send on the proxy thread, or a hand-off to the
            # helper threads when NCCL_SOCKET_NTHREADS is set
            inline = np.where(cfg.socket_inline_bytes > 0, cfg.socket_inline_bytes, 128)
            helpers = (cfg.socket_nthreads > 0) | (nthr * nsock > 1)
            lat = lat + inter_hops * np.where(piece > inline, np.where(helpers, p.sock_thread_us, p.sock_send_us), 0.0)
        device = lat + bw_time + fill + p.loop_us[proto] * np.maximum(loops - 1.0, 0.0)
        # Host launch cost and device time overlap across back-to-back calls (soft maximum).
        r = max(p.overlap_exp, 1.0)
        hi = np.maximum(device, p.launch_us)
        t = hi * ((device / hi) ** r + (p.launch_us / hi) ** r) ** (1.0 / r)
        return t, np.minimum(t, lat + p.launch_us)

    # -- interference with concurrent compute -----------------------------------------------
    def compute_rate(self, cfg: Configs, t_us: Any, mem_frac: Any = 0.0, validate: bool = True) -> np.ndarray:
        """Throughput (0-1 of its isolated speed) of compute that runs while each call runs for
        ``t_us``: its SM-bound share loses the SMs the call's channels hold
        (``channels x sms_per_channel / gpu_sms``), its memory-bound share ``mem_frac`` the HBM
        bandwidth the call moves (``hbm_bytes_per_bus_byte x bus bytes / t_us / hbm_gbps``):
        ``rate = 1 / ((1 - m) / (1 - f_sm) + m / (1 - f_mem))``, each share capped at 0.9.

        :param t_us: the call's time (us) while the compute runs
        :param mem_frac: per entry, the fraction 0-1 of the compute's isolated time bound by HBM bandwidth
        """
        if validate:
            cfg.validate(self.topo)
        p = self.params
        k = self._channels(cfg)
        m = np.clip(np.broadcast_to(np.asarray(mem_frac, dtype=float), k.shape), 0.0, 1.0)
        t = np.maximum(np.broadcast_to(np.asarray(t_us, dtype=float), k.shape), 1e-9)
        f_sm = np.minimum(k * p.sms_per_channel / p.gpu_sms, 0.9)
        bus_bytes = cfg.nbytes * N.bus_factor(cfg.coll, self.topo.nranks)
        f_mem = np.minimum(p.hbm_bytes_per_bus_byte[cfg.proto] * bus_bytes / (1000.0 * t) / p.hbm_gbps, 0.9)
        return 1.0 / ((1.0 - m) / (1.0 - f_sm) + m / (1.0 - f_mem))

    def interference(self, cfg: Configs, compute_us: Any, mem_frac: Any = 0.0, t_iso_us: Any = None,
                     validate: bool = True) -> Interference:
        """What each call costs a step when ``compute_us`` of compute overlaps it (both start together
        on the same GPUs).

        The call runs under a load ``u = min(1, compute_us / t_iso)`` (its isolated time), so it takes
        ``t = time_us(cfg, load=u)``; the compute runs at :meth:`compute_rate` while the call runs and
        at full speed after. The pair ends after ``max(t, compute_us + t * (1 - rate))``; what the
        call costs beyond the compute is ``cost = max(t - compute_us, t * (1 - rate))``: the exposed
        communication when the call outlasts the compute, else the compute's slowdown. With
        ``compute_us`` 0 the cost is the isolated time, exactly.

        :param compute_us: per entry, the compute (us, as it runs alone) that overlaps the call
        :param mem_frac: per entry, the share 0-1 of that compute bound by HBM bandwidth
        :param t_iso_us: isolated times to scale from (a platform's, with effects beyond this
            simulator); the load's effect is this simulator's ratio of loaded to isolated time
        """
        if validate:
            cfg.validate(self.topo)
        sim_iso = self._time(cfg, False)[0]
        t_iso = sim_iso if t_iso_us is None else np.broadcast_to(np.asarray(t_iso_us, dtype=float), sim_iso.shape)
        c = np.maximum(np.broadcast_to(np.asarray(compute_us, dtype=float), sim_iso.shape), 0.0)
        load = np.minimum(c / np.maximum(t_iso, 1e-9), 1.0)
        t = t_iso * (self._time(cfg, False, load)[0] / sim_iso) if np.any(load > 0) else np.array(t_iso, dtype=float)
        rate = self.compute_rate(cfg, t, mem_frac, validate=False)
        cost = np.where(c > 0, np.maximum(t - c, t * (1.0 - rate)), t)
        return Interference(t, rate, cost, load)

    # -- noisy samples ---------------------------------------------------------------------
    def sample(self, cfg: Configs, n_samples: int = 1, rng: np.random.Generator | None = None,
               validate: bool = True) -> np.ndarray:
        """Noisy measured times, shape ``(len(cfg), n_samples)``; seeded by the simulator's seed."""
        rng = self.rng if rng is None else rng
        t, lat = self._time(cfg, validate)
        return self.add_noise(t, lat, n_samples, rng)

    def times_and_latency(self, cfg: Configs, validate: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Expected time and its latency part (what :meth:`add_noise` needs), for caching."""
        return self._time(cfg, validate)

    def add_noise(self, t: np.ndarray, lat: np.ndarray, n_samples: int = 1,
                  rng: np.random.Generator | None = None) -> np.ndarray:
        """Noisy samples of expected times ``t`` whose latency part is ``lat``: lognormal with a
        sigma that grows with the latency share, plus rare slow outliers."""
        rng = self.rng if rng is None else rng
        t = np.asarray(t, dtype=float).ravel()
        p = self.params
        frac = np.clip(np.asarray(lat, dtype=float).ravel() / t, 0.0, 1.0)
        sigma = p.noise_large + (p.noise_small - p.noise_large) * frac
        z = rng.standard_normal((t.size, n_samples))
        out = t[:, None] * np.exp(sigma[:, None] * z)
        slow = rng.random((t.size, n_samples)) < p.outlier_prob
        return np.where(slow, out * (1.0 + p.outlier_scale * rng.random((t.size, n_samples))), out)

    # -- conveniences ----------------------------------------------------------------------
    def default_configs(self, coll: int | str, nbytes: Any) -> Configs:
        """NCCL's default choice for each size, as configurations (channels 0 = NCCL's)."""
        d = default_decisions(self.topo, coll, nbytes)
        return Configs.make(d.coll, d.nbytes, d.algo, d.proto, 0)

    def randomized(self, rng: np.random.Generator, scale: float = 1.0, seed: int | None = None) -> Simulator:
        """A simulator of a platform drawn around this one (domain randomization)."""
        return Simulator(self.topo, self.params.randomized(rng, scale), seed=seed)

"""NCCL's default decision, replicated, against what NCCL 2.28.9 logged on 4 x H200."""

from __future__ import annotations

import re

import numpy as np
import pytest

from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.replica import (
    build_model,
    check_algo_allowed,
    cost_table,
    default_decisions,
    eligible_mask,
    scheduled_channels,
)
from ncclrl.costmodel.topology import load_topology, preset_names

LOG_LINE = re.compile(r"(\w+): (\d+) Bytes -> Algo (\w+) proto (\w+) channel\{Lo\.\.Hi\}=\{(\d+)\.\.(\d+)\}")


def read_log(path):
    rows = []
    for line in path.read_text().splitlines():
        m = LOG_LINE.search(line)
        if m:
            rows.append((m[1], int(m[2]), m[3].lower(), m[4].lower(), int(m[6]) - int(m[5]) + 1))
    return rows


def test_agreement_with_nccl_log(h200_data):
    """Every (collective, size) NCCL logged: same algorithm, protocol and channel count."""
    topo = load_topology("h200-1x4")
    rows = read_log(h200_data / "nccl_decisions_1node_4gpu.log")
    assert len(rows) >= 100
    table = []
    mismatches = []
    for name, logged_bytes, algo, proto, channels in rows:
        coll = N.COLL_LOG_NAMES[name]
        # NCCL logs one rank's count in bytes; the tuner (and our nbytes) sees the total for AG/RS.
        nbytes = logged_bytes * topo.nranks if coll in (N.ALLGATHER, N.REDUCESCATTER) else logged_bytes
        d = default_decisions(topo, coll, [nbytes])
        ours = (N.ALGOS[d.algo[0]], N.PROTOS[d.proto[0]], int(d.channels[0]))
        ok = ours == (algo, proto, channels)
        table.append((name, logged_bytes, f"{algo}/{proto}/{channels}", "/".join(map(str, ours)), ok))
        if not ok:
            mismatches.append(table[-1])
    print("\ncollective     log_bytes  nccl_logged           replica               agree")
    for name, b, logged, ours, ok in sorted(table, key=lambda r: (r[0], r[1])):
        print(f"{name:<14} {b:>10}  {logged:<20}  {ours:<20}  {'yes' if ok else 'NO'}")
    print(f"agreement: {len(table) - len(mismatches)}/{len(table)}")
    assert not mismatches


def test_cost_table_marks_disabled_entries():
    topo = load_topology("h200-1x4")
    t = cost_table(build_model(topo), N.ALLREDUCE, [1 << 20])[0]
    # NVLS off, no CollNet, PAT never for AllReduce, NVLS Tree needs several nodes.
    for a in (N.COLLNET_DIRECT, N.COLLNET_CHAIN, N.NVLS, N.NVLS_TREE, N.PAT):
        assert np.all(t[a] == -1.0)
    assert np.all(t[N.RING] > 0) and np.all(t[N.TREE] > 0)
    tb = cost_table(build_model(topo), N.BROADCAST, [1 << 20])[0]
    assert np.all(tb[N.TREE] == -1.0) and np.all(tb[N.RING] > 0)


def test_nccl_time_formula_small_message():
    """Ring/LL AllReduce on 4 GPUs: lat = 6.6 + 6 * 0.6 us; busBw = min(141, 0.5 * 24 * 15) GB/s."""
    topo = load_topology("h200-1x4")
    t = cost_table(build_model(topo), N.ALLREDUCE, [1 << 20])[0]
    alg_bw = 141.0 * 4 / 6
    assert t[N.RING, N.LL] == pytest.approx(10.2 + (1 << 20) / (1000 * alg_bw), rel=1e-6)


def test_channels_grow_with_size():
    topo = load_topology("h200-1x4")
    sizes = 2 ** np.arange(3, 31)
    d = default_decisions(topo, "allreduce", sizes)
    assert np.all(np.diff(d.channels) >= 0)
    assert d.channels[0] == 1 and d.channels[-1] == topo.nccl.channels


def test_scheduler_never_exceeds_communicator_channels():
    sizes = 2 ** np.arange(3, 33)
    for comm in (1, 2, 7, 24, 32):
        for proto in range(3):
            ch = scheduled_channels(N.ALLREDUCE, sizes, np.full(sizes.shape, proto), 64, comm, 4)
            assert ch.min() >= 1 and ch.max() <= comm


def test_pat_only_with_one_gpu_per_node():
    one_per_node = load_topology("h200-1x4")
    with pytest.raises(ConfigError, match="algorithm"):
        check_algo_allowed(one_per_node, N.ALLGATHER, N.PAT, N.SIMPLE)
    m = eligible_mask(one_per_node)
    assert not m[:, N.PAT].any()


def test_nvls_tree_impossible_on_one_node():
    with pytest.raises(ConfigError, match="nvls_tree/simple is not possible"):
        check_algo_allowed(load_topology("h200-1x4"), N.ALLREDUCE, N.NVLS_TREE, N.SIMPLE)


@pytest.mark.parametrize("name", preset_names())
@pytest.mark.parametrize("coll", N.COLLECTIVES)
def test_every_preset_has_a_default_for_every_size(name, coll):
    topo = load_topology(name)
    sizes = 2 ** np.arange(3, 33)
    d = default_decisions(topo, coll, sizes)
    assert np.all(d.time_us > 0)
    assert np.all(eligible_mask(topo)[N.COLLECTIVES.index(coll), d.algo, d.proto])
    assert np.all((d.channels >= 1) & (d.channels <= topo.nccl.channels))


def test_socket_networks_disable_ll128():
    m = eligible_mask(load_topology("h200-2x2-sock"))
    assert not m[:, :, N.LL128].any()
    assert eligible_mask(load_topology("dgx-h100-2n"))[N.ALLREDUCE, N.RING, N.LL128]


@pytest.mark.parametrize("bad", [0, -8, 1.5])
def test_bad_sizes(bad):
    with pytest.raises(ConfigError, match="nbytes"):
        default_decisions(load_topology("h200-1x4"), "allreduce", [bad])

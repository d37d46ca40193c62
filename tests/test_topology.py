from __future__ import annotations

import pytest
import yaml

from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.topology import dump_topology, load_topology, preset_names, topology_from_dict

REQUIRED = ["h200-1x4", "h200-2x2-sock", "dgx-h100-2n", "dgx-h100-16n", "v100-2x8-eth", "a40-4x8-ib",
            "a100-16x4-ib"]


def test_required_presets_exist():
    assert set(REQUIRED) <= set(preset_names())


@pytest.mark.parametrize("name", REQUIRED)
def test_preset_roundtrip(name, tmp_path):
    t = load_topology(name)
    assert t.nranks == t.nodes * t.gpus_per_node
    path = tmp_path / f"{name}.yaml"
    dump_topology(t, path)
    back = load_topology(path)
    assert back == t and back.sim == t.sim


def test_h200_presets_describe_the_test_machine():
    one = load_topology("h200-1x4")
    two = load_topology("h200-2x2-sock")
    assert (one.nodes, one.gpus_per_node, one.intra.fabric, one.nccl.nvls) == (1, 4, "nvswitch", False)
    assert (two.nodes, two.gpus_per_node, two.net.kind) == (2, 2, "socket")


def base():
    return yaml.safe_load(open(load_topology.__globals__["TOPOLOGY_DIR"] / "h200-1x4.yaml"))


@pytest.mark.parametrize("mutate,field", [
    (lambda d: d.update(nodes=0), "topology.nodes"),
    (lambda d: d.update(nodes=2.5), "topology.nodes"),
    (lambda d: d.update(nodes=2), "net.kind"),
    (lambda d: d["gpu"].update(arch="pascal"), "gpu.arch"),
    (lambda d: d["intra"].update(fabric="ethernet"), "intra.fabric"),
    (lambda d: d["net"].update(kind="carrier-pigeon"), "net.kind"),
    (lambda d: d.update(color="blue"), "color"),
    (lambda d: d["nccl"].update(nvls=True, version="2.28.9") or d["intra"].update(fabric="pcie"), "nccl.nvls"),
    (lambda d: d["nccl"].update(channels=65), "nccl.channels"),
    (lambda d: d["nccl"].update(version="two"), "nccl.version"),
])
def test_bad_topologies_name_the_field(mutate, field):
    d = base()
    mutate(d)
    with pytest.raises(ConfigError) as e:
        topology_from_dict(d)
    assert str(e.value).startswith(field + ":"), str(e.value)
    assert "\n" not in str(e.value)


def test_unknown_preset_lists_allowed():
    with pytest.raises(ConfigError, match="allowed: .*h200-1x4"):
        load_topology("h300-9x9")


def test_malformed_yaml(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("name: [unclosed\nnodes: 1\n")
    with pytest.raises(ConfigError, match="malformed YAML"):
        load_topology(p)

"""Every Hydra config group composes, and its topology is a valid platform."""

from __future__ import annotations

from pathlib import Path

import pytest

from runners.pretrain import CONF_DIR, _agent_config, compose, target_topology


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


@pytest.mark.parametrize("group", ["topology", "agent", "backend", "experiment"])
def test_every_option_of_every_group_composes(group):
    assert options(group)
    for opt in options(group):
        cfg = compose([f"{group}={opt}"])
        assert cfg[group] is not None
        topo = target_topology(cfg)
        assert topo.nranks >= 2
        _agent_config(cfg, 0).check()


def test_defaults_list_target_is_the_socket_bed():
    cfg = compose([])
    assert target_topology(cfg).name == "h200-2x2-sock"
    assert cfg.backend.kind == "sim" and cfg.agent.total_timesteps > 0
    assert Path(CONF_DIR / "config.yaml").read_text().count("#") > 5  # the defaults list is commented

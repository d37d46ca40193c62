"""Every command's config composes with its defaults; every option of every config group composes;
every preset is a valid target; every key of every schema is documented and reaches --help."""

from __future__ import annotations

import dataclasses

import pytest

from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.topology import preset_names
from ncclrl.runners.cli import COMMANDS, main
from ncclrl.runners.config import _groups, command_help, compose_config, help_rows
from ncclrl.runners.pretrain import CONF_DIR, PRETRAIN, agent_config, compose, experiment_config, target_topology


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


@pytest.mark.parametrize("group", ["agent", "experiment"])
def test_every_option_of_every_group_composes(group):
    assert options(group)
    for opt in options(group):
        cfg = compose([f"{group}={opt}"])
        assert cfg[group] is not None
        topo = target_topology(cfg)
        assert topo.nranks >= 2
        agent_config(cfg).check()
        experiment_config(cfg).check()


@pytest.mark.parametrize("preset", preset_names())
def test_every_preset_is_a_target_by_name_and_by_path(preset):
    assert target_topology(compose([f"topology={preset}"])).name == preset
    path = CONF_DIR / "topologies" / f"{preset}.yaml"
    assert target_topology(compose([f"topology={path}"])).nranks >= 2


def test_defaults_list_target_is_the_socket_bed():
    cfg = compose([])
    assert target_topology(cfg).name == "h200-2x2-sock"
    assert cfg.agent.total_timesteps > 0 and 0 < cfg.experiment.misspecified < 1
    # the defaults list is declared (and commented) in the schema, the group files say where defaults live
    assert [g for g, _ in _groups(PRETRAIN.schema)] == ["agent", "experiment"]
    assert (CONF_DIR / "agent" / "maskable_ppo.yaml").read_text().count("#") >= 1


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: c.name)
def test_every_command_composes_and_documents_every_key(cmd, capsys):
    try:
        compose_config(cmd, [])
    except ConfigError as e:  # a key it requires (help only): tests/test_cli.py checks each is refused empty
        assert e.field in cmd.required, e
    rows = help_rows(cmd.schema, None)
    undocumented = [k for k, tp, _d, text in rows if not text]
    assert not undocumented, f"{cmd.name}: keys without a :param line: {undocumented}"
    text = command_help(cmd)
    for k, tp, _d, _t in rows:
        if tp != "group":
            assert f"  {k}=" in text
    assert main([*cmd.name.split(), "--help"]) == 0
    assert "keys (key=value" in capsys.readouterr().out


@pytest.mark.parametrize("argv, key", [
    (["decisions", "nosuch=1"], "nosuch"),
    (["decisions", "num_pipe_ops=abc"], "num_pipe_ops"),
    (["decisions", "collective=allsum"], "collective"),
    (["decisions", "max_bytes=1Q"], "max_bytes"),
    (["pretrain", "agent=nosuch"], "agent"),
    (["pretrain", "experiment.min_budget=0"], "experiment.min_budget"),
    (["pretrain", "experiment.families=[optical]"], "experiment.families"),
    (["pretrain", "init=/nope/strategy.json"], "init"),
    (["pretrain", "agent.batch_size=7"], "agent.batch_size"),
    (["benchmark", "suite.methods=[simplex]"], "suite.methods"),
    (["sweep", "collectives=allreduce,allgather"], "collectives"),
])
def test_bad_input_is_one_line_naming_the_key(argv, key, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"ncclrl: error: {key}: ") and "\n" not in err and "Traceback" not in err


def test_sizes_parse_the_same_everywhere():
    assert dataclasses.is_dataclass(PRETRAIN.schema)
    for cmd in COMMANDS:
        for k, tp, _d, _t in help_rows(cmd.schema, None):
            if k.endswith(("min_bytes", "max_bytes")):
                assert tp == "str", f"{cmd.name}.{k} is a size: it takes 64K, 1M"

"""End to end: a tiny `ncclrl pretrain` (the search strategy), the zero-shot table's coverage and
rules (per communicator shape), continuing a strategy, bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ncclrl.agents.evaluate import evaluate_table
from ncclrl.agents.export import MAX_BYTES, default_shapes, export_table
from ncclrl.agents.search import SHIPPED, PolicyController, strategy_path
from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.simulator import Configs, Simulator
from ncclrl.costmodel.table import Table, lookup, parse_example_rows
from ncclrl.costmodel.topology import load_topology
from ncclrl.envs import spaces as S
from ncclrl.runners.cli import main

TINY = ["agent.total_timesteps=512", "agent.n_envs=2", "agent.n_steps=128", "agent.batch_size=128",
        "experiment.families=[nvlink]", "experiment.max_budget=80", "check_platforms=2", "check_budget=60"]


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    code = main(["pretrain", *TINY, f"run_dir={run_dir}"])
    assert code == 0
    return run_dir


def test_pretrain_smoke_leaves_a_complete_run_folder(smoke_run):
    for name in ("strategy.json", "strategy.npz", "config.yaml", "report.txt", "summary.json", "s_curve.png",
                 "evaluation.csv", "table/nccl_tuner.csv", "table/nccl_tuner.json", "table/nccl.conf"):
        assert (smoke_run / name).exists(), name
    s = json.loads((smoke_run / "summary.json").read_text())
    assert s["summary"]["worst_vs_default"] >= 0.99  # never worse than NCCL's default by more than 1%
    assert set(s["check"]) == {"strategy", "rank", "zero-shot"} and len(s["check"]["strategy"]) == 2
    assert list(s["shapes"]) == ["2x4", "1x2", "2x2"] and s["shapes"]["2x4"] == s["summary"]
    ctl = PolicyController.load(smoke_run / "strategy.json")
    assert ctl.meta["trained"]["agent"]["total_timesteps"] == 512


def test_pretrain_writes_its_training_curves_for_tensorboard(smoke_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = sorted((smoke_run / "tensorboard").rglob("events.out.tfevents.*"))
    assert events, "no TensorBoard event file under run_dir/tensorboard"
    acc = EventAccumulator(str(events[0].parent))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert "rollout/ep_rew_mean" in tags and "train/loss" in tags, tags


def test_pretrain_continues_a_strategy(tmp_path, smoke_run):
    """``init=``: training starts from the given strategy's weights (no training: the same scores)."""
    from ncclrl.agents.strategy_train import AgentConfig, ExperimentConfig, load_layers, to_controller, train

    init = PolicyController.load(strategy_path(SHIPPED))
    f = np.random.default_rng(0).normal(size=(9, len(init.meta["features"])))
    one = train(AgentConfig(total_timesteps=1, n_envs=1, n_steps=64, batch_size=64),
                ExperimentConfig(families=["nvlink"], max_budget=60), init=init, log=lambda _m: None)
    assert one.meta["init"] == init.meta["trained"]
    assert np.abs(one.scores(f) - init.scores(f)).max() < 0.5  # one update away from it
    from sb3_contrib import MaskablePPO

    from ncclrl.agents.strategy_train import RowPolicy, StrategyEnv
    env = StrategyEnv(ExperimentConfig(families=["nvlink"], max_budget=60))
    model = MaskablePPO(RowPolicy, env, n_steps=64, batch_size=64, device="cpu",
                        policy_kwargs={"hidden": init.layers[0][0].shape[1]})
    load_layers(model, init)
    assert np.allclose(to_controller(model, {}).scores(f), init.scores(f))


def test_export_covers_every_size_of_every_collective(smoke_run):
    text = (smoke_run / "table" / "nccl_tuner.csv").read_text()
    rows = parse_example_rows(text)
    assert all(len(line) <= 256 for line in text.splitlines())
    assert all(r["channels"] >= 1 for r in rows)  # never -1: the example plugin would run 1 channel
    shapes = [(2, 4), (1, 2), (2, 2)]  # target h200-2x2-sock: the job, one node, one rank per node
    assert list(dict.fromkeys((r["nNodes"], r["nRanks"]) for r in rows)) == shapes
    for nodes, nranks in shapes:
        for coll in N.COLLECTIVES:
            mine = [r for r in rows if r["collective"] == coll and (r["nNodes"], r["nRanks"]) == (nodes, nranks)]
            mine.sort(key=lambda r: r["min_bytes"])
            assert mine[0]["min_bytes"] == 0 and mine[-1]["max_bytes"] == MAX_BYTES
            for a, b in zip(mine, mine[1:], strict=False):
                assert b["min_bytes"] == a["max_bytes"] + 1  # no gaps, no overlaps
            for s in [0, 1, 7, 8, 4095, 4096, 1 << 20, (1 << 30) + 5, MAX_BYTES]:
                hit = lookup(rows, coll, s, nodes, nranks)
                assert hit is not None and (hit["nNodes"], hit["nRanks"]) == (nodes, nranks)
    assert all(r["algo"] in N.ALGOS and r["proto"] in N.PROTOS for r in rows)
    prov = json.loads((smoke_run / "table" / "nccl_tuner.json").read_text())["provenance"]
    assert prov["shapes"] == [[2, 4], [1, 2], [2, 2]]


def test_export_for_another_platform_and_show(tmp_path, capsys):
    out = tmp_path / "dgx"
    assert main(["export", "topology=dgx-h100-2n", f"run_dir={out}"]) == 0
    rows = parse_example_rows((out / "table" / "nccl_tuner.csv").read_text())
    assert {(r["nNodes"], r["nRanks"]) for r in rows} == {(2, 16), (1, 8), (2, 2)}
    capsys.readouterr()
    assert main(["show", str(out / "table" / "nccl_tuner.json"), f"plot={tmp_path / 'map.png'}"]) == 0
    shown = capsys.readouterr().out
    assert "allreduce" in shown and (tmp_path / "map.png").exists()


def test_export_shapes_from_the_command_line(tmp_path):
    out = tmp_path / "tp"
    assert main(["export", "topology=dgx-h100-2n", "export.shapes=[[1,8],[1,1],[1,8],[1,4]]", "export.tune_conf=false",
                 f"run_dir={out}"]) == 0
    table = Table.read(out / "table" / "nccl_tuner.json")
    assert table.shapes() == [(1, 8), (1, 4)]  # in order; one rank and repeats dropped
    assert table.provenance["shapes"] == [[1, 8], [1, 4]]
    assert "communicator shapes in the table" in (out / "report.txt").read_text()
    evaluation = (out / "evaluation.csv").read_text().splitlines()
    assert evaluation[0].startswith("nodes,nranks,collective,nbytes")
    assert {tuple(line.split(",")[:2]) for line in evaluation[1:]} == {("1", "8"), ("1", "4")}


def test_topology_shape():
    job = load_topology("dgx-h100-16n")  # 16 nodes x 8 GPUs
    assert job.shape(16, 128) is job
    tp, dp = job.shape(1, 8), job.shape(16, 16)
    assert (tp.nodes, tp.gpus_per_node, tp.nranks, tp.name) == (1, 8, 8, "dgx-h100-16n@1x8")
    assert (dp.nodes, dp.gpus_per_node, dp.nranks, dp.name) == (16, 1, 16, "dgx-h100-16n@16x1")
    assert (tp.intra, tp.net, tp.nccl, tp.sim) == (job.intra, job.net, job.nccl, job.sim)
    assert default_shapes(job) == [(16, 128), (1, 8), (16, 16)]
    assert default_shapes(load_topology("h200-1x4")) == [(1, 4)]
    assert default_shapes(load_topology("h200-2x1-sock")) == [(2, 2)]  # one GPU per node: the others repeat it
    for nodes, nranks, needle in [(17, 17, "spans 17 nodes"), (16, 1, "one rank on each of 16 nodes is [16, 16]"),
                                  (2, 3, "do not divide evenly"), (1, 9, "9 ranks per node"), (0, 8, "nodes must be"),
                                  (1, True, "nranks must be")]:
        with pytest.raises(ConfigError) as e:
            job.shape(nodes, nranks)
        assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)


@pytest.fixture(scope="module")
def two_node_table():
    sim = Simulator("dgx-h100-2n")
    return sim, export_table(sim, tune_conf=False, margin=0.01)


def test_each_shape_gets_its_own_simulators_argmin(two_node_table):
    """A 2-node table: every shape's rows are the exact export for that shape alone, each row is
    what ``Table.lookup`` returns for its shape only, and no shape is slower than NCCL's default
    (by more than the margin) or than the brute-force optimum of its own simulator."""
    sim, table = two_node_table
    assert table.shapes() == [(2, 16), (1, 8), (2, 2)] and table.provenance["shapes"] == [[2, 16], [1, 8], [2, 2]]
    key = ("collective", "min_bytes", "max_bytes", "algo", "proto", "channels", "source", "nnodes", "nranks")
    for nodes, nranks in table.shapes():
        shape_sim = Simulator(sim.topo.shape(nodes, nranks))
        alone = export_table(shape_sim, tune_conf=False, margin=0.01, shapes=[[nodes, nranks]])
        mine = [r for r in table.rows if (r.nnodes, r.nranks) == (nodes, nranks)]
        assert [[getattr(r, k) for k in key] for r in mine] == [[getattr(r, k) for k in key] for r in alone.rows]
        for r in mine:
            for nbytes in (r.min_bytes, r.max_bytes):
                assert table.lookup(r.collective, nbytes, nodes, nranks) is r
                for other in table.shapes():
                    if other != (nodes, nranks):
                        assert table.lookup(r.collective, nbytes, *other) is not r
        df = evaluate_table(table.for_shape(nodes, nranks), shape_sim)
        assert df["speedup"].min() >= 0.99
        sizes = 1 << np.arange(3, 31, dtype=np.int64)
        for c in (N.ALLREDUCE, N.ALLGATHER):
            valid = np.flatnonzero(S.action_mask(shape_sim.topo, c))
            algo, proto, ch, _ = (x[valid] for x in S.decode_all())
            best = np.full(sizes.size, np.inf)
            for a, p, k in zip(algo, proto, ch, strict=True):
                best = np.minimum(best, shape_sim.time_us(Configs.make(c, sizes, a, p, k if k else 0)))
            got = df[df.collective == N.COLLECTIVES[c]].set_index("nbytes").loc[sizes, "time_us"].to_numpy()
            assert np.all(got <= best * 1.01 + 1e-9), (nodes, nranks, N.COLLECTIVES[c])


def test_zero_shot_table_is_the_simulators_exact_argmin():
    """Each row is the fastest valid configuration the simulator knows (brute force over every
    action), or NCCL's choice where that is not ``margin`` faster."""
    sim = Simulator("h200-1x4")
    table = export_table(sim, tune_conf=False, margin=0.01)
    df = evaluate_table(table, sim)
    assert df["speedup"].min() >= 0.99
    assert all(r.source in ("simulator", "nccl-default") for r in table.rows)
    sizes = 1 << np.arange(3, 31, dtype=np.int64)
    c = N.ALLREDUCE
    valid = np.flatnonzero(S.action_mask(sim.topo, c))
    algo, proto, ch, _ = (x[valid] for x in S.decode_all())
    best = np.full(sizes.size, np.inf)
    for a, p, k in zip(algo, proto, ch, strict=True):
        t = sim.time_us(Configs.make(c, sizes, a, p, k if k else 0))
        best = np.minimum(best, t)
    got = df[df.collective == "allreduce"].set_index("nbytes").loc[sizes, "time_us"].to_numpy()
    assert np.all(got <= best * 1.01 + 1e-9)


@pytest.mark.parametrize("argv,needle", [
    (["pretrain", "topology=h300-9x9"], "topology: unknown preset"),
    (["pretrain", "agent.nonsense=3"], "agent.nonsense"),
    (["pretrain", "agent.batch_size=300", "agent.n_envs=2", "agent.n_steps=100", "agent.total_timesteps=10"],
     "agent.batch_size"),
    (["pretrain", "backend.kind=nccl-tests"], "backend.kind"),
    (["pretrain", "check_budget=0"], "check_budget"),
    (["export", "export.margin=2"], "export.margin"),
    (["export", "export.shapes=[[3,6]]"], "export.shapes"),
    (["export", "topology=dgx-h100-2n", "export.shapes=[[2,1]]"], "export.shapes"),
    (["export", "export.shapes=[1,2]"], "export.shapes"),
    (["pretrain", "agent.ent_coef=-1"], "agent.ent_coef: must be a number >= 0"),
    (["pretrain", "init=nosuch.json"], "init: no strategy at nosuch.json"),
])
def test_bad_overrides_are_one_line(capsys, argv, needle):
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and needle in err, err


@pytest.mark.parametrize("name,needle", [("composer.json", "is a job composer"),
                                         ("junk.json", "is not an ncclrl strategy")])
def test_an_init_that_is_not_a_strategy_is_refused_before_anything_is_written(tmp_path, capsys, monkeypatch, name,
                                                                              needle):
    import shutil

    from ncclrl.agents.search import strategy_path

    given = tmp_path / name
    if name == "composer.json":
        shutil.copy(strategy_path("shipped").with_name("composer.json"), given)
        shutil.copy(strategy_path("shipped").with_name("composer.npz"), tmp_path / "composer.npz")
    else:
        given.write_text("{}\n")
    monkeypatch.chdir(tmp_path)
    assert main(["pretrain", *TINY, f"init={given}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ncclrl: error: init: ") and needle in err, err
    assert not (tmp_path / "runs").exists()

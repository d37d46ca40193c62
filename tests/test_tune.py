"""``ncclrl tune``: its help lists every method it runs, a strategy that is none is refused before
anything is written, and its report goes to stdout."""

from __future__ import annotations

import shutil

from ncclrl.agents.baselines import METHODS
from ncclrl.agents.search import strategy_path
from ncclrl.runners.cli import main
from ncclrl.runners.config import command_help
from ncclrl.runners.tune import COMMAND


def test_the_help_lists_every_method_tune_runs():
    text = command_help(COMMAND).split("\n  method=", 1)[1].split("\n  budget=", 1)[0]
    methods = text.split("the tuner:", 1)[1].split("(afnfa and tpe", 1)[0]
    assert {m.strip() for m in " ".join(methods.split()).split(",")} == set(METHODS)


def test_a_composer_given_as_methods_ncclrl_strategy_is_refused_before_the_store(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for f in ("composer.json", "composer.npz"):
        shutil.copy(strategy_path("shipped").with_name(f), tmp_path / f)
    assert main(["tune", "method=ncclrl", "backend=replay", "topology=h200-2x2-sock",
                 f"strategy={tmp_path / 'composer.json'}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ncclrl: error: strategy:") and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["composer.json", "composer.npz"]


def test_the_report_goes_to_stdout(tmp_path, capsys):
    assert main(["tune", "method=default", "backend=replay", "topology=h200-2x2-sock", f"out={tmp_path / 'o'}",
                 f"store={tmp_path / 's.sqlite'}"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("# default on h200-2x2-sock: 0 measurements in 0 jobs,")
    assert out[1].startswith("# on the sweep's own data:")

"""The job composer: its run model, its decision, its baselines' budgets, its environment and its
learned policy."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from ncclrl.agents.compose import (
    BASELINES,
    FIRST,
    N_ACTIONS,
    N_BANDS,
    STOP,
    Action,
    ComposeRun,
    Draw,
    draw_problems,
    play,
)
from ncclrl.agents.compose_train import ComposeEnv, PolicyComposer, TrainConfig, observe, train
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.noise import JobNoise

SMALL = Draw(families=("nvlink",), collectives=("allreduce",), min_bytes=1 << 10, max_bytes=1 << 28)


@pytest.fixture(scope="module")
def problems():
    return draw_problems(6, 101, Draw(min_bytes=1 << 10, max_bytes=1 << 28))


def test_actions_round_trip_and_name_every_index_once():
    seen = set()
    for i in range(1, N_ACTIONS):
        a = Action.of(i)
        assert a.index == i
        seen.add((a.knob, a.band, a.candidates))
    assert len(seen) == N_ACTIONS - 1
    with pytest.raises(ConfigError):
        Action.of(STOP)


def test_the_first_job_is_nccls_defaults_with_every_candidate(problems):
    p = problems[0]
    run = ComposeRun(p, np.random.default_rng(0))
    ok = run.valid()
    assert set(np.flatnonzero(ok)) == {STOP, FIRST.index}
    idx = run.points_of(FIRST)
    assert set(idx) == set(np.flatnonzero((p.knob == 0) & p.candidate)) | set(p.nccl[0])


@pytest.mark.parametrize("name", [n for n in BASELINES if n != "nccl"])
def test_every_baseline_stays_within_its_gpu_time_budget(problems, name):
    for p in problems:
        for budget in (0.05, 0.3):
            q = replace(p, budget_gpu_s=p.sweep_gpu_s() * budget)
            run = ComposeRun(q, np.random.default_rng(3))
            c = BASELINES[name]()
            c.reset(run, np.random.default_rng(4))
            while run.step(c.act(run)):
                assert run.spent_gpu_s <= q.budget_gpu_s
            assert run.spent_gpu_s <= q.budget_gpu_s
            # what was charged is what the jobs cost on the truth
            assert run.spent_gpu_s == pytest.approx(sum(h["gpu_s"] for h in run.history))


def test_a_row_or_setting_is_exported_only_from_points_measured_in_two_jobs(problems):
    for p in problems:
        for seed in range(3):
            run = ComposeRun(p, np.random.default_rng(seed))
            c = BASELINES["sweep-race"]()
            c.reset(run, np.random.default_rng(seed))
            while run.step(c.act(run)):
                rows = run.rows[run.rows >= 0]
                assert (run.n[rows] >= 2).all()
                if run.table_knob:
                    assert (run.n[run.final] >= 2).all()


def test_without_noise_a_long_horizon_run_exports_most_of_the_optimum():
    """Noise-free jobs and a horizon of 1000 sweeps: the decision confirms what the truth supports,
    so sweep-then-race must reach most of the best table's saving (and never a slower size)."""
    probs = draw_problems(4, 103, Draw(families=("socket",), misspecified=0.0, collectives=("allreduce",),
                                       min_bytes=1 << 10, max_bytes=1 << 28))
    for p in probs:
        q = replace(p, noise=JobNoise.zero(), serve_gpu_s=p.sweep_gpu_s() * 1000, budget_gpu_s=p.sweep_gpu_s() * 2)
        o = play(q, BASELINES["sweep-race"](), 0)
        assert o.slower == 0
        assert o.saved_pct >= 0.6 * o.optimum_pct, o


def test_a_short_horizon_makes_the_baselines_stop_early(problems):
    """When the served GPU-time is worth little next to a job, no job pays for itself."""
    p = problems[0]
    q = replace(p, serve_gpu_s=p.sweep_gpu_s() * 0.05, budget_gpu_s=p.sweep_gpu_s())
    for name in ("ei/s", "kg/s", "sweep-race"):
        o = play(q, BASELINES[name](), 0)
        assert o.jobs <= 1, (name, o)


def test_runs_with_the_same_seed_draw_the_same_noise(problems):
    a = play(problems[1], BASELINES["kg/s"](), 5)
    b = play(problems[1], BASELINES["kg/s"](), 5)
    assert a == b


class _FirstJobOnly:
    """Runs NCCL's defaults' first job, then stops; keeps the run to read its noise."""

    name = "first"

    def reset(self, run, rng):
        self.run = run

    def act(self, run):
        return FIRST if not run.history else None


def _first_job_shift(p, draw: int) -> float:
    c = _FirstJobOnly()
    play(p, c, draw)
    at = c.run.n > 0
    return float((c.run.ysum[at] - p.truth[at]).mean() / p.noise.shift_sd)


def test_problems_judged_with_one_draw_number_get_independent_noise(problems):
    # the first job's standardized shift, per problem and draw: were a draw's noise stream shared by
    # its problems, each problem's shifts would follow the same sequence over the draws
    s = np.array([[_first_job_shift(p, d) for d in range(12)] for p in problems])
    r = np.corrcoef(s)[np.triu_indices(len(problems), 1)]
    assert np.abs(r).mean() < 0.4, r
    # the same problem and draw: the same noise, whichever method runs (common random numbers)
    assert _first_job_shift(problems[0], 3) == _first_job_shift(problems[0], 3)


def test_the_environment_passes_gymnasiums_checks_and_its_return_is_the_net_value(problems):
    env = ComposeEnv(problems, paired="")
    check_env(env, skip_render_check=True)
    env.reset(seed=1)
    total, done = 0.0, False
    rng = np.random.default_rng(0)
    while not done:
        m = env.action_masks()
        a = int(rng.choice(np.flatnonzero(m[1:]) + 1)) if m[1:].any() else STOP
        _, r, done, _, info = env.step(a)
        total += r
    assert total == pytest.approx(info["net_value"])
    assert observe(env.run).shape == env.observation_space.shape
    import gymnasium as gym

    made = gym.make("ncclrl/Compose-v0", problems=problems, paired="")
    obs, _ = made.reset(seed=0)
    assert obs.shape == env.observation_space.shape and made.unwrapped.action_masks()[STOP]


def test_a_paired_episode_returns_the_lead_over_the_baseline(problems):
    env = ComposeEnv(problems[:1], paired="sweep-race")
    env.reset(seed=2)
    total, done = 0.0, False
    while not done:
        _, r, done, _, info = env.step(STOP)
        total += r
    assert total == pytest.approx(info["net_value"] - info["baseline"])
    assert info["net_value"] == 0.0


def test_a_composer_trained_on_other_features_is_refused(tmp_path):
    layers = [(np.zeros((3, 4)), np.zeros(4)), (np.zeros((4, N_ACTIONS)), np.zeros(N_ACTIONS))]
    with pytest.raises(ConfigError):
        PolicyComposer(layers, {})


def test_the_composer_learns_to_beat_random_composition():
    """Trained for 2,048 steps on 24 problems of one family (nvlink, where few jobs pay for
    themselves), on 12 problems it never saw x 8 noise draws the policy's mean net value is above
    random composition's by 1 point or more, for each of 2 training seeds: it has learned at least
    when not to spend. (Each problem draws its own noise, so 2 draws of 12 problems leave random
    composition's mean a coin toss around its expectation; 8 draws do not.)"""
    train_p = draw_problems(24, 201, SMALL)
    judge = draw_problems(12, 202, SMALL)
    rand = np.mean([play(p, BASELINES["random"](), d).net_value for p in judge for d in range(8)])
    for seed in range(2):
        pol = train(train_p, TrainConfig(total_timesteps=2048, n_envs=8, n_steps=128, batch_size=256, seed=seed),
                    log=lambda _m: None)
        got = np.mean([play(p, pol, d).net_value for p in judge for d in range(8)])
        assert got >= rand + 1.0, (seed, got, rand)


def test_a_saved_composer_loads_and_acts_the_same(tmp_path, problems):
    rng = np.random.default_rng(0)
    from ncclrl.agents.compose_train import N_OBS

    layers = [(rng.standard_normal((N_OBS, 8)) * 0.1, np.zeros(8)),
              (rng.standard_normal((8, N_ACTIONS)), np.zeros(N_ACTIONS))]
    pol = PolicyComposer(layers, {"note": "random weights"})
    path = pol.save(tmp_path / "c.json")
    back = PolicyComposer.load(path)
    assert play(problems[2], pol, 0) == play(problems[2], back, 0)
    assert back.meta["actions"] == N_ACTIONS and N_BANDS == 4


def test_the_macro_environment_offers_what_each_baseline_would_run(problems):
    from ncclrl.agents.compose import JobsRule, PerSecond
    from ncclrl.agents.compose_train import MACROS, propose

    env = ComposeEnv(problems[:2], paired="", macros=True)
    check_env(env, skip_render_check=True)
    env.reset(seed=0)
    assert list(env.action_masks()) == [True, True] + [False] * (len(MACROS) - 1)  # the first job, or stop
    env.step(1)
    run = env.run
    props = propose(run)
    assert props[0] == JobsRule().choose(run, stop=False)
    assert props[2] == PerSecond("kg").choose(run, stop=False)
    for a in props:
        assert a is None or run.valid()[a.index]


# -- the composer in the full run --------------------------------------------------------------


def _full(seed: int = 0):
    from ncclrl.agents.compose import draw_full
    from ncclrl.agents.problem import Evaluator, platform_measure

    problem, oracle, plat, cp = draw_full(np.random.default_rng([301, seed]), Draw(
        families=("socket",), collectives=("allreduce",), min_bytes=1 << 10, max_bytes=1 << 26))
    ev = Evaluator(problem, platform_measure(plat, np.random.default_rng(seed)), 0.5 * cp.sweep_gpu_s())
    return problem, oracle, cp, ev


def test_a_composer_drives_the_full_run_within_its_budget_and_follows_every_job():
    from ncclrl.agents.compose import ComposerController, PerSecond
    from ncclrl.agents.search import Search, SearchConfig, estimate, measurements

    problem, oracle, cp, ev = _full()
    ctl = ComposerController(PerSecond("kg"), serve_sweeps=100)
    search = Search(problem, ev, ctl, SearchConfig())
    res = search.run()
    assert ev.gpu_s <= ev.budget and ev.calls >= 2
    assert len(ctl.run.history) >= ev.calls - 1  # the follower saw every job but the last
    assert ctl.run.n.sum() >= 1
    # what is exported is the full run's decision: every row measured in two jobs
    est = estimate(search.space, measurements(search.space, ev), search.model.noise)
    for i in res.table.rows.values():
        assert len(est.jobs[est.at[i]]) >= 2
    assert oracle.score(res.decision).slower == 0


def test_a_composer_that_stops_at_once_measures_nothing_and_says_why():
    from ncclrl.agents.compose import ComposerController, NeverTune
    from ncclrl.agents.search import Search, SearchConfig

    problem, _, _, ev = _full(1)
    res = Search(problem, ev, ComposerController(NeverTune(), serve_steps=1000), SearchConfig()).run()
    assert ev.calls == 0 and not res.decision.rows and not any(res.decision.conf.knobs)
    assert res.reason.startswith("the composer stopped")


def test_a_composer_whose_budget_pays_for_no_job_says_so(tmp_path):
    """Not "no job worth its GPU-time": the budget pays for no first job, or is spent."""
    from ncclrl.agents.compose import ComposerController, PerSecond, draw_full
    from ncclrl.agents.problem import Evaluator, platform_measure
    from ncclrl.agents.search import Search, SearchConfig
    from ncclrl.runners.cli import main

    problem, _, plat, _ = draw_full(np.random.default_rng([301, 0]), Draw(
        families=("socket",), collectives=("allreduce",), min_bytes=1 << 10, max_bytes=1 << 26))
    ev = Evaluator(problem, platform_measure(plat, np.random.default_rng(0)), 30.0)
    res = Search(problem, ev, ComposerController(PerSecond("kg"), serve_sweeps=100), SearchConfig()).run()
    assert ev.calls == 1 and res.reason == "budget spent"
    # inside a run the composer names the reason; finetune refuses such a budget before anything is written
    assert main(["finetune", "backend=replay", "topology=h200-2x2-sock", "strategy=ppo", "budget=27s",
                 f"out={tmp_path / 'o'}", f"store={tmp_path / 's.sqlite'}"]) == 2
    assert not (tmp_path / "o").exists() and not (tmp_path / "s.sqlite").exists()


def test_a_composer_controller_needs_one_served_figure():
    from ncclrl.agents.compose import ComposerController, NeverTune

    for kw in ({}, {"serve_steps": 10, "serve_sweeps": 2}, {"serve_gpu_s": -1.0}):
        with pytest.raises(ConfigError):
            ComposerController(NeverTune(), **kw)


def test_finetune_with_the_shipped_composer_on_the_recorded_sweep(tmp_path):
    import json
    from pathlib import Path

    from ncclrl.runners.finetune import parse_args, run_finetune

    live = Path(__file__).resolve().parents[1] / "data" / "h200x4-2026-11-21" / "store.sqlite"
    args = parse_args(["backend=replay", f"replay_store={live}", "launch=nccl", "topology=h200-2x2-sock",
                       "strategy=ppo", "serve_steps=20000", f"store={tmp_path / 'ft.sqlite'}",
                       f"out={tmp_path / 'out'}"])
    summary = run_finetune(args)
    assert summary["gpu_s"] <= 1.1 * summary["budget_gpu_s"]
    assert summary["reason"] == "budget spent" or summary["reason"].startswith("the composer")
    info = json.loads((tmp_path / "out" / "finetune.json").read_text())
    assert info["provenance"]["strategy"].endswith("composer.json") and info["provenance"]["strategy_sha256"]
    assert summary["sizes_slower_on_sweep"] == 0


def test_the_composer_command_trains_saves_and_judges(tmp_path):
    import json

    from ncclrl.runners.cli import main

    rc = main(["composer", f"run_dir={tmp_path}", "problems=6", "judge=3", "draws=1", "train.total_timesteps=256",
               "train.n_envs=2", "train.n_steps=128", "train.batch_size=128"])
    assert rc == 0
    out = json.loads((tmp_path / "judge.json").read_text())
    assert set(out["net_value"]) >= {"ppo", "kg/s", "sweep-race", "nccl"} and len(out["ppo_minus_best"]) == 3
    assert PolicyComposer.load(tmp_path / "composer.json").meta["problems"] == 6
    assert any((tmp_path / "tensorboard").rglob("events.out.tfevents.*"))


def test_the_composer_command_prints_its_judgement_on_stdout_and_none_writes_no_curves(tmp_path, capsys):
    from ncclrl.runners.cli import main

    rc = main(["composer", f"run_dir={tmp_path}", "problems=1", "judge=1", "draws=1", "train.total_timesteps=8",
               "train.n_envs=1", "train.n_steps=8", "train.batch_size=8", "train.tensorboard=none"])
    assert rc == 0
    out = capsys.readouterr().out.splitlines()
    assert any(ln.startswith("# ppo minus the best baseline") and "on 1 problem it never trained on x 1 draw" in ln
               for ln in out)
    assert out[-1] == f"# composer: {tmp_path / 'composer.json'} (finetune strategy={tmp_path / 'composer.json'})"
    assert (tmp_path / "composer.json").is_file() and not (tmp_path / "tensorboard").exists()


@pytest.mark.parametrize("argv,key", [(["train.paired=foo"], "train.paired"), (["problems=0"], "problems"),
                                      (["train_stream=2"], "judge_stream"),
                                      (["train.batch_size=7"], "train.batch_size"),
                                      (["train.learning_rate=-1"], "train.learning_rate"),
                                      (["train.learning_rate=0"], "train.learning_rate"),
                                      (["train.ent_coef=-0.5"], "train.ent_coef"),
                                      (["train.reweight_every=-1"], "train.reweight_every"),
                                      (["train.tensorboard=/etc/hostname/tb"], "train.tensorboard")])
def test_the_composer_command_refuses_bad_input_in_one_line(tmp_path, capsys, argv, key):
    from ncclrl.runners.cli import main

    assert main(["composer", f"run_dir={tmp_path / 'run'}", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"ncclrl: error: {key}:")
    assert not (tmp_path / "run").exists()


def test_a_failed_composer_training_leaves_no_run_folder_behind(tmp_path, monkeypatch):
    from ncclrl.agents import compose_train
    from ncclrl.runners.composer import COMMAND, run_composer
    from ncclrl.runners.config import compose_config

    def failing(problems, cfg, log=print):
        Path(cfg.tensorboard).mkdir(parents=True)  # what SB3 writes before it fails
        raise RuntimeError("the optimiser failed")

    monkeypatch.setattr(compose_train, "train", failing)
    args = compose_config(COMMAND, [f"run_dir={tmp_path / 'run'}", "problems=1", "judge=0"])
    with pytest.raises(RuntimeError):
        run_composer(args)
    assert not (tmp_path / "run").exists()
    (tmp_path / "kept").mkdir()  # a folder that was there before is the user's: left as it was
    args = compose_config(COMMAND, [f"run_dir={tmp_path / 'kept'}", "problems=1", "judge=0"])
    with pytest.raises(RuntimeError):
        run_composer(args)
    assert (tmp_path / "kept" / "tensorboard").is_dir()


def test_a_composers_weights_name_the_composer(tmp_path):
    """``strategy=.../composer.npz`` is the composer beside it, not a checkpoint to refuse."""
    import shutil

    from ncclrl.agents.compose_train import composer_path, is_composer

    for f in ("composer.json", "composer.npz"):
        shutil.copy(composer_path("shipped").with_name(f), tmp_path / f)
    assert is_composer(tmp_path / "composer.npz") and is_composer(tmp_path / "composer.json")
    assert PolicyComposer.load(tmp_path / "composer.npz").meta == PolicyComposer.load(tmp_path / "composer.json").meta
    (tmp_path / "other.npz").write_bytes((tmp_path / "composer.npz").read_bytes())
    assert not is_composer(tmp_path / "other.npz")  # no composer JSON beside it

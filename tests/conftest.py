"""Shared fixtures and the test tiers.

Real recorded data is never skipped: a missing data directory is a failure. The H200 recordings
are looked up in NCCLRL_SHARED_DATA, then ../shared/data beside the checkout, then the copy
committed in tests/data/shared (so a clean clone on a fresh machine has them).

Tiers (docs/results/tests.md): every test is in the fast tier unless a rule below puts it in the
slow one (marker ``slow``). A plain ``pytest`` runs the fast tier and says how many slow tests it
left out; ``--tier=slow`` runs the slow tier, ``--tier=all`` both (what CI runs). ``-m`` without
``--tier`` selects by marker alone (``-m slow``, ``-m "not slow"``), and a command line that names
test files or node ids runs what it names in every tier.

No silent skip: a skipped test is reported as an error. Every skip in the suite is a missing
prerequisite: a tool the README's test command installs (mpirun, locale sources) or recorded data
(NCCLRL_SHARED_DATA or ../shared/data). ``--allow-skips`` lets a machine that lacks one skip instead.
The one exception: tests marked ``public_grids`` read public forced-configuration grids that carry
no licence, so the repository cannot hold them; where they are absent those tests are not run and
the run's summary says so, naming them and where the grids are looked up.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# -- tiers ---------------------------------------------------------------------------------------

TIERS = ("fast", "slow", "all")

# Whole modules in the slow tier, and why.
SLOW_MODULES = {
    "test_faults.py": "the fault suites: workers hung, killed and resumed at random points",
    "test_launch.py": "multi-process launches through the local launcher, torchrun and mpirun",
    "test_e2e.py": "end-to-end DDP/FSDP runs through the launchers",
    "test_plugin.py": "the tuner plugin and its C harness built with clang, under sanitizers and fuzzing",
}

# Tests that use one of these module fixtures (module, fixture) are slow: the fixture builds C code
# or runs a whole command, and its cost is paid by the first test that uses it.
SLOW_FIXTURES = {
    ("test_online.py", "build"): "builds the online plugin and its sanitizer build",
    ("test_request_log.py", "build"): "builds the plugin and its driver",
    ("test_table_complete.py", "checker"): "builds the C plugin checker",
    ("test_table_complete.py", "written"): "runs export, pretrain, finetune and tune whole",
    ("test_pretrain_export.py", "smoke_run"): "runs a whole pretrain",
}

# The duration rule: a test function any of whose cases took 3 s or more (setup + call + teardown)
# in a ``pytest --durations`` run of the whole suite or of the fast tier on a 2-core machine at load
# 7-9 (about 1 s on an idle one), outside the modules and fixtures above. Listed by module; a name
# covers every parametrization.
SLOW_TESTS = {
    "test_stopping.py": (
        "test_a_larger_pay_factor_never_runs_more_jobs",
        "test_following_the_rules_choice_reproduces_the_default_run",
        "test_the_environment_passes_gymnasiums_checks_and_pays_the_lead_over_the_rule",
        "test_finetune_runs_a_stopping_agent_from_its_json_on_the_shipped_recording",
        "test_finetune_runs_the_installed_stopping_agent",
    ),
    "test_baselines.py": (
        "test_afnfa_does_not_depend_on_the_hash_seed",
        "test_benchmark_ci_suite_is_reproducible",
        "test_finds_known_optimum",
        "test_tpe_reaches_nccls_own_algorithm_at_its_count",
    ),
    "test_calibrate.py": (
        "test_calibrate_from_the_live_store_beats_the_preset",
        "test_heldout_error_within_15_percent",
        "test_recovers_a_known_platform",
    ),
    "test_calibration.py": ("test_export_counts_a_given_calibration_and_bad_keys_are_one_line",),
    "test_cli.py": ("test_calibrate_writes_a_usable_preset",),
    "test_compose.py": (
        "test_a_composer_drives_the_full_run_within_its_budget_and_follows_every_job",
        "test_finetune_with_the_shipped_composer_on_the_recorded_sweep",
        "test_the_composer_command_trains_saves_and_judges",
        "test_the_composer_learns_to_beat_random_composition",
    ),
    "test_confirm.py": ("test_share_does_not_fall_with_more_budget_on_the_recorded_host",),
    "test_detect.py": ("test_cli_writes_a_yaml_every_command_accepts",),
    "test_export_profile.py": (
        "test_a_profile_of_unknown_nodes_resolves_as_the_workload_does",
        "test_isolated_objective_is_todays_export_at_the_jobs_keys",
        "test_report_prints_the_saving_with_its_interval",
        "test_rows_only_for_the_jobs_keys",
        "test_step_table_never_costs_more_than_isolated_where_chosen",
        "test_the_safety_rule_reaches_the_choice_and_the_provenance",
    ),
    "test_finetune.py": ("test_finetune_cli_replaying_the_h200_sweep",),
    "test_jobs.py": (
        "test_a_point_that_takes_minutes_is_abandoned_and_never_measured_again",
        "test_a_point_whose_first_calls_return_but_far_too_slowly_is_dropped_inside_its_job",
        "test_ranks_that_said_done_and_do_not_exit_are_ended",
        "test_sigterm_mid_run_still_exports_what_the_measurements_support",
    ),
    "test_nccltests_backend.py": (
        "test_mpirun_a_rank_that_hangs",
        "test_mpirun_a_rank_without_the_plugin",
        "test_mpirun_two_nodes",
        "test_preempted_sweep_keeps_finished_jobs_and_resumes",
        "test_sweep_through_nccltests_into_the_store",
    ),
    "test_noise.py": (
        "test_a_setting_faster_everywhere_is_exported_through_job_wide_shifts",
        "test_recorded_a_a_validations_are_judged_the_same_by_the_between_job_model",
        "test_stored_a_a_validation_on_the_h200s",
        "test_the_decision_keeps_rows_truly_faster_and_never_rows_truly_slower",
    ),
    "test_online.py": (
        "test_a_coordinator_dying_inside_its_go_leaves_every_rank_on_one_side",
        "test_a_relay_that_changes_verdicts_in_transit_changes_no_decision",
        "test_kernel_phases_keep_the_wait_for_late_ranks_out_of_the_samples",
        "test_the_calls_nccl_2_31_makes_for_its_symmetric_kernels_take_no_slot_and_no_sample",
        "test_the_coordinator_command_says_a_port_in_use_in_one_line",
    ),
    "test_pretrain_export.py": (
        "test_export_for_another_platform_and_show",
        "test_export_shapes_from_the_command_line",
    ),
    "test_profile.py": (
        "test_cli_writes_yaml_that_reloads",
        "test_recorded_trace_matches_the_jobs_own_count",
    ),
    "test_readme.py": (
        "test_readme_examples_and_command_reference_are_current",
        "test_the_check_sees_a_stale_block",
    ),
    "test_replay_fresh.py": (
        "test_finetune_on_the_shipped_recording_keeps_rows_and_measures_them_afresh",
        "test_the_recorded_samples_confirm_nothing_and_a_bad_replay_key_is_one_line",
    ),
    "test_request_log.py": ("test_the_default_cap_on_a_long_job_and_a_fast_profile",),
    "test_strategy.py": ("test_a_briefly_trained_strategy_beats_random_search_on_a_small_family",),
    "test_sweep_store.py": (
        "test_a_hanging_configuration_costs_one_point_not_the_sweep",
        "test_after_a_hang_the_sweep_skips_that_algorithm_at_larger_sizes_and_does_not_retry",
        "test_failed_requests_are_stored_and_the_sweep_goes_on",
        "test_full_sweep_resumes_without_remeasuring",
        "test_no_gpu_is_one_line_exit_2_and_the_store_keeps_nothing_half_done",
        "test_wall_s_stops_starting_jobs_and_a_rerun_measures_the_rest",
        "test_whole_request_workers_get_every_point_of_a_setting_at_once",
    ),
    "test_validate_fwer.py": (
        "test_a_real_one_and_a_half_x_gain_is_found_there_and_same_elsewhere",
        "test_a_table_of_nccls_own_choices_gets_a_false_verdict_in_at_most_5_percent_of_reports",
    ),
    "test_workload_objective.py": (
        "test_finetune_with_a_profile_measures_only_the_jobs_sizes_and_reports_the_step_saving",
        "test_the_training_env_and_pretrain_take_a_profile",
    ),
}

# A fast-tier test slower than this is named at the end of the run (a candidate for SLOW_TESTS);
# well above the rule's 1 s so that a busy machine does not name half the tier.
FAST_WARN_S = 5.0

_TIER = pytest.StashKey[str | None]()  # the tier this run selected (None: -m or named tests select)
_LEFT_OUT = pytest.StashKey[int]()  # how many tests the tier deselected
_STALE = pytest.StashKey[list[str]]()  # rule entries that match no test
_FAST_S = pytest.StashKey[dict[str, float]]()  # seconds of each fast-tier test that ran


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ncclrl tiers")
    group.addoption("--tier", choices=TIERS, default=None,
                    help="which tier to run: fast (the default), slow, or all (what CI runs); without it, "
                         "-m alone selects, and named test files or node ids run in every tier")
    group.addoption("--allow-skips", action="store_true", default=False,
                    help="let tests skip when a prerequisite is missing (by default a skip is an error)")


def slow_reason(item: pytest.Item) -> str | None:
    """Why ``item`` is in the slow tier, or None when it is in the fast one."""
    module = item.path.name
    if module in SLOW_MODULES:
        return SLOW_MODULES[module]
    for fixture in getattr(item, "fixturenames", ()):
        if (module, fixture) in SLOW_FIXTURES:
            return SLOW_FIXTURES[module, fixture]
    name = getattr(item, "originalname", None) or item.name
    if name in SLOW_TESTS.get(module, ()):
        return "3 s or more in the durations run"
    return None


def _names_tests(config: pytest.Config) -> bool:
    """The command line names test files or node ids (not only folders)."""
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        return False
    here = config.invocation_params.dir
    return any("::" in a or not (here / a).is_dir() for a in config.args)


def selected_tier(config: pytest.Config) -> str | None:
    """The tier to run; None when the marker expression (``-m``) or the named tests alone select."""
    tier = config.getoption("tier")
    if tier is not None:
        return tier
    if config.getoption("markexpr") or _names_tests(config):
        return None
    return "fast"


def public_grids_dir() -> Path | None:
    """The folder holding ``public-grids`` (NCCLRL_SHARED_DATA, then ../shared/data), else None."""
    for root in (os.environ.get("NCCLRL_SHARED_DATA"), REPO.parent / "shared" / "data"):
        if root and (Path(root) / "public-grids").is_dir():
            return Path(root)
    return None


_NO_GRIDS = pytest.StashKey[list]()


@pytest.hookimpl(tryfirst=True)  # before -m deselects, so that -m slow sees the marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if public_grids_dir() is None:
        for i in items:
            if i.get_closest_marker("public_grids"):
                i.add_marker(pytest.mark.skip(reason="no public grids in NCCLRL_SHARED_DATA or ../shared/data"))
    slow = set()
    for item in items:
        if slow_reason(item) is not None:
            item.add_marker(pytest.mark.slow)
            slow.add(item.nodeid)
    if config.args_source != pytest.Config.ArgsSource.ARGS:  # the whole suite, before -k/-m deselect
        config.stash[_STALE] = stale_slow_names(items)
    tier = selected_tier(config)
    config.stash[_TIER] = tier
    if tier in (None, "all"):
        return
    keep = [i for i in items if (i.nodeid in slow) == (tier == "slow")]
    gone = [i for i in items if (i.nodeid in slow) != (tier == "slow")]
    if gone:
        config.hook.pytest_deselected(items=gone)
        items[:] = keep
    config.stash[_LEFT_OUT] = len(gone)


def stale_slow_names(items: list[pytest.Item]) -> list[str]:
    """Entries of SLOW_MODULES, SLOW_FIXTURES and SLOW_TESTS that match no collected test (renamed
    or removed tests: the list must follow them)."""
    modules = {i.path.name for i in items}
    fixtures = {(i.path.name, f) for i in items for f in getattr(i, "fixturenames", ())}
    names = {(i.path.name, getattr(i, "originalname", None) or i.name) for i in items}
    stale = [m for m in SLOW_MODULES if m not in modules]
    stale += [f"{m} fixture {f}" for m, f in SLOW_FIXTURES if (m, f) not in fixtures]
    stale += [f"{m}::{t}" for m, ts in SLOW_TESTS.items() for t in ts if (m, t) not in names]
    return stale


def pytest_report_header(config: pytest.Config) -> str:
    tier = selected_tier(config)
    if tier is None:
        return "tier: chosen by -m or by the tests named (--tier=fast|slow|all picks one)"
    return f"tier: {tier} (--tier=all runs every tier, as CI does)"


# -- no silent skip --------------------------------------------------------------------------------

@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    if item.get_closest_marker("slow") is None:  # for the fast-tier durations check at the end
        seconds = item.config.stash.setdefault(_FAST_S, {})
        seconds[item.nodeid] = seconds.get(item.nodeid, 0.0) + report.duration
    if report.skipped and item.get_closest_marker("public_grids"):
        item.config.stash.setdefault(_NO_GRIDS, []).append(item.nodeid)
    elif (report.skipped and not hasattr(report, "wasxfail")
            and not item.config.getoption("allow_skips")):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = re.sub(r"^Skipped: ", "", reason)
        report.outcome = "failed"
        report.longrepr = (f"skipped: {reason}\n(a skip is an error in this suite: provide what the test needs, "
                           "the tools the README's test command installs or the recorded data "
                           "(NCCLRL_SHARED_DATA), or pass --allow-skips)")
    return report


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    tr = terminalreporter
    tier = config.stash.get(_TIER, None)
    left_out = config.stash.get(_LEFT_OUT, 0)
    if tier == "fast" and left_out:
        tr.write_line(f"tier fast: {left_out} slow tests deselected; pytest --tier=slow runs them, "
                      "pytest --tier=all runs every tier (as CI does)", yellow=True)
    elif tier == "slow" and left_out:
        tr.write_line(f"tier slow: {left_out} fast tests deselected; pytest --tier=all runs every tier")
    slow_fast = sorted(((s, n) for n, s in config.stash.get(_FAST_S, {}).items() if s >= FAST_WARN_S), reverse=True)
    if slow_fast:
        tr.write_line(f"fast-tier tests over {FAST_WARN_S:g} s (candidates for SLOW_TESTS in tests/conftest.py):",
                      yellow=True)
        for d, nodeid in slow_fast:
            tr.write_line(f"  {d:.1f}s {nodeid}")
    no_grids = config.stash.get(_NO_GRIDS, [])
    if no_grids:
        n = len(no_grids)
        tr.write_line(f"NOT RUN: {n} test{'s' if n != 1 else ''} of the public grids, which carry no licence and "
                      "are not in the repository: set NCCLRL_SHARED_DATA to the folder holding public-grids/ "
                      "(or place it in ../shared/data) to run them: " + ", ".join(no_grids), yellow=True)
    stale = config.stash.get(_STALE, [])
    if stale:
        tr.write_line("tests/conftest.py names slow tests that no longer exist: " + ", ".join(stale), yellow=True)


# -- shared data ---------------------------------------------------------------------------------

def shared_data_dir() -> Path:
    env = os.environ.get("NCCLRL_SHARED_DATA")
    if env:
        path = Path(env)
    else:
        path = next((p for p in (REPO.parent / "shared" / "data", REPO / "tests" / "data" / "shared")
                     if (p / "h200x4-nccl2.28").is_dir()), REPO.parent / "shared" / "data")
    if not path.is_dir():
        raise FileNotFoundError(f"real data not found at {path}; set NCCLRL_SHARED_DATA")
    return path


@pytest.fixture(scope="session")
def h200_data() -> Path:
    return shared_data_dir() / "h200x4-nccl2.28"


@pytest.fixture(scope="session")
def allreduce_files(h200_data: Path) -> list[Path]:
    files = sorted((h200_data / "nccltests_allreduce").glob("*.txt"))
    assert len(files) >= 20, "expected the recorded nccl-tests files"
    return files


@pytest.fixture(scope="session", autouse=True)
def committed_stores_stay_unchanged():
    """Recorded measurement stores are data: tests and the commands they run only read them (a
    writable open would migrate the schema in place). Checked over the whole session."""
    import hashlib

    def state(p: Path) -> tuple:
        # a write in WAL mode lands in the -wal file first; the store itself changes at a checkpoint
        wal = p.with_name(p.name + "-wal")
        return (hashlib.sha256(p.read_bytes()).hexdigest() if p.exists() else None,
                wal.exists() and wal.stat().st_size > 0)

    stores = sorted(REPO.glob("data/**/*.sqlite"))
    before = {p: state(p) for p in stores}
    yield
    changed = [str(p.relative_to(REPO)) for p, s in before.items() if state(p) != s]
    assert not changed, f"tests changed committed stores: {changed}"

"""Bad-input audit of every ``ncclrl`` command: each case runs as a subprocess in a fresh temporary
folder (its cwd, with its own HOME and TMPDIR) under a timeout, and is classified automatically.

    python benchmarks/bad_inputs.py [--jobs N] [--only REGEX] [--keep]

The rule every case is held to: bad input is ONE line on stderr, ``ncclrl: error: KEY: ...``, exit
status 2 (1 for an operational failure the case declares: a port in use, an unresolvable host, a file
that cannot be written), no traceback, and nothing written: no file or folder left in the case's
folder, its HOME or its TMPDIR, nor at the paths it names. Classes, the first that applies:

- ``traceback``: a Python traceback on stdout or stderr;
- ``timeout``: still running after the case's timeout (killed);
- ``silent``: exit status 0, or a failure with nothing on stderr;
- ``late refusal``: refused, but only after more seconds than the case allows (it should fail while
  the command line is read, before any work);
- ``wrong hint``: the message suggests ``KEY=VALUE`` and the same command with that value is refused
  on the same key (checked where the case declares the key);
- ``help mismatch``: the help lists a value the command refuses, or omits one it accepts, or says
  what a value does and the command does otherwise;
- ``leftover``: a file or folder left behind;
- ``wrong exit``: one error line, but another exit status than the case expects;
- ``noisy``: more than one line on stderr, or no ``ncclrl: error:`` line;
- ``clean``: none of the above.

The recorded data (the nccl-tests outputs of 4 x H200, the public grids) is read from
``NCCLRL_SHARED_DATA``, else ``../shared/data`` beside the checkout. Prints a markdown table (case,
command, class, first stderr line) and a count per class; exit status 1 if any case is not clean.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("NCCLRL_SHARED_DATA") or REPO.parent / "shared" / "data")
NCCLTESTS = SHARED / "h200x4-nccl2.28" / "nccltests_allreduce"
PRETRAINED = REPO / "agents" / "pretrained"

CLASSES = ("clean", "traceback", "timeout", "silent", "late refusal", "wrong hint", "help mismatch", "leftover",
           "wrong exit", "noisy")


@dataclass
class Result:
    rc: int | None
    stdout: str
    stderr: str
    seconds: float
    created: list[str]


@dataclass
class Case:
    """One audit case.

    :param name: short unique name
    :param argv: the arguments after ``ncclrl``; ``{fx}`` is the fixtures folder, ``{cwd}`` the case's folder
    :param expect: the exit status of a clean refusal (2: bad input; 1: an operational failure)
    :param env: environment set for the command (``{fx}``, ``{cwd}`` replaced)
    :param setup: run with the case's folder before the command (fixtures of its own); what it makes is
        not counted as left behind
    :param hint_key: the message's ``KEY=VALUE`` suggestion for this key is re-run and must not be refused on KEY
    :param paths: more paths that must not exist afterwards
    :param timeout: seconds before the command is killed
    :param max_s: a refusal after more seconds than this is a late one
    :param kind: ``bad`` (must be refused), ``accepted`` (the help offers ``key=value``: must not be refused
        on ``key``), ``help`` (the help line of ``key`` must list ``value``), ``check`` (only ``check`` judges)
    :param check: more judgement: ``(class, why)`` when the result breaks a rule, else None
    :param stdin: text for the command's stdin
    :param forbid: a regular expression the error line must not match (a misleading message)
    """

    name: str
    argv: list[str]
    expect: int = 2
    env: dict[str, str] = field(default_factory=dict)
    setup: Callable[[Path], None] | None = None
    hint_key: str = ""
    paths: tuple[str, ...] = ()
    timeout: float = 120.0
    max_s: float | None = None
    kind: str = "bad"
    key: str = ""
    value: str = ""
    check: Callable[[Result, Path], tuple[str, str] | None] | None = None
    stdin: str = ""
    forbid: str = ""


# -- fixtures ----------------------------------------------------------------------------------------


def make_fixtures(fx: Path, env: dict[str, str]) -> None:
    """Files the cases name, made once: a real exported table, broken files of every kind."""
    fx.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["ncclrl", "export", f"run_dir={fx / 'export'}", "topology=h200-2x2-sock"], cwd=fx, env=env,
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        sys.exit(f"bad_inputs: the fixture export failed: {r.stderr.strip()[-500:]}")
    # the plugin and its table checker built once, where every case finds them
    r = subprocess.run(["ncclrl", "plugin", "build"], cwd=fx, env=env, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        sys.exit(f"bad_inputs: the fixture plugin build failed: {r.stderr.strip()[-500:]}")
    r = subprocess.run(["ncclrl", "show", str(fx / "export" / "table" / "nccl_tuner.csv")], cwd=fx, env=env,
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        sys.exit(f"bad_inputs: the fixture show failed: {r.stderr.strip()[-500:]}")
    files = {
        "garbage.csv": "hello, this is not a table\n\x01\x02\n",
        "rejected.csv": "allreduce,0,65535,ring,bogus,2,1,4\n",
        "empty.txt": "",
        "afile": "x\n",
        "not_a_table.json": json.dumps({"rows": [{"measured": 1}], "measured": 3}),
        "list.json": "[1, 2, 3]\n",
        "broken.json": "{\"rows\": [\n",
        "strategy_junk.json": "{}\n",
        "topo_broken.yaml": "nodes: [\n",
        "topo_nonsense.yaml": "foo: 1\n",
        "topo_zero.yaml": "name: zero\nnodes: 0\ngpus_per_node: 4\n",
        "bad.conf": "NCCL_BOGUS=1\n",
        "range.conf": "NCCL_MIN_NCHANNELS=2\nNCCL_MAX_NCHANNELS=8\n",
        "profile_bad.yaml": "collectives: 3\n",
        "store_junk.sqlite": "this is not a database\n",
        "nothing.log": "hello\n",
        "defaults.csv": "bytes,time_us\n8,abc\n",
        "noleader.txt": "# nccl-tests version 2.19.6\n# nothing here\n",
    }
    for name, text in files.items():
        (fx / name).write_text(text)
    (fx / "adir").mkdir(exist_ok=True)
    (fx / "empty_shared").mkdir(exist_ok=True)
    (fx / "composer").mkdir(exist_ok=True)
    for f in ("composer.json", "composer.npz"):
        shutil.copy(PRETRAINED / f, fx / "composer" / f)
    (fx / "strategy").mkdir(exist_ok=True)
    for f in ("strategy.json", "strategy.npz"):
        shutil.copy(PRETRAINED / f, fx / "strategy" / f)
    (fx / "lone").mkdir(exist_ok=True)  # a strategy's weights without the JSON that names them
    shutil.copy(PRETRAINED / "strategy.npz", fx / "lone" / "strategy.npz")


def nccltests_files() -> list[str]:
    return sorted(str(p) for p in NCCLTESTS.glob("*.txt"))


# -- running -----------------------------------------------------------------------------------------


def snapshot(*roots: Path) -> set[str]:
    out = set()
    for root in roots:
        if root.exists():
            for dirpath, dirnames, filenames in os.walk(root):
                for n in dirnames + filenames:
                    out.add(str(Path(dirpath, n)))
    return out


def fill(text: str, fx: Path, cwd: Path) -> str:
    return text.replace("{fx}", str(fx)).replace("{cwd}", str(cwd))


def run_one(argv: list[str], fx: Path, base: Path, env_extra: dict[str, str], setup, timeout: float,
            stdin: str, paths: tuple[str, ...]) -> tuple[Result, Path]:
    base.mkdir(parents=True)
    cwd, home, tmp = base / "work", base / "home", base / "tmp"
    for d in (cwd, home, tmp):
        d.mkdir()
    env = dict(os.environ)
    env.update(HOME=str(home), TMPDIR=str(tmp), NCCLRL_SHARED_DATA=str(SHARED),
               NCCLRL_PLUGIN_DIR=str(fx / "plugin"), MPLCONFIGDIR=str(fx / "mpl"), PYTHONUNBUFFERED="1",
               COLUMNS="200")
    env.update({k: fill(v, fx, cwd) for k, v in env_extra.items()})
    env = {k: v for k, v in env.items() if v != "<unset>"}
    if setup is not None:
        setup(cwd)
    named = [cwd / fill(p, fx, cwd) for p in paths]  # a relative path: in the case's folder
    before = snapshot(cwd, home, tmp)
    before_named = {str(p) for p in named if p.exists()}
    args = [fill(a, fx, cwd) for a in argv]
    t0 = time.monotonic()
    proc = subprocess.Popen(["ncclrl", *args], cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, errors="replace", start_new_session=True)
    try:
        out, err = proc.communicate(stdin, timeout=timeout)
        rc: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        rc = None
    seconds = time.monotonic() - t0
    created = sorted(snapshot(cwd, home, tmp) - before)
    created += [str(p) for p in named if p.exists() and str(p) not in before_named]
    return Result(rc, out, err, seconds, [c.replace(str(base) + "/", "") for c in created]), cwd


def error_lines(res: Result) -> list[str]:
    return [ln for ln in res.stderr.splitlines() if ln.strip()]


def first_line(res: Result) -> str:
    lines = error_lines(res)
    errs = [ln for ln in lines if ln.startswith("ncclrl: error:")]
    return (errs or lines or [""])[0]


def refused_on(res: Result, key: str) -> bool:
    return res.rc == 2 and any(ln.startswith(f"ncclrl: error: {key}:") for ln in error_lines(res))


def with_value(argv: list[str], key: str, value: str) -> list[str]:
    return [a for a in argv if not a.startswith(f"{key}=")] + [f"{key}={value}"]


def judge(case: Case, res: Result, fx: Path, base: Path) -> tuple[str, str]:
    """The case's class and why."""
    text = res.stdout + res.stderr
    if "Traceback (most recent call last)" in text:
        return "traceback", ""
    if case.kind == "check":
        got = case.check(res, base) if case.check else None
        return got or ("clean", "")
    if case.kind == "help":
        line = help_line(res.stdout, case.key)
        if not re.search(rf"(?<![\w-]){re.escape(case.value)}(?![\w-])", line):
            return "help mismatch", f"the help of {case.key}= does not list {case.value}, which the command accepts"
        return "clean", ""
    if case.kind == "accepted":
        if case.forbid and re.search(case.forbid, first_line(res)):
            return "wrong hint", f"the message says what it must not ({case.forbid})"
        if refused_on(res, case.key):
            return "help mismatch", f"{case.key}={case.value} is offered by the help but refused"
        return "clean", ""
    if res.rc is None:
        return "timeout", f"still running after {case.timeout:g} s"
    lines = error_lines(res)
    if res.rc == 0:
        return "silent", "exit status 0"
    if not lines:
        return "silent", f"exit status {res.rc}, nothing on stderr"
    if case.max_s is not None and res.seconds > case.max_s:
        return "late refusal", f"refused after {res.seconds:.0f} s (allowed {case.max_s:g} s)"
    if case.check:
        got = case.check(res, base)
        if got:
            return got
    if case.forbid and re.search(case.forbid, first_line(res)):
        return "wrong hint", f"the message says what it must not ({case.forbid})"
    if case.hint_key:
        first = first_line(res)
        m = re.search(rf"(?<![\w.]){re.escape(case.hint_key)}=([^\s,;:)'\"]+)", first)
        if m:
            again, _cwd = run_one(with_value(case.argv, case.hint_key, m.group(1)), fx, base / "hint",
                                  case.env, case.setup, case.timeout, case.stdin, ())
            said = re.match(r"ncclrl: error: ([\w.]+):", first_line(again))
            # refused again: a wrong hint, unless the first message named what else that takes (KEY=)
            if again.rc == 2 and said and (said.group(1) == case.hint_key or f"{said.group(1)}=" not in first):
                return "wrong hint", f"{case.hint_key}={m.group(1)} is refused: {first_line(again)[:160]}"
    if res.created:
        return "leftover", "left " + ", ".join(res.created[:4]) + (" ..." if len(res.created) > 4 else "")
    if res.rc != case.expect:
        return "wrong exit", f"exit status {res.rc}, expected {case.expect}"
    if len(lines) != 1 or not lines[0].startswith("ncclrl: error:"):
        return "noisy", f"{len(lines)} lines on stderr"
    return "clean", ""


def help_line(text: str, key: str) -> str:
    """A key's line of ``--help``, with its continuation lines."""
    out, on = [], False
    for ln in text.splitlines():
        if re.match(rf"\s+{re.escape(key)}=", ln):
            on = True
            out.append(ln)
        elif on and re.match(r"\s{20,}\S", ln) and not re.match(r"\s+[\w.]+=", ln):
            out.append(ln)
        elif on:
            break
    return " ".join(out)


# -- the cases ---------------------------------------------------------------------------------------

TABLE = "{fx}/export/table/nccl_tuner.csv"
TJSON = "{fx}/export/table/nccl_tuner.json"
CONF = "{fx}/export/table/nccl.conf"
REPLAY = ["backend=replay", "topology=h200-2x2-sock"]


def port_in_use() -> tuple[socket.socket, int]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s, s.getsockname()[1]


HELD, HELD_PORT = port_in_use()  # held for the whole audit: the coordinator's "port in use" case


def compiled_unannounced(res: Result, base: Path) -> tuple[str, str] | None:
    built = base / "home" / ".cache" / "ncclrl"
    if built.exists() and not re.search(r"build|compil", res.stderr, re.I):
        return "silent", f"compiled into {built} without a word on stderr"
    if res.rc != 0:
        return "wrong exit", f"exit status {res.rc} for a table the plugin loads"
    return None


def tensorboard_as_the_help_says(res: Result, base: Path) -> tuple[str, str] | None:
    """``composer train.tensorboard=VALUE`` writes curves where ``composer --help`` says VALUE puts them."""
    if res.rc != 0:
        return "wrong exit", f"exit status {res.rc}: {first_line(res)[:120]}"
    given = (base / "argv").read_text().split("train.tensorboard=", 1)
    value = (given[1].split() or [""])[0] if len(given) == 2 else ""
    text = help_line(subprocess.run(["ncclrl", "composer", "--help"], capture_output=True, text=True,
                                    timeout=60).stdout, "train.tensorboard")
    none = re.search(r'"" for none|empty: none|"" or none', text) if not value else \
        re.search(rf"\b{re.escape(value)}: no curves|\b{re.escape(value)} for none", text)
    written = (base / "work" / "c" / "tensorboard").exists()
    if none and written:
        return "help mismatch", f"train.tensorboard={value} wrote c/tensorboard; the help: {text.strip()[:120]}"
    if not none and not written and "RUN_DIR/tensorboard" in text and not value:
        return "help mismatch", f"train.tensorboard= wrote no curves; the help: {text.strip()[:120]}"
    return None


def report_on_stdout(res: Result, base: Path) -> tuple[str, str] | None:
    if res.rc != 0:
        return "wrong exit", f"exit status {res.rc}: {first_line(res)[:120]}"
    if not res.stdout.strip():
        return "noisy", "the report went to stderr, stdout is empty"
    return None


def plugin_mode_warns(res: Result, base: Path) -> tuple[str, str] | None:
    if res.rc != 0:
        return "wrong exit", f"the driver failed ({res.rc}): {(res.stderr or res.stdout).strip()[-160:]}"
    warn = [ln for ln in res.stdout.splitlines() if ln.startswith("log ") and "NCCLRL_TUNER_MODE" in ln]
    if not warn:
        return "silent", "NCCLRL_TUNER_MODE=onlin: no WARN"
    if not ("static" in warn[0] and "online" in warn[0]):
        return "noisy", f"the WARN does not name the allowed values: {warn[0][:160]}"
    return None


def cases() -> list[Case]:
    g = nccltests_files()
    grid = "grid=[" + ",".join(g) + "]"
    c: list[Case] = []
    add = c.append

    # every command: an unknown key, a bare word where none is taken, a '+' key
    for cmd in ("pretrain", "export", "finetune", "tune", "sweep", "validate", "benchmark", "show", "composer",
                "coordinator", "plugin build", "plugin verify", "e2e", "decisions", "predict", "calibrate",
                "topologies", "parse", "detect", "profile"):
        slug = cmd.replace(" ", "-")
        add(Case(f"{slug}-unknown-key", [*cmd.split(), "nosuchkey=1"]))
        add(Case(f"{slug}-plus-key", [*cmd.split(), "+nosuchkey=1"]))
        add(Case(f"{slug}-remove-key", [*cmd.split(), "~nosuchkey"]))
    for cmd in ("pretrain", "export", "finetune", "tune", "sweep", "benchmark", "composer", "coordinator",
                "decisions", "predict", "topologies"):
        add(Case(f"{cmd}-bare-word", [cmd, "somefile.csv"]))

    # pretrain / export
    add(Case("pretrain-topology-unknown", ["pretrain", "topology=nosuch"]))
    add(Case("pretrain-topology-folder", ["pretrain", "topology={fx}/adir"]))
    add(Case("pretrain-topology-broken-yaml", ["pretrain", "topology={fx}/topo_broken.yaml"]))
    add(Case("pretrain-topology-nonsense-yaml", ["pretrain", "topology={fx}/topo_nonsense.yaml"]))
    add(Case("pretrain-topology-zero-nodes", ["pretrain", "topology={fx}/topo_zero.yaml"]))
    add(Case("pretrain-timesteps-negative", ["pretrain", "agent.total_timesteps=-5"], max_s=15))
    add(Case("pretrain-batch-not-dividing", ["pretrain", "agent.batch_size=100"], max_s=15))
    add(Case("pretrain-learning-rate-negative", ["pretrain", "agent.learning_rate=-1"], max_s=15))
    add(Case("pretrain-gamma-above-one", ["pretrain", "agent.gamma=2"], max_s=15))
    add(Case("pretrain-ent-coef-negative", ["pretrain", "agent.ent_coef=-1"], max_s=15, timeout=60))
    add(Case("pretrain-n-envs-zero", ["pretrain", "agent.n_envs=0"], max_s=15))
    add(Case("pretrain-hidden-zero", ["pretrain", "agent.hidden=0"], max_s=15))
    add(Case("pretrain-family-unknown", ["pretrain", "experiment.families=[bogus]"], max_s=15))
    add(Case("pretrain-families-empty", ["pretrain", "experiment.families=[]"], max_s=15))
    add(Case("pretrain-budgets-inverted", ["pretrain", "experiment.min_budget=2000"], max_s=15))
    add(Case("pretrain-misspecified-above-one", ["pretrain", "experiment.misspecified=1.5"], max_s=15))
    add(Case("pretrain-collective-unknown", ["pretrain", "experiment.collectives=[bogus]"], max_s=15))
    add(Case("pretrain-agent-group-unknown", ["pretrain", "agent=nosuch"]))
    add(Case("pretrain-experiment-group-unknown", ["pretrain", "experiment=nosuch"]))
    add(Case("pretrain-margin-negative", ["pretrain", "export.margin=-1"], max_s=15))
    add(Case("pretrain-calibration-unknown", ["pretrain", "export.calibration=bogus"], max_s=15))
    add(Case("pretrain-run-dir-under-file", ["pretrain", "run_dir={fx}/afile/x"]))
    add(Case("pretrain-profile-missing", ["pretrain", "profile=nosuch.yaml"], max_s=15))
    add(Case("pretrain-profile-broken", ["pretrain", "profile={fx}/profile_bad.yaml"], max_s=15))
    add(Case("pretrain-init-missing", ["pretrain", "init=nosuch.json"], max_s=15))
    add(Case("pretrain-init-junk", ["pretrain", "init={fx}/strategy_junk.json"], max_s=15))
    add(Case("pretrain-init-composer", ["pretrain", "init={fx}/composer/composer.json"], max_s=15))
    add(Case("pretrain-check-platforms-negative", ["pretrain", "check_platforms=-1"], max_s=15))
    add(Case("pretrain-check-budget-zero", ["pretrain", "check_budget=0"], max_s=15))
    add(Case("pretrain-timesteps-not-int", ["pretrain", "agent.total_timesteps=many"]))
    add(Case("export-topology-unknown", ["export", "topology=nosuch"]))
    add(Case("export-margin-text", ["export", "export.margin=abc"]))
    add(Case("export-margin-above-one", ["export", "export.margin=5"]))
    add(Case("export-shapes-ranks-not-dividing", ["export", "export.shapes=[[3,7]]"]))
    add(Case("export-shapes-zero", ["export", "export.shapes=[[0,0]]"]))
    add(Case("export-shapes-not-pairs", ["export", "export.shapes=[1,2]"]))
    add(Case("export-objective-unknown", ["export", "objective=bogus"]))
    add(Case("export-objective-without-profile", ["export", "objective=step"]))
    add(Case("export-profile-missing", ["export", "profile=nosuch.yaml"]))
    add(Case("export-profile-folder", ["export", "profile={fx}/adir"]))
    add(Case("export-compute-ratio-negative", ["export", "compute_ratio=-1"]))
    add(Case("export-mem-frac-negative", ["export", "mem_frac=-0.5"]))
    add(Case("export-unknown-overlap-above-one", ["export", "unknown_overlap=2"]))
    add(Case("export-choose-draws-zero", ["export", "choose_draws=0"]))
    add(Case("export-judge-draws-negative", ["export", "judge_draws=-1"]))
    add(Case("export-headroom-negative", ["export", "headroom=-1"]))
    add(Case("export-calibration-missing-file", ["export", "export.calibration=nosuch.yaml"]))
    add(Case("export-run-dir-is-file", ["export", "run_dir={fx}/afile"]))
    add(Case("export-tune-conf-not-bool", ["export", "export.tune_conf=maybe"]))

    # finetune
    add(Case("finetune-no-topology", ["finetune"]))
    add(Case("finetune-cpu-torch", ["finetune", "topology=h200-2x2-sock"], hint_key="backend",
             paths=("runs",)))
    add(Case("finetune-grid-30-outputs-no-topology", ["finetune", "backend=replay", grid]))
    add(Case("finetune-grid-30-outputs-2-nodes", ["finetune", "backend=replay", grid, "topology=h200-2x2-sock"],
             timeout=300))
    add(Case("finetune-grid-30-outputs-8-ranks", ["finetune", "backend=replay", grid, "topology=a100-1x8-nvswitch"],
             timeout=300))
    add(Case("finetune-grid-folder", ["finetune", "backend=replay", f"grid={NCCLTESTS}", "topology=h200-1x4"]))
    add(Case("finetune-grid-missing", ["finetune", "backend=replay", "grid=nosuch.txt", "topology=h200-1x4"]))
    add(Case("finetune-grid-no-data", ["finetune", "backend=replay", "grid=[{fx}/noleader.txt]",
                                       "topology=h200-1x4"]))
    add(Case("finetune-grid-garbage", ["finetune", "backend=replay", "grid=[{fx}/garbage.csv]", "topology=h200-1x4"]))
    add(Case("finetune-grid-garbage-ft-store", ["finetune", "backend=replay", "grid=[{fx}/garbage.csv]",
                                                "topology=h200-1x4", "store=ft.sqlite", "out=ft"]))
    add(Case("tune-grid-garbage-ft-store", ["tune", "method=random", "backend=replay", "grid=[{fx}/garbage.csv]",
                                            "topology=h200-1x4", "store=ft.sqlite", "out=ft"]))
    add(Case("finetune-cpu-no-recording", ["finetune", "topology=h200-1x4"], hint_key="backend"))
    add(Case("finetune-grid-torch", ["finetune", "topology=h200-1x4", grid]))
    add(Case("finetune-public-grid-no-shared-data", ["finetune", "backend=replay", "grid=p5en-2n", "topology=p5en-2n"],
             env={"NCCLRL_SHARED_DATA": "{fx}/empty_shared"}))
    add(Case("finetune-grid-default-unknown", ["finetune", "backend=replay", grid, "topology=h200-1x4",
                                               "grid_default=bogus"]))
    add(Case("finetune-grid-default-junk-csv", ["finetune", "backend=replay", grid, "topology=h200-1x4",
                                                "grid_default=[{fx}/defaults.csv]"]))
    add(Case("finetune-grid-default-no-decisions", ["finetune", "backend=replay", grid, "topology=h200-1x4",
                                                    "grid_default=[{fx}/nothing.log]"]))
    for b in ("10M", "0", "0min", "0.0001sweep", "-5s", "abc", "1s", "nan", "infsweep", "1e400"):
        add(Case(f"finetune-budget-{b}", ["finetune", *REPLAY, f"budget={b}"], max_s=20))
    add(Case("finetune-budget-below-screen", ["finetune", *REPLAY, "budget=27s"], timeout=180))
    add(Case("finetune-budget-below-one-job-ppo", ["finetune", *REPLAY, "budget=27s", "strategy=ppo"], timeout=180))
    add(Case("finetune-budget-below-one-job-jobs", ["finetune", *REPLAY, "budget=27s", "strategy=jobs"],
             timeout=180))
    add(Case("finetune-horizon-zero", ["finetune", *REPLAY, "horizon=0"]))
    add(Case("finetune-horizon-10M", ["finetune", *REPLAY, "horizon=10M"]))
    add(Case("finetune-strategy-composer-npz", ["finetune", *REPLAY, "strategy={fx}/composer/composer.npz",
                                                "budget=0.05sweep"], kind="accepted", key="strategy", forbid="pickle"))
    add(Case("finetune-strategy-strategy-npz", ["finetune", *REPLAY, "strategy={fx}/strategy/strategy.npz",
                                                "budget=0.05sweep"], kind="accepted", key="strategy", forbid="pickle"))
    add(Case("finetune-strategy-lone-npz", ["finetune", *REPLAY, "strategy={fx}/lone/strategy.npz"],
             forbid=r"pickle"))
    add(Case("finetune-strategy-missing", ["finetune", *REPLAY, "strategy=nosuch.json"]))
    add(Case("finetune-strategy-junk", ["finetune", *REPLAY, "strategy={fx}/strategy_junk.json"]))
    add(Case("finetune-strategy-unknown-word", ["finetune", *REPLAY, "strategy=bogus"]))
    add(Case("finetune-backend-unknown", ["finetune", "topology=h200-2x2-sock", "backend=bogus"]))
    add(Case("finetune-replay-store-missing", ["finetune", *REPLAY, "replay_store=nosuch.sqlite"],
             paths=("{cwd}/nosuch.sqlite",)))
    add(Case("finetune-replay-store-junk", ["finetune", *REPLAY, "replay_store={fx}/store_junk.sqlite"]))
    add(Case("finetune-replay-no-recording", ["finetune", "backend=replay", "topology=p5en-16n"]))
    add(Case("finetune-replay-noise-unknown", ["finetune", *REPLAY, "replay_noise=bogus"]))
    add(Case("finetune-samples-zero", ["finetune", *REPLAY, "samples=0"]))
    add(Case("finetune-timing-unknown", ["finetune", *REPLAY, "timing=bogus"]))
    add(Case("finetune-launch-unknown", ["finetune", *REPLAY, "launch=bogus"]))
    add(Case("finetune-min-bytes-zero", ["finetune", *REPLAY, "min_bytes=0"]))
    add(Case("finetune-sizes-inverted", ["finetune", *REPLAY, "min_bytes=1M", "max_bytes=4K"]))
    add(Case("finetune-size-fraction", ["finetune", *REPLAY, "max_bytes=1.5"]))
    add(Case("finetune-collective-unknown", ["finetune", *REPLAY, "collectives=[bogus]"]))
    add(Case("finetune-collectives-empty", ["finetune", *REPLAY, "collectives=[]"]))
    add(Case("finetune-wall-negative", ["finetune", *REPLAY, "wall_s=-1"]))
    add(Case("finetune-calibrate-unknown", ["finetune", *REPLAY, "calibrate=bogus"]))
    add(Case("finetune-load-unknown", ["finetune", *REPLAY, "load=bogus"]))
    add(Case("finetune-load-gemm-replay", ["finetune", *REPLAY, "load=gemm"]))
    add(Case("finetune-leaders-zero", ["finetune", *REPLAY, "confirm.leaders=0"]))
    add(Case("finetune-alpha-above-one", ["finetune", *REPLAY, "search.decision.alpha=2"]))
    add(Case("finetune-delta-negative", ["finetune", *REPLAY, "search.decision.delta=-0.1"]))
    add(Case("finetune-serve-steps-negative", ["finetune", *REPLAY, "serve_steps=-1"]))
    add(Case("finetune-launcher-unknown", ["finetune", *REPLAY, "launcher=bogus"]))
    add(Case("finetune-hosts-mismatch", ["finetune", "topology=h200-2x2-sock", "launcher=mpirun",
                                         "launcher.hosts=[a,b,c]"]))
    add(Case("finetune-nvls-unknown", ["finetune", *REPLAY, "nvls=bogus"]))
    add(Case("finetune-too-slow-negative", ["finetune", *REPLAY, "too_slow=-1"]))
    add(Case("finetune-timeout-below-1s", ["finetune", *REPLAY, "timeout_s=0.5"]))
    add(Case("finetune-profile-missing", ["finetune", *REPLAY, "profile=nosuch.yaml"]))
    add(Case("finetune-out-under-file", ["finetune", *REPLAY, "out={fx}/afile/x"]))
    add(Case("finetune-store-folder", ["finetune", *REPLAY, "store={fx}/adir"]))
    add(Case("finetune-store-junk", ["finetune", *REPLAY, "store={fx}/store_junk.sqlite"]))

    # tune
    add(Case("tune-method-missing", ["tune", *REPLAY]))
    add(Case("tune-method-unknown", ["tune", *REPLAY, "method=bogus"]))
    add(Case("tune-budget-zero", ["tune", *REPLAY, "method=random", "budget=0"]))
    add(Case("tune-budget-10M", ["tune", *REPLAY, "method=random", "budget=10M"]))
    add(Case("tune-budget-below-one-job", ["tune", *REPLAY, "method=random", "budget=1s"]))
    add(Case("tune-seed-negative", ["tune", *REPLAY, "method=random", "seed=-1"]))
    add(Case("tune-strategy-missing", ["tune", *REPLAY, "method=ncclrl", "strategy=nosuch.json"]))
    add(Case("tune-strategy-composer", ["tune", *REPLAY, "method=ncclrl", "strategy={fx}/composer/composer.json"]))
    add(Case("tune-cpu-torch", ["tune", "topology=h200-2x2-sock", "method=random"], hint_key="backend"))
    add(Case("tune-replay-store-missing", ["tune", *REPLAY, "method=random", "replay_store=nosuch.sqlite"],
             paths=("{cwd}/nosuch.sqlite",)))
    add(Case("tune-help-lists-ppo", ["tune", "--help"], kind="help", key="method", value="ppo"))
    add(Case("tune-help-lists-kg-jobs", ["tune", "--help"], kind="help", key="method", value="kg-jobs"))
    add(Case("tune-help-lists-confirm", ["tune", "--help"], kind="help", key="method", value="confirm"))
    add(Case("benchmark-help-lists-ppo", ["benchmark", "--help"], kind="help", key="suite.methods", value="ppo"))
    add(Case("benchmark-help-lists-kg-jobs", ["benchmark", "--help"], kind="help", key="suite.methods",
             value="kg-jobs"))
    add(Case("tune-report-on-stdout", ["tune", *REPLAY, "method=default", "out={cwd}/t", "store={cwd}/t.sqlite"],
             kind="check", check=report_on_stdout))

    # sweep
    add(Case("sweep-cpu", ["sweep"], hint_key="backend", paths=("runs",)))
    add(Case("sweep-cpu-2x2", ["sweep", "topology=h200-2x2-sock"], hint_key="backend"))
    add(Case("sweep-backend-replay", ["sweep", "backend=replay"]))
    add(Case("sweep-grid-unknown", ["sweep", "grid=bogus"]))
    add(Case("sweep-after-hang-unknown", ["sweep", "after_hang=bogus"]))
    add(Case("sweep-wall-negative", ["sweep", "wall_s=-1"]))
    add(Case("sweep-wall-fraction", ["sweep", "wall_s=1.5"]))
    add(Case("sweep-nccltests-no-dir", ["sweep", "backend=nccl-tests"]))
    add(Case("sweep-nccltests-dir-missing", ["sweep", "backend=nccl-tests", "nccltests_dir=nosuch"]))
    add(Case("sweep-nccltests-dir-empty", ["sweep", "backend=nccl-tests", "nccltests_dir={fx}/adir"],
             paths=("runs",)))
    add(Case("sweep-store-folder", ["sweep", "store={fx}/adir"]))
    add(Case("sweep-samples-zero", ["sweep", "samples=0"]))
    add(Case("sweep-timing-unknown", ["sweep", "timing=bogus"]))
    add(Case("sweep-collective-unknown", ["sweep", "collectives=[bogus]"]))
    add(Case("sweep-sizes-inverted", ["sweep", "min_bytes=1M", "max_bytes=1K"]))
    add(Case("sweep-load-gemm-nccltests", ["sweep", "backend=nccl-tests", "nccltests_dir={fx}/adir", "load=gemm"]))
    add(Case("sweep-load-n-zero", ["sweep", "load=gemm", "load_n=0"]))
    add(Case("sweep-tag-empty", ["sweep", "tag="]))
    add(Case("sweep-hosts-mismatch", ["sweep", "launcher=mpirun", "launcher.hosts=[a]", "topology=h200-2x2-sock"]))
    add(Case("sweep-share-gpu-not-bool", ["sweep", "launcher.share_gpu=maybe"]))

    # validate
    add(Case("validate-no-table", ["validate"]))
    add(Case("validate-table-missing", ["validate", "nosuch.csv", "topology=h200-2x2-sock"]))
    add(Case("validate-table-folder", ["validate", "{fx}/adir", "topology=h200-2x2-sock"]))
    add(Case("validate-no-topology", ["validate", TABLE]))
    add(Case("validate-cpu", ["validate", TABLE, "topology=h200-2x2-sock"], hint_key="measure",
             paths=("runs",)))
    add(Case("validate-cpu-backend-hint", ["validate", TABLE, "topology=h200-2x2-sock"], hint_key="backend"))
    add(Case("validate-cpu-out", ["validate", TABLE, "topology=h200-2x2-sock", "out={cwd}/val.csv"]))
    add(Case("validate-conf-missing", ["validate", TABLE, "topology=h200-2x2-sock", "conf=nosuch.conf"]))
    add(Case("validate-conf-unknown-knob", ["validate", TABLE, "topology=h200-2x2-sock", "conf={fx}/bad.conf"]))
    add(Case("validate-conf-range", ["validate", TABLE, "topology=h200-2x2-sock", "conf={fx}/range.conf"]))
    add(Case("validate-rounds-zero", ["validate", TABLE, "topology=h200-2x2-sock", "rounds=0"]))
    add(Case("validate-table-garbage", ["validate", "{fx}/garbage.csv", "topology=h200-2x2-sock"]))
    add(Case("validate-table-rejected-row", ["validate", "{fx}/rejected.csv", "topology=h200-2x2-sock"]))
    add(Case("validate-table-json", ["validate", "{fx}/not_a_table.json", "topology=h200-2x2-sock"]))
    add(Case("validate-out-folder", ["validate", TABLE, "topology=h200-2x2-sock", "out={fx}/adir"]))
    add(Case("validate-out-no-folder", ["validate", TABLE, "topology=h200-2x2-sock", "out=nosuch/val.csv"]))
    add(Case("validate-stored-missing-store", ["validate", TABLE, "topology=h200-2x2-sock", "measure=false",
                                               "store=nosuch.sqlite"], paths=("{cwd}/nosuch.sqlite",)))
    add(Case("validate-stored-junk-store", ["validate", TABLE, "topology=h200-2x2-sock", "measure=false",
                                            "store={fx}/store_junk.sqlite"]))
    add(Case("validate-stored-no-validation", ["validate", TABLE, "topology=h200-2x2-sock", "measure=false",
                                               f"store={REPO}/data/h200x4-2026-11-21/store.sqlite"]))
    add(Case("validate-collective-unknown", ["validate", TABLE, "topology=h200-2x2-sock", "collectives=[bogus]"]))

    # benchmark
    add(Case("benchmark-grids-no-shared-data", ["benchmark", "suite=grids", "out={cwd}/b"],
             env={"NCCLRL_SHARED_DATA": "{fx}/empty_shared"}, timeout=300))
    add(Case("benchmark-suite-unknown", ["benchmark", "suite=nosuch"]))
    add(Case("benchmark-sets-unknown", ["benchmark", "suite.sets=[bogus]"]))
    add(Case("benchmark-methods-unknown", ["benchmark", "suite.methods=[bogus]"]))
    add(Case("benchmark-budget-zero", ["benchmark", "suite.budgets=[0sweep]"]))
    add(Case("benchmark-budget-10M", ["benchmark", "suite.budgets=[10M]"]))
    add(Case("benchmark-seeds-empty", ["benchmark", "suite.seeds=[]"]))
    add(Case("benchmark-workers-zero", ["benchmark", "workers=0"]))
    add(Case("benchmark-samples-zero", ["benchmark", "samples=0"]))
    add(Case("benchmark-ref-unknown", ["benchmark", "ref=bogus"]))
    add(Case("benchmark-grid-unknown", ["benchmark", "suite=grids", "suite.grids=[nosuch]"]))
    add(Case("benchmark-strategies-file", ["benchmark", "strategies={fx}/afile"], timeout=60))
    add(Case("benchmark-out-under-file", ["benchmark", "out={fx}/afile/x"]))
    add(Case("benchmark-min-bytes-zero", ["benchmark", "suite.min_bytes=0"]))
    add(Case("benchmark-platforms-zero", ["benchmark", "suite.platforms=0"]))
    add(Case("benchmark-family-unknown", ["benchmark", "suite.families=[bogus]"]))
    add(Case("benchmark-replay-store-missing", ["benchmark", "suite=ci",
                                                "suite.replays=[{store: nosuch.sqlite, topology: h200-2x2-sock}]"]))

    # show
    add(Case("show-no-table", ["show"]))
    add(Case("show-table-missing", ["show", "nosuch.csv"]))
    add(Case("show-table-folder", ["show", "{fx}/adir"]))
    add(Case("show-table-garbage", ["show", "{fx}/garbage.csv"], expect=1))
    add(Case("show-table-empty", ["show", "{fx}/empty.txt"], expect=1))
    add(Case("show-json-evidence", ["show", "{fx}/not_a_table.json"]))
    add(Case("show-json-list", ["show", "{fx}/list.json"]))
    add(Case("show-json-broken", ["show", "{fx}/broken.json"]))
    add(Case("show-json-missing", ["show", "nosuch.json"]))
    add(Case("show-two-tables", ["show", TABLE, TJSON]))
    add(Case("show-plot-no-folder", ["show", TABLE, "plot=nosuch/x.png"]))
    add(Case("show-plot-folder", ["show", TABLE, "plot={fx}/adir"]))
    add(Case("show-plot-under-file", ["show", TABLE, "plot={fx}/afile/x.png"]))
    add(Case("show-compiles-announced", ["show", TABLE], env={"NCCLRL_PLUGIN_DIR": "<unset>"}, kind="check",
             check=compiled_unannounced))
    add(Case("show-fingerprints-agree", ["show", TJSON], kind="check", check=fingerprints_disagree))

    # composer
    add(Case("composer-learning-rate-negative", ["composer", "train.learning_rate=-1"], max_s=15,
             paths=("runs",)))
    add(Case("composer-learning-rate-zero", ["composer", "train.learning_rate=0"], max_s=15, timeout=60))
    add(Case("composer-ent-coef-negative", ["composer", "train.ent_coef=-1"], max_s=15, timeout=60))
    add(Case("composer-timesteps-zero", ["composer", "train.total_timesteps=0"], max_s=15))
    add(Case("composer-batch-not-dividing", ["composer", "train.batch_size=100"], max_s=15))
    add(Case("composer-paired-unknown", ["composer", "train.paired=bogus"], max_s=15))
    add(Case("composer-reweight-without-paired", ["composer", "train.reweight_every=5", "train.paired="], max_s=15))
    add(Case("composer-problems-zero", ["composer", "problems=0"], max_s=15))
    add(Case("composer-judge-negative", ["composer", "judge=-1"], max_s=15))
    add(Case("composer-draws-zero", ["composer", "draws=0"], max_s=15))
    add(Case("composer-same-streams", ["composer", "judge_stream=1"], max_s=15))
    add(Case("composer-run-dir-under-file", ["composer", "run_dir={fx}/afile/x"], max_s=15))
    add(Case("composer-tensorboard-under-file", ["composer", "train.tensorboard={fx}/afile/tb"], max_s=15))
    add(Case("composer-n-epochs-zero", ["composer", "train.n_epochs=0"], max_s=15))
    tiny = ["composer", "run_dir=c", "problems=1", "judge=0", "train.total_timesteps=8", "train.n_envs=1",
            "train.n_steps=8", "train.batch_size=8"]
    add(Case("composer-tensorboard-empty-as-the-help-says", [*tiny, "train.tensorboard="], kind="check",
             check=tensorboard_as_the_help_says))
    add(Case("composer-tensorboard-none-as-the-help-says", [*tiny, "train.tensorboard=none"], kind="check",
             check=tensorboard_as_the_help_says))

    # coordinator
    add(Case("coordinator-port-in-use", ["coordinator", "host=127.0.0.1", f"port={HELD_PORT}"], expect=1,
             timeout=30))
    add(Case("coordinator-host-unresolvable", ["coordinator", "host=nosuch.invalid", "port=0"], expect=1,
             timeout=30))
    add(Case("coordinator-log-unwritable", ["coordinator", "port=0", "log=/proc/ncclrl-audit/log.jsonl"],
             expect=1, timeout=30))
    add(Case("coordinator-log-under-file", ["coordinator", "port=0", "log={fx}/afile/log.jsonl"], expect=1,
             timeout=30))
    add(Case("coordinator-port-file-unwritable", ["coordinator", "port=0", "port_file=/proc/ncclrl-audit-port"],
             expect=1, timeout=30))
    add(Case("coordinator-port-file-under-file", ["coordinator", "port=0", "port_file={fx}/afile/port"],
             expect=1, timeout=30))
    add(Case("coordinator-log-folder", ["coordinator", "port=0", "log={fx}/adir"], timeout=30))
    add(Case("coordinator-secret-file-unreadable", ["coordinator", "port=0", "secret_file={fx}/afile"], timeout=30))
    add(Case("coordinator-secret-file-under-file", ["coordinator", "port=0", "secret_file={fx}/afile/s"],
             expect=1, timeout=30))
    add(Case("coordinator-policy-unknown", ["coordinator", "policy=bogus"]))
    add(Case("coordinator-policy-shipped", ["coordinator", "port=0", "policy=shipped"], kind="accepted",
             key="policy", value="shipped", timeout=8))
    add(Case("coordinator-port-negative", ["coordinator", "port=-1"]))
    add(Case("coordinator-port-too-large", ["coordinator", "port=70000"]))
    add(Case("coordinator-slots-one", ["coordinator", "slots=1"]))
    add(Case("coordinator-round-timeout-zero", ["coordinator", "round_timeout_s=0"]))
    add(Case("coordinator-max-conns-zero", ["coordinator", "max_conns=0"]))
    add(Case("coordinator-host-empty", ["coordinator", "host=", "port=0"], timeout=30))

    # plugin build / verify
    add(Case("plugin-no-subcommand", ["plugin"]))
    add(Case("plugin-unknown-subcommand", ["plugin", "nosuch"]))
    add(Case("plugin-build-out-under-file", ["plugin", "build", "out={fx}/afile/x"]))
    add(Case("plugin-verify-no-table", ["plugin", "verify", "topology=h200-2x2-sock"]))
    add(Case("plugin-verify-table-missing", ["plugin", "verify", "nosuch.csv", "topology=h200-2x2-sock"]))
    add(Case("plugin-verify-no-topology", ["plugin", "verify", TABLE]))
    add(Case("plugin-verify-cpu", ["plugin", "verify", TABLE, "topology=h200-2x2-sock"], paths=("plugin-verify",)))
    add(Case("plugin-verify-iters-zero", ["plugin", "verify", TABLE, "topology=h200-2x2-sock", "iters=0"]))
    add(Case("plugin-verify-max-bytes-zero", ["plugin", "verify", TABLE, "topology=h200-2x2-sock", "max_bytes=0"]))
    add(Case("plugin-verify-plugin-missing", ["plugin", "verify", TABLE, "topology=h200-2x2-sock",
                                              "plugin=nosuch.so"]))
    add(Case("plugin-verify-garbage-table", ["plugin", "verify", "{fx}/garbage.csv", "topology=h200-2x2-sock"]))
    add(Case("plugin-online-mode-misspelled", ["plugin-online-mode"], kind="check", check=plugin_mode_warns))

    # e2e
    add(Case("e2e-no-topology", ["e2e", TABLE]))
    add(Case("e2e-table-missing", ["e2e", "nosuch.csv", "topology=h200-2x2-sock"]))
    add(Case("e2e-cpu-cuda", ["e2e", TABLE, "topology=h200-2x2-sock"], paths=("e2e",)))
    add(Case("e2e-mode-unknown", ["e2e", TABLE, "topology=h200-2x2-sock", "mode=bogus"]))
    add(Case("e2e-heads-not-dividing", ["e2e", TABLE, "topology=h200-2x2-sock", "heads=3", "device=cpu"]))
    add(Case("e2e-dtype-unknown", ["e2e", TABLE, "topology=h200-2x2-sock", "dtype=bogus"]))
    add(Case("e2e-bf16-cpu", ["e2e", TABLE, "topology=h200-2x2-sock", "dtype=bfloat16", "device=cpu"]))
    add(Case("e2e-rounds-zero", ["e2e", TABLE, "topology=h200-2x2-sock", "rounds=0", "device=cpu"]))
    add(Case("e2e-steps-zero", ["e2e", TABLE, "topology=h200-2x2-sock", "steps=0", "device=cpu"]))
    add(Case("e2e-device-unknown", ["e2e", TABLE, "topology=h200-2x2-sock", "device=tpu"]))
    add(Case("e2e-online-policy-unknown", ["e2e", TABLE, "topology=h200-2x2-sock", "online=true",
                                           "online_policy=bogus", "device=cpu"]))
    add(Case("e2e-conf-missing", ["e2e", TABLE, "topology=h200-2x2-sock", "conf=nosuch.conf"]))
    add(Case("e2e-out-under-file", ["e2e", TABLE, "topology=h200-2x2-sock", "out={fx}/afile/x"]))

    # decisions / predict / calibrate / topologies / parse / detect / profile
    add(Case("decisions-collective-unknown", ["decisions", "collective=bogus"]))
    add(Case("decisions-sizes-inverted", ["decisions", "min_bytes=1M", "max_bytes=1K"]))
    add(Case("decisions-size-garbage", ["decisions", "max_bytes=lots"]))
    add(Case("decisions-pipe-ops-zero", ["decisions", "num_pipe_ops=0"]))
    add(Case("decisions-topology-unknown", ["decisions", "topology=nosuch"]))
    add(Case("decisions-topology-empty", ["decisions", "topology="]))
    add(Case("predict-empty-stdin", ["predict"]))
    add(Case("predict-bad-algo", ["predict"], stdin="allreduce,1M,bogus,simple,0\n"))
    add(Case("predict-bad-size", ["predict"], stdin="allreduce,-4,ring,simple,0\n"))
    add(Case("predict-bad-fields", ["predict"], stdin="allreduce,1M,ring\n"))
    add(Case("predict-bad-channels", ["predict"], stdin="allreduce,1M,ring,simple,-2\n"))
    add(Case("predict-missing-column", ["predict"], stdin="collective,nbytes,algo\nallreduce,1M,ring\n"))
    add(Case("calibrate-nothing", ["calibrate"]))
    add(Case("calibrate-file-missing", ["calibrate", "nosuch.txt"]))
    add(Case("calibrate-both", ["calibrate", g[0], "store=nosuch.sqlite"]))
    add(Case("calibrate-store-missing", ["calibrate", "store=nosuch.sqlite"], paths=("{cwd}/nosuch.sqlite",)))
    add(Case("calibrate-store-junk", ["calibrate", "store={fx}/store_junk.sqlite"]))
    add(Case("calibrate-garbage-file", ["calibrate", "{fx}/garbage.csv"]))
    add(Case("calibrate-output-no-folder", ["calibrate", g[0], "output=nosuch/t.yaml"]))
    add(Case("calibrate-wrong-topology", ["calibrate", g[0], "topology=a100-1x8-nvswitch"]))
    add(Case("topologies-extra-key", ["topologies", "name=x"]))
    add(Case("parse-nothing", ["parse"]))
    add(Case("parse-file-missing", ["parse", "nosuch.txt"]))
    add(Case("parse-garbage-strict", ["parse", "{fx}/garbage.csv", "lenient=false"]))
    add(Case("parse-folder", ["parse", "{fx}/adir"]))
    add(Case("detect-nothing", ["detect"]))
    add(Case("detect-file-missing", ["detect", "nosuch.log"]))
    add(Case("detect-no-nccl-lines", ["detect", "{fx}/nothing.log"]))
    add(Case("detect-output-not-yaml", ["detect", "{fx}/nothing.log", "-o", "out.txt"]))
    add(Case("detect-o-without-file", ["detect", "{fx}/nothing.log", "-o"]))
    add(Case("detect-preset-unknown", ["detect", "{fx}/nothing.log", "preset=nosuch"]))
    add(Case("detect-name-bad", ["detect", "{fx}/nothing.log", "name=a b"]))
    add(Case("profile-nothing", ["profile"]))
    add(Case("profile-file-missing", ["profile", "nosuch.log"]))
    add(Case("profile-no-calls", ["profile", "{fx}/nothing.log"]))
    add(Case("profile-steps-negative", ["profile", "{fx}/nothing.log", "steps=-1"]))
    add(Case("profile-output-not-yaml", ["profile", "{fx}/nothing.log", "-o", "out.txt"]))
    add(Case("profile-garbage-json", ["profile", "{fx}/broken.json"]))

    # hydra grammar
    add(Case("grammar-sweep-values", ["decisions", "collective=allreduce,allgather"]))
    add(Case("grammar-hydra-key", ["decisions", "hydra.run.dir=x"]))
    add(Case("grammar-unclosed-list", ["decisions", "min_bytes=[1"]))
    add(Case("grammar-interpolation", ["decisions", "topology=${oc.env:NCCLRL_AUDIT_UNSET}"]))
    add(Case("grammar-unknown-command", ["nosuchcommand"]))
    return c


def fingerprints_disagree(res: Result, base: Path) -> tuple[str, str] | None:
    """``show`` of the JSON, the manifest and the CSV: one table, one fingerprint (or each labelled)."""
    if res.rc not in (0, 1):
        return "wrong exit", f"exit status {res.rc}: {first_line(res)[:120]}"
    manifest = json.loads((FX / "export" / "table" / "nccl_tuner.manifest").read_text())
    shown = re.findall(r"fingerprint ([0-9a-f]{16})", res.stdout)
    known = {manifest["fingerprint"]} | {v["fingerprint"] for v in manifest["files"].values()}
    stray = [f for f in shown if f not in known]
    if stray:
        return "help mismatch", (f"show prints fingerprint {stray[0]}, which neither the manifest's table "
                                 f"({manifest['fingerprint']}) nor any file of the write has")
    return None


FX = Path()  # the fixtures folder, set by main()


def run_case(case: Case, fx: Path, root: Path, i: int) -> tuple[Case, Result, str, str]:
    base = root / f"{i:03d}-{case.name}"
    if case.argv == ["plugin-online-mode"]:
        res = plugin_online_mode(fx, base)
    else:
        res, _cwd = run_one(case.argv, fx, base, case.env, case.setup, case.timeout, case.stdin, case.paths)
    (base / "argv").write_text(" ".join(fill(a, fx, base / "work") for a in case.argv))
    cls, why = judge(case, res, fx, base)
    (base / "stdout").write_text(res.stdout)  # beside the case's folders: kept with --keep
    (base / "stderr").write_text(res.stderr)
    return case, res, cls, why


def plugin_online_mode(fx: Path, base: Path) -> Result:
    """The plugin's online mode read from ``NCCLRL_TUNER_MODE=onlin``: the plugin's own test driver
    (plugin/tests/drive.c) plays NCCL for one communicator; its log lines are on stdout."""
    base.mkdir(parents=True)
    build = fx / "plugin-drive"
    t0 = time.monotonic()
    r = subprocess.run(["make", "--no-print-directory", "-C", str(REPO / "plugin"), f"BUILD={build}", "drive"],
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        return Result(r.returncode, r.stdout, r.stderr, time.monotonic() - t0, [])
    env = dict(os.environ, NCCLRL_TUNER_MODE="onlin", NCCLRL_TUNER_TABLE_DATA="allreduce,0,65535,ring,simple,2,1,4\n")
    p = subprocess.run([str(build / "drive"), str(build / "libnccl-tuner-ncclrl.so")], cwd=base, env=env,
                       input="init 0 5 4 1 1\ncall 0 4 4096\nfini 0\n", capture_output=True, text=True,
                       timeout=60)
    return Result(p.returncode, p.stdout, p.stderr, time.monotonic() - t0, [])


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def shown(argv: list[str]) -> str:
    text = " ".join(shlex.quote(a) for a in ["ncclrl", *argv])
    text = re.sub(r"grid=\[[^\]]{200,}\]", f"grid=[$SHARED/{NCCLTESTS.relative_to(SHARED)}/*.txt (30 files)]", text)
    return text.replace(str(SHARED), "$SHARED").replace(str(REPO), ".")


def main(argv: list[str] | None = None) -> int:
    global FX
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=2, help="cases run at once (default 2)")
    ap.add_argument("--only", default="", help="run only the cases whose name matches this regular expression")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folders (printed)")
    args = ap.parse_args(argv)
    if not NCCLTESTS.is_dir():
        print(f"bad_inputs: no recorded nccl-tests outputs at {NCCLTESTS}; set NCCLRL_SHARED_DATA", file=sys.stderr)
        return 2
    all_cases = cases()
    names = Counter(c.name for c in all_cases)
    dup = [n for n, k in names.items() if k > 1]
    if dup:
        print(f"bad_inputs: duplicate case names: {', '.join(dup)}", file=sys.stderr)
        return 2
    chosen = [c for c in all_cases if re.search(args.only, c.name)]
    root = Path(tempfile.mkdtemp(prefix="ncclrl-bad-inputs-"))
    FX = root / "fixtures"
    env = dict(os.environ, NCCLRL_PLUGIN_DIR=str(FX / "plugin"), MPLCONFIGDIR=str(FX / "mpl"),
               NCCLRL_SHARED_DATA=str(SHARED))
    t0 = time.monotonic()
    print(f"# {len(chosen)} cases, {args.jobs} at once; making the fixtures in {FX}", file=sys.stderr)
    make_fixtures(FX, env)
    results = []
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [pool.submit(run_case, c, FX, root, i) for i, c in enumerate(chosen)]
        for n, f in enumerate(futures, 1):
            case, res, cls, why = f.result()
            results.append((case, res, cls, why))
            print(f"# {n}/{len(chosen)} {case.name}: {cls}{(' (' + why + ')') if why else ''}", file=sys.stderr)
    counts = Counter(cls for _c, _r, cls, _w in results)
    print("| case | command | class | first stderr line |")
    print("|---|---|---|---|")
    for case, res, cls, why in results:
        label = cls if not why or cls == "clean" else f"{cls}: {why}"
        line = first_line(res) if case.kind not in ("help", "check") or cls != "clean" else ""
        line, label = (t.replace(str(root), "$TMP").replace(str(SHARED), "$SHARED").replace(str(REPO), ".")
                       for t in (line, label))
        print(f"| {case.name} | `{cell(shown(case.argv))}` | {cell(label)} | {cell(line[:240])} |")
    print()
    print("| class | cases |")
    print("|---|---|")
    for cls in CLASSES:
        if counts.get(cls):
            print(f"| {cls} | {counts[cls]} |")
    print(f"| all | {len(results)} |")
    print(f"\n# {len(results)} cases in {time.monotonic() - t0:.0f} s: "
          + ", ".join(f"{counts[k]} {k}" for k in CLASSES if counts.get(k)), file=sys.stderr)
    if args.keep:
        print(f"# kept {root}", file=sys.stderr)
    else:
        shutil.rmtree(root, ignore_errors=True)
    return 0 if counts.get("clean", 0) == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())

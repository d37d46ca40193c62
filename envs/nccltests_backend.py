"""Live NCCL measurements through the user's nccl-tests binaries.

Each configuration runs through NCCL's own mechanisms: per-process knobs as environment variables,
the per-call decision (algorithm, protocol, channels) through our tuner plugin and a one-row-per-
collective table. One launch covers every requested size of one configuration (``-b``/``-e``/``-f
2``); one launch is one sample (nccl-tests averages ``-n`` iterations), and samples are taken
round-robin over the configurations of a request, so NCCL's default and the candidates see the
same drift. A launch that exceeds its timeout, exits non-zero, prints an NCCL ``WARN``, wrong
results or a truncated table is reported as such for its points; nothing else is lost.

Launchers are command templates (``ncclrl/conf/launchers/*.yaml``): ``{binary}``, ``{args}``, ``{nranks}``,
``{gpus_per_proc}``, ``{env_flags}`` (``-x VAR`` for mpirun) are filled in.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

import yaml

from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.nccltests import NcclTestsError, parse_stdout
from ncclrl.costmodel.space import Point
from ncclrl.costmodel.table import format_row
from ncclrl.envs.backend import Backend
from ncclrl.envs.live import SAFE_ENV

PROGRAMS = {"allreduce": "all_reduce_perf", "allgather": "all_gather_perf", "reducescatter": "reduce_scatter_perf",
            "broadcast": "broadcast_perf", "reduce": "reduce_perf"}
LAUNCHER_DIR = Path(str(files("ncclrl.conf"))) / "launchers"


@dataclass
class Launcher:
    name: str
    template: str
    gpus_per_proc: str = "all"  # "all": one process drives every GPU (-g N); "1": one process per GPU

    @classmethod
    def load(cls, name_or_path: str) -> Launcher:
        p = Path(name_or_path)
        if not p.suffix:
            p = LAUNCHER_DIR / f"{name_or_path}.yaml"
        if not p.exists():
            allowed = ", ".join(sorted(x.stem for x in LAUNCHER_DIR.glob("*.yaml")))
            raise ConfigError("launcher", f"unknown launcher {name_or_path!r}; allowed: {allowed} or a .yaml path")
        d = yaml.safe_load(p.read_text()) or {}
        if "template" not in d:
            raise ConfigError("launcher.template", f"{p} has no template")
        return cls(name=p.stem, template=str(d["template"]), gpus_per_proc=str(d.get("gpus_per_proc", "all")))


class NcclTestsBackend(Backend):
    """Measure points with nccl-tests.

    :param binary_dir: folder holding the user's ``*_perf`` binaries
    :param nranks: ranks of the job (GPUs)
    :param launcher: launcher name or template file (``local``, ``mpirun``, ``srun``)
    :param plugin: our tuner plugin (needed for forced per-call decisions)
    :param timeout_s: per launch
    :param iters, warmup: nccl-tests ``-n``/``-w``
    """

    name = "nccl-tests"
    launch = "nccl-tests"  # its own timing: the store's timing is eager

    def __init__(self, binary_dir: str | Path, nranks: int, launcher: str = "local", plugin: str | Path | None = None,
                 timeout_s: float = 120.0, iters: int = 20, warmup: int = 5, extra_env: dict | None = None) -> None:
        super().__init__()
        self.binary_dir = Path(binary_dir)
        if not self.binary_dir.is_dir():
            raise ConfigError("nccltests.binary_dir", f"not a folder: {self.binary_dir}; point it at the folder "
                              "holding all_reduce_perf and friends (nccl-tests' build/)")
        self.nranks, self.timeout_s, self.iters, self.warmup = nranks, timeout_s, iters, warmup
        self.launcher = Launcher.load(launcher)
        self.plugin = Path(plugin) if plugin else None
        self.extra_env = dict(extra_env or {})

    def _binary(self, collective: str) -> Path:
        b = self.binary_dir / PROGRAMS[collective]
        if not (b.exists() and os.access(b, os.X_OK)):
            raise ConfigError("nccltests.binary_dir", f"{b} is missing or not executable")
        return b

    def _command(self, binary: Path, lo: int, hi: int, env: dict[str, str]) -> list[str]:
        gpus = self.nranks if self.launcher.gpus_per_proc == "all" else 1
        args = f"-b {lo} -e {hi} -f 2 -g {gpus} -n {self.iters} -w {self.warmup} -c 0"
        cmd = self.launcher.template.format(binary=shlex.quote(str(binary)), args=args, nranks=self.nranks,
                                            gpus_per_proc=gpus,
                                            env_flags=" ".join(f"-x {k}" for k in sorted(env)))
        return shlex.split(cmd)

    def launch_once(self, collective: str, sizes: list[int], config: Point, workdir: Path) -> dict[int, float]:
        """One launch: ``{size: time_us}`` (out-of-place); :class:`LaunchError` with a one-line reason
        when it times out, fails, or prints something that is not a complete, correct run."""
        env = dict(os.environ, **SAFE_ENV, **config.env(), **self.extra_env)
        if not config.is_default:
            if self.plugin is None or not self.plugin.exists():
                raise ConfigError("plugin", "forcing a per-call decision needs our tuner plugin "
                                  "(`ncclrl plugin build`)")
            table = workdir / f"table-{config.algo}-{config.proto}-{config.channels}.csv"
            table.write_text(format_row(collective, 0, "max", config.algo, config.proto, config.channels) + "\n")
            env.update(NCCL_TUNER_PLUGIN=str(self.plugin.resolve()), NCCLRL_TUNER_TABLE=str(table))
        else:
            env["NCCL_TUNER_PLUGIN"] = "none"
        cmd = self._command(self._binary(collective), min(sizes), max(sizes), {k: env[k] for k in env
                                                                               if k.startswith("NCCL")})
        try:
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            raise LaunchError(f"timed out after {self.timeout_s:.0f} s (NCCL hung?)") from None
        except OSError as e:
            raise LaunchError(f"could not start {cmd[0]}: {e.strerror}") from None
        try:
            run = parse_stdout(p.stdout, source=f"{cmd[0]} ({config.algo}/{config.proto}/{config.channels})")
        except NcclTestsError as e:
            tail = (p.stderr.strip().splitlines() or [""])[-1]
            raise LaunchError(f"exit {p.returncode}: {e}" + (f"; stderr: {tail}" if tail else "")) from None
        if p.returncode != 0:
            raise LaunchError(f"exit {p.returncode}: {(p.stderr.strip().splitlines() or ['no stderr'])[-1]}")
        if run.version:
            self.nccl_version = run.version
        return {r.nbytes: r.out_of_place.time_us for r in run.records if r.out_of_place is not None}

    def measure(self, points: list[Point], samples: int = 5, budget_us: float = 0.0) -> list[list[float] | None]:
        """Samples per point (one per launch), round-robin over the request's configurations."""
        self.failures = {}
        groups: dict[tuple, list[int]] = {}
        for i, p in enumerate(points):
            key = (p.collective, p.algo, p.proto, p.channels, *p.knobs)
            groups.setdefault(key, []).append(i)
        out: list[list[float]] = [[] for _ in points]
        dead: set[tuple] = set()
        with tempfile.TemporaryDirectory(prefix="ncclrl-nccltests-") as tmp:
            for _ in range(samples):
                for key, idx in groups.items():
                    if key in dead:
                        continue
                    cfg = points[idx[0]]
                    try:
                        t = self.launch_once(cfg.collective, [points[i].nbytes for i in idx], cfg, Path(tmp))
                    except LaunchError as e:
                        dead.add(key)
                        for i in idx:
                            self.failures[i] = str(e)
                        continue
                    for i in idx:
                        if points[i].nbytes in t:
                            out[i].append(t[points[i].nbytes])
        self.last_modes = ["eager"] * len(points)
        return [o if (o and i not in self.failures) else None for i, o in enumerate(out)]

    def close(self) -> None:
        pass


class LaunchError(RuntimeError):
    """One nccl-tests launch failed; the message is one line."""

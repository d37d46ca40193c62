"""``ncclrl profile INPUT... -o job-profile.yaml``: what a training job calls, per step."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.profile import build_profile, dump_profile, load_profile, summary
from ncclrl.runners.config import Command, register


@dataclass
class ProfileConfig:
    """Read what a training job calls and write its profile: per collective, bytes per call as
    NCCL's tuner sees them, communicator shape (nodes x ranks) and data type, the calls and bytes
    per step, and whether the calls overlap compute (unknown unless a GPU trace says). Inputs are
    recognised by their content: ``NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL`` logs (add ``INIT`` for
    the node counts), PyTorch profiler Chrome traces (``.json`` or ``.json.gz``, one per rank),
    flight recorder JSON dumps, and the request logs of ncclrl's tuner plugin
    (``NCCLRL_TUNER_REQUEST_LOG=PREFIX``: one file per rank and communicator). Steps come from the
    traces' ``ProfilerStep#N`` spans, else from ``steps``, else from the repeating pattern of calls
    per communicator (calls before it and a few after it, such as a closing barrier, left out).

    :param inputs: NCCL logs, profiler traces, flight recorder JSON dumps or plugin request logs of one job
    :param output: write the profile (YAML) here (``-o FILE`` works too); empty: only print
    :param steps: training steps the inputs cover (0: find them)
    """

    inputs: list[str] = field(default_factory=list)
    output: str | None = None
    steps: int = 0

    def check(self) -> None:
        for f in self.inputs:
            if not Path(f).is_file():
                raise ConfigError("inputs", f"no such file: {f}")
        if self.output and not str(self.output).endswith((".yaml", ".yml")):
            raise ConfigError("output", f"must end with .yaml or .yml, got {self.output!r}")
        if self.output and not Path(self.output).resolve().parent.is_dir():
            raise ConfigError("output", f"no such folder: {Path(self.output).parent}")
        if self.steps < 0:
            raise ConfigError("steps", f"must be >= 0, got {self.steps}")


def main_profile(cfg) -> int:
    if not cfg.inputs:
        raise ConfigError("inputs", "no input given: ncclrl profile INPUT... -o job-profile.yaml")
    prof = build_profile(list(cfg.inputs), steps=cfg.steps)
    for line in summary(prof):
        print(line)
    if cfg.output:
        out = Path(cfg.output)
        tmp = out.with_name(f".{out.stem}.profile-tmp.yaml")
        try:
            dump_profile(prof, tmp)
            load_profile(tmp)  # what reads it back, checked before the file appears
            tmp.replace(out)
        finally:
            tmp.unlink(missing_ok=True)
        print(f"# wrote {out}")
    return 0


COMMAND = Command("profile", ProfileConfig, main_profile,
                  "what a training job calls per step, from NCCL logs, PyTorch traces or plugin logs: a profile YAML",
                  positional="inputs")
register(COMMAND)

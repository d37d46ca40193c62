"""The recorded hosts and public grids the stopping agent is replayed on, each with fresh job
noise per run (:mod:`ncclrl.agents.suite`)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent

#: recorded host sweeps: name -> (stores, the first holding the sweep; topology; launch)
HOSTS: dict[str, tuple[tuple[str, ...], str, str]] = {
    "h200-2x2-sock": (("data/h200x4-2026-11-21/store.sqlite", "data/h200x4-2026-11-28/repeats/sweep.sqlite"),
                      "h200-2x2-sock", "nccl"),
    "h200-2x1-sock": (("data/h200x2-2026-11-22/store.sqlite",), "h200-2x1-sock", "nccl"),
    "h200-4x1-sock": (("data/h200x4-2026-11-28/knobs/4x1.sqlite",), "h200-4x1-sock", "nccl"),
    "h200-2x2-sock:knobs": (("data/h200x4-2026-11-28/knobs/2x2.sqlite",), "h200-2x2-sock", "nccl"),
    "h200-1x4": (("data/h200x4-2026-11-28/knobs/1x4.sqlite",), "h200-1x4", "nccl"),
}
#: public grids (read from the shared data folder, never shipped)
GRIDS = ("p5en-2n", "p5en-16n", "p5en-128n", "a100-1x8-step", "a100-2x4-step", "a100-4x2-step")
RECORDINGS = (*HOSTS, *GRIDS)


def available(name: str) -> bool:
    """Whether the recording can be read here (a host's stores exist; a grid's folder is present)."""
    if name in HOSTS:
        return all((ROOT / s).is_file() for s in HOSTS[name][0])
    from ncclrl.envs.grids import shared_data_dir

    return (shared_data_dir() / "public-grids").is_dir()


def recorded_instance(name: str):
    """The recording ``name`` as a benchmark instance (its truth, fresh job noise per seed)."""
    from ncclrl.agents.suite import public_gridded, replayed
    from ncclrl.costmodel.platforms import FAMILIES

    if name in HOSTS:
        stores, topo, launch = HOSTS[name]
        inst = replayed([str(ROOT / s) for s in stores], topo, launch, "allreduce")
        if inst.family not in FAMILIES:  # a preset no family of the generator draws: by its network
            inst.family = "socket" if inst.problem.topo.net.kind == "socket" else "nvlink"
        inst.name = name
        return inst
    inst = public_gridded(name)
    inst.name = name
    return inst

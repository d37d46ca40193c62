"""``ncclrl composer``: train the PPO job composer (``ncclrl finetune strategy=ppo``) in simulation
and judge it beside the baselines on problems it never trained on:

    ncclrl composer run_dir=runs/composer            # about 10 min on one core at the defaults

Training problems come from seed stream ``train_stream``, judged ones from ``judge_stream``
(:func:`ncclrl.agents.compose.draw_problems`); TensorBoard curves go to ``run_dir/tensorboard``;
``run_dir/composer.json`` + ``composer.npz`` is what ``finetune strategy=PATH/composer.json`` loads.
What the composer is and how the shipped one was chosen: docs/explanation/composer.md.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from omegaconf import DictConfig, OmegaConf

from ncclrl.agents.compose import BASELINES, ci95, draw_problems, play
from ncclrl.agents.compose_train import NO_CURVES, TrainConfig
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.units import plural
from ncclrl.runners.config import Command, register

log = logging.getLogger(__name__)


@dataclass
class ComposerTrain(TrainConfig):
    """MaskablePPO's settings for the composer, as ``ncclrl composer`` takes them.

    :param tensorboard: folder for SB3's TensorBoard curves (empty: RUN_DIR/tensorboard; none: no curves)
    """


def _creatable(key: str, folder: str) -> None:
    """The folder ``folder`` exists or can be made (no file in the way): else one line naming ``key``."""
    probe = Path(folder).expanduser()
    if probe.is_file():
        raise ConfigError(key, f"{folder} is a file; name a folder")
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError(key, f"cannot create {folder}: {probe} is a file, not a folder")


@dataclass
class ComposerCommand:
    """Train the PPO job composer on simulated problems and judge it on others.

    :param run_dir: where the composer, its TensorBoard curves and the judgement go
    :param problems: training problems (seed stream train_stream)
    :param judge: judged problems (seed stream judge_stream; 0: no judgement)
    :param draws: noise draws per judged problem
    :param train_stream: seed stream of the training problems
    :param judge_stream: seed stream of the judged problems (never the training one)
    :param train: MaskablePPO's settings: train.total_timesteps, train.seed, train.paired, ...
    """

    run_dir: str = "runs/composer"
    problems: int = 600
    judge: int = 60
    draws: int = 2
    train_stream: int = 1
    judge_stream: int = 2
    train: ComposerTrain = field(default_factory=ComposerTrain)

    def check(self) -> None:
        if self.problems < 1:
            raise ConfigError("problems", f"must be >= 1, got {self.problems}")
        if self.judge < 0 or self.draws < 1:
            raise ConfigError("judge", f"judge >= 0 and draws >= 1, got {self.judge}, {self.draws}")
        if self.train_stream == self.judge_stream:
            raise ConfigError("judge_stream", f"must differ from train_stream ({self.train_stream})")
        TrainConfig(**asdict(self.train))  # every setting checked before anything is drawn or written
        if self.train.tensorboard not in ("", NO_CURVES):
            _creatable("train.tensorboard", self.train.tensorboard)


def run_composer(args: DictConfig) -> dict:
    """Run ``ncclrl composer``; returns (and writes to ``run_dir/judge.json``) the judgement."""
    from ncclrl.agents.compose_train import train

    run_dir = Path(args["run_dir"])
    tc = OmegaConf.to_object(args["train"]) if isinstance(args["train"], DictConfig) else args["train"]
    tc = TrainConfig(**{**asdict(tc), "tensorboard": tc.tensorboard or str(run_dir / "tensorboard")})
    t0 = time.time()
    log.info("# drawing %s (seed stream %d)", plural(int(args["problems"]), "training problem"),
             int(args["train_stream"]))
    made = not run_dir.exists()
    try:
        pol = train(draw_problems(int(args["problems"]), int(args["train_stream"])), tc, log=log.info)
        run_dir.mkdir(parents=True, exist_ok=True)
        path = pol.save(run_dir / "composer.json")
    except Exception:
        if made:  # a failed training leaves no folder of its own behind (its curves included)
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    out: dict = {"composer": str(path), "train_s": round(time.time() - t0, 1)}
    if int(args["judge"]):
        judged = draw_problems(int(args["judge"]), int(args["judge_stream"]))
        methods = {**{n: m for n, m in BASELINES.items()}, "ppo": lambda: pol}
        per = {n: np.array([np.mean([play(p, make(), d).net_value for d in range(int(args["draws"]))])
                            for p in judged]) for n, make in methods.items()}
        best = max((n for n in per if n not in ("ppo", "random")), key=lambda n: per[n].mean())
        out["net_value"] = {n: [round(x, 3) for x in ci95(v)] for n, v in per.items()}
        out["best_baseline"] = best
        out["ppo_minus_best"] = [round(x, 3) for x in ci95(per["ppo"] - per[best])]
        # the judgement is the command's report: stdout (the progress above went to stderr)
        for n, (mu, lo, hi) in sorted(out["net_value"].items(), key=lambda x: -x[1][0]):
            print(f"# {n:<10} net value {mu:+.2f} points [95% {lo:+.2f}, {hi:+.2f}]", flush=True)
        mu, lo, hi = out["ppo_minus_best"]
        print(f"# ppo minus the best baseline ({best}): {mu:+.2f} [{lo:+.2f}, {hi:+.2f}] on "
              f"{plural(len(judged), 'problem')} it never trained on x {plural(int(args['draws']), 'draw')}",
              flush=True)
    (run_dir / "judge.json").write_text(json.dumps(out, indent=1) + "\n")
    if Path(tc.tensorboard).is_dir():  # its training curves (train.tensorboard=none: none written)
        from ncclrl.agents.plots import plot_composer_curves

        print(f"# training curves: {plot_composer_curves(tc.tensorboard, run_dir / 'training.png')['path']}",
              flush=True)
    print(f"# composer: {path} (finetune strategy={path})", flush=True)
    return out


def main_composer(args: DictConfig) -> int:
    run_composer(args)
    return 0


COMMAND = Command("composer", ComposerCommand, main_composer,
                  "train the PPO job composer (finetune strategy=ppo) in simulation, judge it on unseen problems",
                  out_key="run_dir")
register(COMMAND)

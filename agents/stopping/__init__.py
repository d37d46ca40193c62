"""The stopping agent: a policy choosing, after finetune's screen, to confirm more, explore a knob
setting or stop (docs/explanation/stopping.md). Import :mod:`ncclrl.agents.stopping.env` for its
Gymnasium environment and :mod:`ncclrl.agents.stopping.train` to train one."""

from ncclrl.agents.stopping.controller import ACTIONS, FEATURES, N_FEATURES, StopController
from ncclrl.agents.stopping.policy import PolicyStopper
from ncclrl.agents.stopping.run import (
    ReplayProblem,
    RunResult,
    SimulatedProblem,
    TuningProblem,
    horizon_sweeps,
    judge,
    rule_config,
    run_once,
)

__all__ = ["ACTIONS", "FEATURES", "N_FEATURES", "PolicyStopper", "ReplayProblem", "RunResult", "SimulatedProblem",
           "StopController", "TuningProblem", "horizon_sweeps", "judge", "rule_config", "run_once"]

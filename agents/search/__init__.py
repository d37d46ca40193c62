"""The search strategy of a tuning run: what to measure next, when to stop, and what the
measurements support. One module a part: :mod:`.space`, :mod:`.model` (the model and its
statistics), :mod:`.decision`, :mod:`.controllers`, :mod:`.run`, and :mod:`.confirm` (screen,
confirm, then explore: ``ncclrl finetune``'s default, with its own job plan and test); their
public names are here.

A tuning run (:class:`Search`) works over every point of a problem (:class:`Space`: knob setting x
per-call configuration x collective x size). Three parts, each replaceable:

1. **The model** (:class:`Model`): the prior simulator's log time plus a Bayesian linear
   correction learned from the measurements (features: algorithm/protocol, channel level, knob
   setting, and their trends over size), plus each point's own misfit. Every point gets a posterior
   mean and standard deviation of its log time; a measured point is pulled towards its
   measurements. With no measurement this is the prior.
2. **The controller** picks the next point to measure from a shortlist of candidates, each
   described by :data:`FEATURES` (its predicted gain over the best known point of its cell and
   over the current table, its uncertainty and expected improvement, its knob setting's
   potential and coverage, whether NCCL's choice next to it is measured, the budget left), or
   stops. :class:`PolicyController` is the learned strategy (a PPO-trained network scoring each
   candidate alike, shipped as weights + JSON); :class:`RankController` ranks by the model's
   predicted gain (the learner removed); :class:`EIController` by expected improvement (Bayesian
   optimization with the same prior and model).
3. **The decision** (:func:`decide`), one rule for rows and knob settings, on measured points
   only: a row replaces NCCL's choice, and a knob setting NCCL's defaults, only where the points
   are measured and, from the measurements alone (:func:`estimate`: job medians, each job's
   shift a random effect, within-job pairs compared within their job), the probability that it
   is at least ``delta`` faster exceeds ``1 - alpha`` (:class:`DecisionConfig`). The noise is the
   run's own (:func:`fit_noise`: REML over its repeated measurements, with a stated prior).

Points are picked one at a time and measured in rounds of ``round_points`` (one job per knob
setting in the round), after which the model is refit and the decision redone. The first round is
fixed: NCCL's plain defaults at every size, then the zero-shot table (:func:`zero_shot`, the exact
argmin of the prior) next to NCCL's choice under its knob setting.
"""

from __future__ import annotations

from ncclrl.agents.search.confirm import (
    ConfirmConfig,
    ConfirmController,
    PairedTest,
    paired_test,
)
from ncclrl.agents.search.controllers import (
    PICKLED_SUFFIXES,
    SHIPPED,
    Controller,
    EIController,
    JobController,
    PerGpuSecondController,
    PolicyController,
    RankController,
    strategy_path,
)
from ncclrl.agents.search.decision import (
    Z95,
    DecisionConfig,
    Table,
    decide,
    zero_shot,
    zero_shot_within,
)
from ncclrl.agents.search.model import (
    Estimate,
    Measurements,
    Model,
    ModelConfig,
    Noise,
    estimate,
    fit_noise,
    measurements,
    prior_noise,
    same_as_nccl,
)
from ncclrl.agents.search.run import (
    Result,
    Search,
    SearchConfig,
)
from ncclrl.agents.search.space import (
    FEATURES,
    GAIN_SCALE,
    N_FEATURES,
    Space,
)

__all__ = [
    "ConfirmConfig",
    "ConfirmController",
    "Controller",
    "DecisionConfig",
    "EIController",
    "Estimate",
    "FEATURES",
    "GAIN_SCALE",
    "JobController",
    "Measurements",
    "Model",
    "ModelConfig",
    "N_FEATURES",
    "Noise",
    "PICKLED_SUFFIXES",
    "PairedTest",
    "PerGpuSecondController",
    "PolicyController",
    "RankController",
    "Result",
    "SHIPPED",
    "Search",
    "SearchConfig",
    "Space",
    "Table",
    "Z95",
    "decide",
    "estimate",
    "fit_noise",
    "measurements",
    "paired_test",
    "prior_noise",
    "same_as_nccl",
    "strategy_path",
    "zero_shot",
    "zero_shot_within",
]

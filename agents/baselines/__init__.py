"""Tuners compared by ``ncclrl benchmark``: NCCL's default, the published approaches, and ncclrl,
all behind one interface (:class:`ncclrl.agents.baselines.base.Tuner`) and one budgeted evaluator."""

from ncclrl.agents.baselines.base import DEFAULT, Decision, Evaluator, Oracle, Problem, Tuner, sim_measure
from ncclrl.agents.baselines.ncclrl import NcclrlFinetuned, NcclrlPretrained
from ncclrl.agents.baselines.search import TUNERS
from ncclrl.costmodel.errors import ConfigError

METHODS = (*TUNERS, "ncclrl-pretrained", "ncclrl")


def make_tuner(name: str, model=None, **kwargs) -> Tuner:
    """A tuner by name (``METHODS``); the ncclrl ones need the pretrained ``model``."""

    if name in TUNERS:
        return TUNERS[name](**kwargs)
    if name in ("ncclrl-pretrained", "ncclrl"):
        if model is None:
            raise ConfigError("checkpoint", f"method {name} needs a pretrained policy (checkpoint=PATH/policy.zip)")

        return (NcclrlPretrained if name == "ncclrl-pretrained" else NcclrlFinetuned)(model, **kwargs)
    raise ConfigError("methods", f"unknown method {name!r}; allowed: {', '.join(METHODS)}")


__all__ = ["DEFAULT", "METHODS", "Decision", "Evaluator", "Oracle", "Problem", "Tuner", "make_tuner", "sim_measure"]

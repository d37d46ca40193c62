"""Tuners compared by ``ncclrl benchmark``: NCCL's default, the published approaches, and ncclrl,
all behind one interface (:class:`ncclrl.agents.baselines.base.Tuner`) and one budgeted evaluator."""

from ncclrl.agents.baselines.base import DEFAULT, Decision, Evaluator, Oracle, Problem, Tuner, sim_measure
from ncclrl.agents.baselines.ncclrl import SearchTuner, ZeroShot, composer_tuner, search_tuner
from ncclrl.agents.baselines.search import TUNERS
from ncclrl.agents.search import PolicyController, SearchConfig
from ncclrl.costmodel.errors import ConfigError

METHODS = (*TUNERS, "zero-shot", "bo", "ei-per-s", "ucb-per-s", "jobs", "confirm", "rank", "ncclrl", "ppo", "kg-jobs")


def make_tuner(name: str, strategy: PolicyController | None = None, search: SearchConfig | None = None) -> Tuner:
    """A tuner by name (``METHODS``); ``ncclrl`` needs a trained ``strategy``."""
    if name in TUNERS:
        return TUNERS[name]()
    if name == "zero-shot":
        return ZeroShot()
    if name in ("bo", "ei-per-s", "ucb-per-s", "jobs", "confirm", "rank", "ncclrl"):
        if name == "ncclrl" and strategy is None:
            raise ConfigError("strategy", "method ncclrl needs a trained strategy (strategy=PATH/strategy.json)")
        return search_tuner(name, strategy, search)
    if name in ("ppo", "kg-jobs"):
        return composer_tuner(name, search)
    raise ConfigError("methods", f"unknown method {name!r}; allowed: {', '.join(METHODS)}")


__all__ = ["DEFAULT", "METHODS", "Decision", "Evaluator", "Oracle", "Problem", "SearchTuner", "Tuner", "make_tuner",
           "sim_measure"]

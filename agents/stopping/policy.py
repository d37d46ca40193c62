"""The trained stopping agent as numpy: an MLP from the observation to one logit per action,
invalid actions masked, the most probable valid action taken; weights ``.npz`` + ``.json``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ncclrl.agents import mlp
from ncclrl.agents.stopping.controller import ACTIONS, FEATURES, N_FEATURES
from ncclrl.costmodel.errors import ConfigError

SHIPPED = Path(__file__).resolve().parent.parent / "pretrained" / "stopper.json"


class PolicyStopper:
    """``(observation, mask) -> action`` of a trained agent.

    :param layers: (weight, bias) per layer, the last one the action logits
    :param meta: what its JSON says (features, actions, training settings)
    """

    def __init__(self, layers: mlp.Layers, meta: dict[str, Any]) -> None:
        if not layers or layers[0][0].shape[0] != N_FEATURES or layers[-1][0].shape[1] != len(ACTIONS):
            raise ConfigError("stopper", f"weights must map {N_FEATURES} features to {len(ACTIONS)} actions")
        self.layers, self.meta = layers, meta

    def __call__(self, obs: np.ndarray, mask: np.ndarray) -> int:
        z = np.where(mask, mlp.forward(self.layers, obs), -np.inf)
        return int(np.argmax(z))

    def save(self, path: str | Path) -> Path:
        return mlp.save(path, self.layers, {**self.meta, "features": list(FEATURES), "actions": list(ACTIONS)})

    @classmethod
    def load(cls, path: str | Path = SHIPPED) -> PolicyStopper:
        layers, meta = mlp.load(path, "stopper", "train one with docs/results/scripts/stopping_experiment.py train")
        if meta.get("features") != list(FEATURES) or meta.get("actions") != list(ACTIONS):
            raise ConfigError("stopper", f"{path} was trained on other features or actions; train it again")
        return cls(layers, meta)


def is_stopper(path: str | Path | None) -> bool:
    """Whether the JSON at ``path`` is a stopping agent's (its actions are :data:`ACTIONS`)."""
    if path is None:
        return False
    p = Path(path)
    if p.suffix.lower() == ".npz":
        p = p.with_suffix(".json")
    try:
        return json.loads(p.read_text()).get("actions") == list(ACTIONS)
    except (OSError, ValueError, AttributeError):
        return False

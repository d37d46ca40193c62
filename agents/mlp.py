"""The small networks ncclrl ships (strategy, job composer, online policy): tanh hidden layers, a
linear output, evaluated in numpy; weights as an ``.npz`` of plain arrays (``w0, b0, w1, b1, ...``)
beside a JSON of metadata, never a pickle."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ncclrl.costmodel.errors import ConfigError

Layers = list[tuple[np.ndarray, np.ndarray]]


def forward(layers: Layers, x: np.ndarray) -> np.ndarray:
    """The network's output for ``x`` (one row or a batch): tanh after every layer but the last."""
    h = np.asarray(x, dtype=np.float64)
    for w, b in layers[:-1]:
        h = np.tanh(h @ w + b)
    w, b = layers[-1]
    return h @ w + b


def save(path: str | Path, layers: Layers, meta: dict[str, Any]) -> Path:
    """Write ``path``'s ``.npz`` (the weights) and ``.json`` (``meta`` and the layer count); returns the JSON."""
    js = Path(path).with_suffix(".json")
    js.parent.mkdir(parents=True, exist_ok=True)
    arrays = {f"w{i}": w for i, (w, _) in enumerate(layers)} | {f"b{i}": b for i, (_, b) in enumerate(layers)}
    np.savez(js.with_suffix(".npz"), **arrays)
    js.write_text(json.dumps(dict(meta, layers=len(layers)), indent=1) + "\n")
    return js


def load(path: str | Path, key: str, hint: str) -> tuple[Layers, dict[str, Any]]:
    """The weights and metadata :func:`save` wrote at ``path``; a missing file is one
    :class:`ConfigError` on ``key``, ending with ``hint`` (how to make one)."""
    js = Path(path).with_suffix(".json")
    if not js.is_file() or not js.with_suffix(".npz").is_file():
        raise ConfigError(key, f"no weights at {js} (+ .npz); {hint}")
    meta = json.loads(js.read_text())
    with np.load(js.with_suffix(".npz"), allow_pickle=False) as z:
        layers = [(z[f"w{i}"], z[f"b{i}"]) for i in range(int(meta["layers"]))]
    return layers, meta


def policy_layers(model) -> Layers:
    """The policy network of an SB3 actor-critic ``model`` (an MLP extractor of linear layers and
    its action head) as numpy layers for :func:`forward`."""
    import torch

    def arrays(m) -> tuple[np.ndarray, np.ndarray]:
        return m.weight.detach().numpy().T.astype(np.float64), m.bias.detach().numpy().astype(np.float64)

    net = model.policy.mlp_extractor.policy_net
    return [*(arrays(m) for m in net if isinstance(m, torch.nn.Linear)), arrays(model.policy.action_net)]

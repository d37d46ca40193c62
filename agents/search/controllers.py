"""What picks the next point of a tuning run, or composes its next job: the
:class:`Controller` protocol and its implementations, the learned one included
(:class:`PolicyController`)."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ncclrl.agents import mlp
from ncclrl.agents.search.space import FEATURES, N_FEATURES
from ncclrl.costmodel.errors import ConfigError

# -- controllers -------------------------------------------------------------------------------


class Controller(Protocol):
    """Scores a shortlist: ``feats`` (rows, :data:`FEATURES`), the last row being *stop*;
    returns one score per row (the highest valid one is taken)."""

    name: str

    def scores(self, feats: np.ndarray) -> np.ndarray: ...


class RankController:
    """The model's ranking: the candidate with the largest predicted gain over its cell's best
    known point; never stops before the budget does (the learner removed)."""

    name = "rank"

    def scores(self, feats: np.ndarray) -> np.ndarray:
        s = feats[:, FEATURES.index("gain")].copy()
        s[-1] = -np.inf
        return s


class EIController:
    """Expected improvement over the cell's best known point (Bayesian optimization with the
    prior as mean and the same model); never stops before the budget does."""

    name = "ei"

    def scores(self, feats: np.ndarray) -> np.ndarray:
        s = feats[:, FEATURES.index("ei")].copy()
        s[-1] = -np.inf
        return s


class PerGpuSecondController:
    """Cost-aware Bayesian optimization with the same prior and model: expected improvement
    (``ei``) or an upper confidence bound on the gain over the current table (``ucb``: predicted
    gain + ``beta`` sd, floored at 0) per GPU-second the measurement is predicted to cost (the
    point's calls at its predicted time, plus a job's launch when no pending point shares its knob
    setting); never stops before the budget does.

    :param acquisition: ei or ucb
    :param beta: ucb's weight of the posterior sd
    """

    def __init__(self, acquisition: str = "ei", beta: float = 2.0) -> None:
        if acquisition not in ("ei", "ucb"):
            raise ConfigError("acquisition", f"unknown {acquisition!r}; allowed: ei, ucb")
        if not beta >= 0:
            raise ConfigError("beta", f"must be >= 0, got {beta}")
        self.acquisition, self.beta = acquisition, float(beta)
        self.name = f"{acquisition}/s"

    def scores_for(self, acq: dict[str, np.ndarray]) -> np.ndarray:
        """One score per shortlist entry from :attr:`Search.acquisition`, the stop row last (-inf)."""
        if self.acquisition == "ei":
            value = acq["ei"]
        else:
            value = np.maximum(acq["gain"] + self.beta * acq["std"], 0.0)
        return np.append(value / np.maximum(acq["gpu_s"], 1e-9), -np.inf)

    def scores(self, feats: np.ndarray) -> np.ndarray:  # the Controller protocol; Search calls scores_for
        raise NotImplementedError("PerGpuSecondController scores through scores_for (Search.acquisition)")


class JobController:
    """Composes whole jobs instead of picking points: each job runs the knob setting whose job is
    worth most per GPU-second (its expected improvement over the current table, its launch
    included: :meth:`Search.compose_job`). A setting not yet measured is swept whole in one job
    (measurements are nearly free next to a job's launch on most clusters, so this is a sweep in
    the order the model ranks settings); once every setting is swept, a job re-measures, under
    one setting, the candidates whose expected improvement per GPU-second beats the job's, with
    NCCL's choice at each of their sizes in the same job (the comparison the decision reads within
    one job). Never stops before the budget does.
    """

    name = "jobs"
    composes_jobs = True

    def scores(self, feats: np.ndarray) -> np.ndarray:  # the Controller protocol; Search composes jobs instead
        raise NotImplementedError("JobController composes jobs through Search.compose_job")


SHIPPED = "shipped"
# checkpoints that are pickles (stable-baselines3 .zip, torch .pt/.pth, plain pickles): never loaded
PICKLED_SUFFIXES = (".zip", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")


def strategy_path(name: str) -> Path:
    """A strategy's JSON: ``shipped`` is the one installed with ncclrl, anything else a path."""
    if name == SHIPPED:
        from importlib.resources import files

        return Path(str(files("ncclrl.agents") / "pretrained" / "strategy.json"))
    return Path(name)


class PolicyController:
    """The learned strategy: one network scores every candidate alike from its features (and the
    stop row from the run's), as trained by :func:`ncclrl.agents.strategy_train.train`. Loaded
    from ``strategy.json`` (architecture, features, provenance) and ``strategy.npz`` (weights);
    no pickle."""

    name = "policy"

    def __init__(self, layers: list[tuple[np.ndarray, np.ndarray]], meta: dict[str, Any]) -> None:
        if layers[0][0].shape[0] != N_FEATURES:
            raise ConfigError("strategy", f"the strategy expects {layers[0][0].shape[0]} features, "
                              f"this ncclrl gives {N_FEATURES}")
        self.layers, self.meta = layers, meta

    def scores(self, feats: np.ndarray) -> np.ndarray:
        return mlp.forward(self.layers, feats)[:, 0]

    def save(self, path: Path) -> Path:
        """Writes ``path`` (JSON) and its weights next to it (same name, ``.npz``)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(path.with_suffix(".npz"), **{f"w{i}": w for i, (w, _) in enumerate(self.layers)},
                 **{f"b{i}": b for i, (_, b) in enumerate(self.layers)})
        meta = dict(self.meta, format="ncclrl-strategy", version=1, features=list(FEATURES),
                    layers=[list(w.shape) for w, _ in self.layers], activation="tanh",
                    weights=path.with_suffix(".npz").name)
        path.write_text(json.dumps(meta, indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> PolicyController:
        """Read a strategy: JSON and an ``.npz`` of plain arrays (``allow_pickle=False``), so loading
        runs no code. A pickled checkpoint (stable-baselines3 ``.zip``, torch ``.pt``, ``.pkl``) is
        refused in one line, never unpickled."""
        path = Path(path)
        refuse = (f"{path} is a pickled checkpoint; ncclrl never loads pickles (loading one can run any code): "
                  "give the strategy.json (+ strategy.npz) that ncclrl pretrain writes")
        if path.suffix.lower() in PICKLED_SUFFIXES:
            raise ConfigError("strategy", refuse)
        if path.suffix.lower() == ".npz":  # a strategy's weights (plain arrays): the JSON beside them names them
            beside = path.with_suffix(".json")
            if not beside.is_file():
                raise ConfigError("strategy", f"{path} holds a strategy's weights (plain arrays); give the strategy "
                                  "JSON that names them (ncclrl pretrain writes strategy.json beside strategy.npz)")
            path = beside
        try:
            raw = path.read_bytes()
        except OSError as e:
            raise ConfigError("strategy", f"cannot read {path}: {e.strerror or e}") from None
        if raw[:2] in (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05") or raw[:4] == b"PK\x03\x04":
            raise ConfigError("strategy", refuse)
        try:
            meta = json.loads(raw.decode())
        except (UnicodeDecodeError, ValueError) as e:
            raise ConfigError("strategy", f"cannot read {path}: not JSON ({e})") from None
        if not isinstance(meta, dict) or meta.get("format") != "ncclrl-strategy" or meta.get("version") != 1:
            raise ConfigError("strategy", f"{path} is not an ncclrl strategy (format ncclrl-strategy, version 1)")
        if list(meta.get("features", [])) != list(FEATURES):
            raise ConfigError("strategy", f"{path} was trained on other features: {meta.get('features')}")
        weights = path.parent / str(meta.get("weights", ""))
        if weights.suffix != ".npz" or weights.parent != path.parent:
            raise ConfigError("strategy", f"{path}: weights must name an .npz beside it, got {meta.get('weights')!r}")
        try:
            with np.load(weights, allow_pickle=False) as z:
                layers = [(z[f"w{i}"].astype(float), z[f"b{i}"].astype(float)) for i in range(len(meta["layers"]))]
        except (OSError, ValueError, KeyError, TypeError, AttributeError, zipfile.BadZipFile) as e:
            raise ConfigError("strategy", f"cannot read the weights {weights}: {e} (plain arrays only, no "
                              "pickled objects)") from None
        return cls(layers, meta)

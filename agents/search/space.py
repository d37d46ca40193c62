"""The space of a tuning run: every point (knob setting x per-call configuration x collective x
size) and what the controllers see of a point (:data:`FEATURES`)."""

from __future__ import annotations

import math

import numpy as np

from ncclrl.agents.problem import Decision, Problem
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.space import DEFAULT, Key, point_configs

FEATURES = ("gain", "std", "ei", "gain_vs_table", "in_table_knob", "knob_potential", "knob_coverage",
            "is_default", "times_measured", "default_measured", "is_cell_row", "row_confidence",
            "budget_left", "log_budget", "size_pos", "is_stop")
N_FEATURES = len(FEATURES)
GAIN_SCALE = 10.0  # log-time gains are given to the controller in tenths (0.1 in log -> 1.0)


def _phi(z: np.ndarray) -> np.ndarray:
    return np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)


def _cdf(z: np.ndarray | float) -> np.ndarray:
    from scipy.special import ndtr

    return ndtr(z)


# -- the space ---------------------------------------------------------------------------------


class Space:
    """Every point of ``problem`` the platform can run, as flat arrays, with the prior's log time."""

    def __init__(self, problem: Problem) -> None:
        self.problem = problem
        cells = problem.cells()
        self.n_cells = len(cells)
        at = {x: i for i, x in enumerate(cells)}
        knob, cell, keys, prior = [], [], [], []
        for ki, k in enumerate(problem.knobs):
            for c in problem.colls:
                sizes = problem.sizes[c]
                space = problem.space(c, k)
                cfg = point_configs(problem.topo, k, c, np.repeat(sizes, len(space)), space * len(sizes))
                t = problem.prior.time_us(cfg, validate=False).reshape(len(sizes), len(space))
                for i, s in enumerate(sizes):
                    for j, key in enumerate(space):
                        if problem.runs(k, c, s, key):
                            knob.append(ki)
                            cell.append(at[(c, s)])
                            keys.append(key)
                            prior.append(float(np.log(t[i, j])))
        self.cells = cells
        self.knob = np.asarray(knob, dtype=np.int64)
        self.cell = np.asarray(cell, dtype=np.int64)
        self.keys: list[Key] = keys
        self.prior = np.asarray(prior)
        self.is_default = np.array([k == DEFAULT for k in keys])
        self.n_knobs = len(problem.knobs)
        self.size = len(keys)
        # per (knob, cell): its candidates and NCCL's choice among them (-1: NCCL's choice cannot run)
        self.group = self.knob * self.n_cells + self.cell
        self.members: list[np.ndarray] = [np.empty(0, np.int64)] * (self.n_knobs * self.n_cells)
        order = np.argsort(self.group, kind="stable")
        bounds = np.searchsorted(self.group[order], np.arange(self.n_knobs * self.n_cells + 1))
        for g in range(self.n_knobs * self.n_cells):
            self.members[g] = order[bounds[g]:bounds[g + 1]]
        self.default = np.full(self.n_knobs * self.n_cells, -1, dtype=np.int64)
        self.default[self.group[self.is_default]] = np.flatnonzero(self.is_default)
        if (self.default[: self.n_cells] < 0).any():
            raise ConfigError("problem", "NCCL's plain default must be measurable at every size")
        self.default_of = self.default[self.group]  # NCCL's choice next to each point
        sizes = np.array([s for _, s in cells], dtype=float)
        lsz = np.log2(sizes)
        self.size_pos = np.zeros(self.n_cells)
        for c in problem.colls:  # position of each size in its collective's grid, 0..1
            idx = [i for i, (cc, _) in enumerate(cells) if cc == c]
            r = lsz[idx]
            self.size_pos[idx] = (r - r.min()) / max(r.max() - r.min(), 1.0)
        self.X = self._features(lsz)
        self.weights = problem.cell_weights()  # calls per step per cell (None: sizes count alike)

    def log_gain(self, plain: np.ndarray, final: np.ndarray) -> float:
        """The objective's gain (log) of the log times ``final`` over ``plain``, per cell
        (:meth:`ncclrl.agents.problem.Problem.log_gain`)."""
        if self.weights is None:
            return float(np.mean(plain - final))
        return self.problem.log_gain(np.exp(plain), np.exp(final))

    def sensitivity(self, final: np.ndarray) -> np.ndarray:
        """d gain / d log time of each cell's point at log times ``final``: ``1/n`` for the
        geometric mean; a cell's share of the step's communication time when weighted."""
        if self.weights is None:
            return np.full(len(final), 1.0 / len(final))
        x = self.weights * np.exp(final)
        return x / x.sum()

    def _features(self, lsz: np.ndarray) -> np.ndarray:
        """The model's regressors per point: intercept, algorithm/protocol, channel level, knob
        setting and collective, each also times the size's position (trends over size)."""
        pairs = sorted({f"{k[0]}/{k[1]}" for k in self.keys})
        pi = np.array([pairs.index(f"{k[0]}/{k[1]}") for k in self.keys])
        lvl = np.array([0 if k[2] == 0 else (1 if k[2] == 1 else 2) for k in self.keys])
        colls = sorted(set(c for c, _ in self.cells))
        ci = np.array([colls.index(self.cells[c][0]) for c in self.cell])
        z = (self.size_pos[self.cell] - 0.5) * 2
        blocks = [np.ones((self.size, 1)), z[:, None], (z * z)[:, None]]
        for idx, n in ((pi, len(pairs)), (lvl, 3), (self.knob, self.n_knobs), (ci, len(colls))):
            one = np.zeros((self.size, n))
            one[np.arange(self.size), idx] = 1.0
            blocks += [one, one * z[:, None]]
        return np.hstack(blocks)

    def decision(self, knob: int, rows: dict[int, int]) -> Decision:
        """A :class:`Decision` from a knob index and, per cell index, the chosen point."""
        return Decision(self.problem.knobs[knob],
                        {self.cells[c]: self.keys[i] for c, i in rows.items() if self.keys[i] != DEFAULT})

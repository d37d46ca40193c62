"""The published tuning approaches, as black-box tuners over the benchmark's space.

Each spends its evaluations through :class:`ncclrl.agents.baselines.base.Evaluator` (NCCL's plain
defaults first, every point counted), proposes points in batches (one batch is one job per knob
setting on live GPUs), and turns what it measured into a table with
:func:`ncclrl.agents.baselines.base.assemble`.
"""

from __future__ import annotations

import math
from collections.abc import Generator

import numpy as np

from ncclrl.agents.baselines.base import (
    DEFAULT,
    BudgetExhausted,
    Decision,
    Evaluator,
    Key,
    Problem,
    assemble,
    measure_defaults,
)
from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.space import KNOB_FIELDS, point_configs

Cand = tuple[int, int, int, Key]  # (knob index, collective, size, per-call key)


def all_points(problem: Problem) -> list[Cand]:
    """Every point of the space except NCCL's plain defaults (measured first by every tuner)."""
    out = []
    for ki, k in enumerate(problem.knobs):
        for c, s in problem.cells():
            for key in problem.space(c, k):
                if ki or key != DEFAULT:
                    out.append((ki, c, s, key))
    return out


def evaluate_cands(problem: Problem, ev: Evaluator, cands: list[Cand]) -> dict[Cand, float | None]:
    """Measure candidates, one evaluator call per knob setting (its order of first appearance)."""
    by: dict[int, list[Cand]] = {}
    for x in cands:
        by.setdefault(x[0], []).append(x)
    out: dict[Cand, float | None] = {}
    for ki, xs in by.items():
        if ev.remaining <= 0:
            break
        res = ev.evaluate(problem.knobs[ki], [(c, s, key) for _, c, s, key in xs])
        out.update(zip(xs, res, strict=True))
    return out


def planned_points(problem: Problem, ev: Evaluator) -> int:
    """About how many points the budget left pays for, counting one more job's launch (for tuners
    that split their budget over cells ahead: a generous figure, since they run several jobs; they
    go on until the evaluator says the budget is spent, which charges what jobs really cost)."""
    return ev.points_left(jobs=1)


def shares(cells: list[tuple[int, int]], budget: int) -> dict[tuple[int, int], int]:
    """The budget split evenly over the cells, the remainder one each to the first ones."""
    per, rem = divmod(max(budget, 0), len(cells))
    return {cell: per + (i < rem) for i, cell in enumerate(cells)}


def _fresh(problem: Problem, ev: Evaluator, x: Cand) -> bool:
    return ev.measured(problem.knobs[x[0]], x[1], x[2], x[3]) is None


class DefaultTuner:
    """NCCL's own choices: no table, no ``nccl.conf``, no evaluations (the reference)."""

    name = "default"

    def tune(self, problem: Problem, ev: Evaluator, seed: int) -> Decision:
        return Decision(problem.base)


class SweepTuner:
    """NVIDIA's recipe: one job per knob setting (NCCL's defaults first), each measuring every
    per-call configuration at every size, then the best measured per size. With a budget smaller
    than the sweep, the sweep stops where the budget does (a job keeps what its share paid for);
    GPU-time left after one sweep is not spent."""

    name = "sweep"
    race = False

    def tune(self, problem: Problem, ev: Evaluator, seed: int) -> Decision:
        defaults = [(0, c, s, DEFAULT) for c, s in problem.cells()]  # NCCL's plain defaults in the first job
        for ki in range(len(problem.knobs)):
            xs = [x for x in (defaults if ki == 0 else []) + all_points(problem)
                  if x[0] == ki and _fresh(problem, ev, x) and problem.runs(problem.knobs[ki], *x[1:])]
            if ev.remaining <= 0:
                break
            evaluate_cands(problem, ev, xs)
        while self.race and ev.remaining > 0:
            xs = self.leaders(problem, ev)
            if not xs:
                break
            evaluate_cands(problem, ev, xs)
        return assemble(problem, ev)

    @staticmethod
    def leaders(problem: Problem, ev: Evaluator) -> list[Cand]:
        best = assemble(problem, ev)
        out: list[Cand] = []
        for ki, k in enumerate(problem.knobs):
            top = 2 if k.knobs == best.conf.knobs else 1
            for c, s in problem.cells():
                got = {key: m for key in problem.space(c, k) if (m := ev.measured(k, c, s, key)) is not None}
                lead = sorted((key for key in got if key != DEFAULT), key=got.get)[:top]
                out += [(ki, c, s, key) for key in ([DEFAULT] if DEFAULT in got and top == 2 else []) + lead]
        return out


class SweepRaceTuner(SweepTuner):
    """Sweep, then race: after one sweep, the GPU-time left re-measures the leaders in fresh jobs
    (per size NCCL's choice and the two best measured points under the best knob setting so far,
    and the best point under each other setting, round after round: :meth:`SweepTuner.leaders`),
    so the pick per size rests on several jobs, not one draw."""

    name = "sweep-race"
    race = True


class RandomTuner:
    """Uniform random points of the space, without replacement, in batches of what the budget
    left is predicted to pay for (one job per knob setting in a batch)."""

    name = "random"

    def tune(self, problem: Problem, ev: Evaluator, seed: int) -> Decision:
        rng = np.random.default_rng(seed)
        measure_defaults(problem, ev)
        pts = all_points(problem)
        order = list(rng.permutation(len(pts)))
        while ev.remaining > 0 and order:
            n = max(planned_points(problem, ev), 1)
            pick, order = order[:n], order[n:]
            evaluate_cands(problem, ev, [pts[i] for i in sorted(pick)])
        return assemble(problem, ev)


def features(problem: Problem, cands: list[Cand]) -> np.ndarray:
    """Numeric description of points for a regression model: size, collective, algorithm,
    protocol, channels and the knob setting's fields."""
    f = np.zeros((len(cands), 2 + len(N.COLLECTIVES) + N.NUM_ALGOS + N.NUM_PROTOS + len(KNOB_FIELDS) + 1))
    for i, (ki, c, s, key) in enumerate(cands):
        k = problem.knobs[ki]
        row = [np.log2(s), float(key[0] == "default")]  # NCCL's own algorithm (at its channel count or the key's)
        row += [float(c == j) for j in range(len(N.COLLECTIVES))]
        row += [float(key[0] == a) for a in N.ALGOS] + [float(key[1] == p) for p in N.PROTOS]
        row += [np.log2(1 + v) for v in k.knobs] + [np.log2(1 + key[2])]
        f[i] = row
    return f


def prior_log(problem: Problem, ev: Evaluator, cands: list[Cand]) -> dict[Cand, float]:
    """The prior's log time of each candidate (counted as model evaluations)."""
    out: dict[Cand, float] = {}
    by: dict[tuple[int, int], list[Cand]] = {}
    for x in cands:
        by.setdefault((x[0], x[1]), []).append(x)
    for (ki, c), xs in by.items():
        cfg = point_configs(problem.topo, problem.knobs[ki], c, np.array([x[2] for x in xs]), [x[3] for x in xs])
        out.update(zip(xs, np.log(problem.prior.time_us(cfg, validate=False)), strict=True))
    ev.count_model(len(cands))
    return out


def best_predicted(problem: Problem, prior: dict[Cand, float], pts: list[Cand], top: int = 1) -> list[Cand]:
    """Per (collective, size), the ``top`` points the prior predicts fastest (over every knob setting)."""
    per: dict[tuple[int, int], list[Cand]] = {}
    for x in pts:
        per.setdefault((x[1], x[2]), []).append(x)
    return [x for xs in per.values() for x in sorted(xs, key=lambda x: (prior[x], x))[:top]]


def with_prior(f: np.ndarray, prior: dict[Cand, float], cands: list[Cand]) -> np.ndarray:
    return np.hstack([f, np.array([[prior[x]] for x in cands])])


class AfnfaTuner:
    """AFNFA: measure a random ~5% of the space, fit a random forest to log time, run simulated
    annealing on the forest's predictions per (collective, size), then measure the best predicted
    points with the rest of the budget.

    Warm-started from the problem's prior: the first sample also holds, per size, the point the
    prior predicts fastest, and the forest gets the prior's log time as a feature.

    :param sample_fraction: share of the space measured at random first (at most half the budget)
    :param sa_steps: annealing steps per (collective, size)
    :param n_estimators: trees of the forest
    """

    name = "afnfa"

    def __init__(self, sample_fraction: float = 0.05, sa_steps: int = 300, n_estimators: int = 100) -> None:
        self.sample_fraction, self.sa_steps, self.n_estimators = sample_fraction, sa_steps, n_estimators

    def tune(self, problem: Problem, ev: Evaluator, seed: int) -> Decision:
        from sklearn.ensemble import RandomForestRegressor

        rng = np.random.default_rng(seed)
        measure_defaults(problem, ev)
        pts = all_points(problem)
        prior = prior_log(problem, ev, pts + [(0, c, s, DEFAULT) for c, s in problem.cells()])
        n0 = min(math.ceil(self.sample_fraction * problem.n_points), planned_points(problem, ev) // 2)
        first = list(dict.fromkeys(best_predicted(problem, prior, pts)))[:n0]
        rest = [pts[i] for i in rng.permutation(len(pts)) if pts[i] not in set(first)]
        evaluate_cands(problem, ev, first + rest[: n0 - len(first)])
        if ev.remaining <= 0:
            return assemble(problem, ev)
        seen = [(ki, c, s, key) for ki, k in enumerate(problem.knobs) for c, s in problem.cells()
                for key in problem.space(c, k) if ev.measured(k, c, s, key) is not None]
        y = np.log([ev.measured(problem.knobs[x[0]], *x[1:]) for x in seen])
        model = RandomForestRegressor(n_estimators=self.n_estimators, random_state=seed, n_jobs=1)
        model.fit(with_prior(features(problem, seen), prior, seen), y)
        # per cell, the predicted time of every (knob setting, key): annealing walks this landscape
        per_cell: dict[tuple[int, int], list[Cand]] = {}
        for x in pts + [(0, c, s, DEFAULT) for c, s in problem.cells()]:
            per_cell.setdefault((x[1], x[2]), []).append(x)
        flat = [x for xs in per_cell.values() for x in xs]
        pred = dict(zip(flat, model.predict(with_prior(features(problem, flat), prior, flat)), strict=True))
        ev.count_model(len(flat) * self.n_estimators)
        share = shares(list(per_cell), planned_points(problem, ev))
        want: list[Cand] = []
        ranked: dict[tuple[int, int], list[Cand]] = {}
        for cell, xs in per_cell.items():
            found = self._anneal(problem, xs, pred, rng)
            # the annealing's finds first, then the rest of the cell by the forest's prediction
            ranked[cell] = list(dict.fromkeys(found + sorted(xs, key=lambda x: (pred[x], x))))
            want += [x for x in ranked[cell] if _fresh(problem, ev, x)][: share[cell]]
        evaluate_cands(problem, ev, want)
        while ev.remaining > 0:  # budget left by cells with fewer points than their share
            more = [x for xs in ranked.values() for x in [next((y for y in xs if _fresh(problem, ev, y)), None)]
                    if x is not None]
            if not more:
                break
            evaluate_cands(problem, ev, more)
        return assemble(problem, ev)

    def _anneal(self, problem: Problem, xs: list[Cand], pred: dict[Cand, float], rng) -> list[Cand]:
        """Simulated annealing over (knob setting, key) of one cell on the model's predictions;
        returns the visited points, best predicted first."""
        ks = sorted({x[0] for x in xs})
        keys = {ki: [x for x in xs if x[0] == ki] for ki in ks}
        cur = xs[int(rng.integers(len(xs)))]
        visited = {cur}
        t0, t1 = 0.5, 0.005
        for i in range(self.sa_steps):
            temp = t0 * (t1 / t0) ** (i / max(1, self.sa_steps - 1))
            if rng.random() < 0.5:  # move along the knob setting, same per-call key where it exists
                ki = ks[int(rng.integers(len(ks)))]
                nxt = next((x for x in keys[ki] if x[3] == cur[3]), keys[ki][int(rng.integers(len(keys[ki])))])
            else:  # move along the per-call key
                same = keys[cur[0]]
                nxt = same[int(rng.integers(len(same)))]
            d = pred[nxt] - pred[cur]
            if d < 0 or rng.random() < math.exp(-d / temp):
                cur = nxt
                visited.add(cur)
        # ties (a forest predicts equal times for many points) broken by the point, not by the set's
        # iteration order, which follows string hashes and so changes with PYTHONHASHSEED
        return sorted(visited, key=lambda x: (pred[x], x))


class TpeTuner:
    """Optuna's TPE sampler, one study per (collective, size) over (knob setting, configuration),
    minimizing log time; the budget is split evenly over the studies, asked in ``rounds`` batches.
    A point already measured is told its value again without being measured (not counted).
    Warm-started from the problem's prior: each study first tries the ``warm`` points the prior
    predicts fastest at its size. Each ask counts TPE's 24 candidate evaluations as model
    evaluations."""

    name = "tpe"

    def __init__(self, rounds: int = 8, warm: int = 2) -> None:
        self.rounds, self.warm = rounds, warm

    def tune(self, problem: Problem, ev: Evaluator, seed: int) -> Decision:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        measure_defaults(problem, ev)
        cells = problem.cells()
        share = shares(cells, planned_points(problem, ev))
        if ev.remaining <= 0:
            return assemble(problem, ev)
        dists = {}
        studies = {}
        pts = all_points(problem)
        prior = prior_log(problem, ev, pts)
        warm = best_predicted(problem, prior, pts, self.warm)
        for i, (c, s) in enumerate(cells):
            n_keys = max(len(problem.space(c, k)) for k in problem.knobs)  # the largest setting's space
            dists[(c, s)] = {"knobs": optuna.distributions.CategoricalDistribution(list(range(len(problem.knobs)))),
                             "config": optuna.distributions.CategoricalDistribution(list(range(n_keys)))}
            st = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=seed * 100003 + i))
            base = ev.measured(problem.base, c, s, DEFAULT)
            if base is not None:  # NCCL's defaults are known: the study starts from them
                st.add_trial(optuna.trial.create_trial(params={"knobs": 0, "config": 0},
                                                       distributions=dists[(c, s)], value=float(np.log(base))))
            for ki, _c, _s, key in (x for x in warm if (x[1], x[2]) == (c, s)):
                st.enqueue_trial({"knobs": ki, "config": problem.space(c, problem.knobs[ki]).index(key)})
            studies[(c, s)] = st
        spent = dict.fromkeys(cells, 0)
        batch = max(1, math.ceil(max(share.values()) / self.rounds))
        while ev.remaining > 0:
            asks: list[tuple[tuple[int, int], object, Cand]] = []
            for cell in cells:
                st = studies[cell]
                n = min(batch, share[cell] - spent[cell])
                tries = 0
                while n > 0 and tries < 4 * batch:
                    tries += 1
                    tr = st.ask(dists[cell])
                    ev.count_model(24)
                    k = problem.knobs[tr.params["knobs"]]
                    keys = problem.space(cell[0], k)
                    x = (tr.params["knobs"], cell[0], cell[1], keys[min(tr.params["config"], len(keys) - 1)])
                    m = ev.measured(k, *x[1:])
                    if m is not None:
                        st.tell(tr, float(np.log(m)))
                    elif any(a[2] == x for a in asks):
                        st.tell(tr, state=optuna.trial.TrialState.FAIL)
                    else:
                        asks.append((cell, tr, x))
                        spent[cell] += 1
                        n -= 1
            if not asks:
                break
            try:
                res = evaluate_cands(problem, ev, [a[2] for a in asks])
            except BudgetExhausted:
                break
            for cell, tr, x in asks:
                m = res.get(x)
                studies[cell].tell(tr, float(np.log(m)) if m else None,
                                   state=None if m else optuna.trial.TrialState.FAIL)
        return assemble(problem, ev)


class AutocclTuner:
    """AutoCCL-style: per (collective, size) and per (algorithm, protocol) subspace, coordinate
    descent over the resource parameters (per-call channels; the knob setting's fields: channels,
    socket threads, sockets per thread, inline size), assuming each is unimodal: along one
    coordinate step up while it improves, else step down; cycle until no coordinate improves,
    then restart from a random point while the cell's share of the budget lasts. All cells step
    together (one batch per step)."""

    name = "autoccl"

    def tune(self, problem: Problem, ev: Evaluator, seed: int) -> Decision:
        rng = np.random.default_rng(seed)
        measure_defaults(problem, ev)
        cells = problem.cells()
        share = shares(cells, planned_points(problem, ev))
        gens = {cell: self._descend(problem, ev, cell, share[cell], np.random.default_rng(rng.integers(1 << 62)))
                for cell in cells}
        pending: dict[tuple[int, int], Cand | None] = {cell: next(g, None) for cell, g in gens.items()}
        while ev.remaining > 0:
            live = {cell: x for cell, x in pending.items() if x is not None}
            if not live:
                break
            try:
                res = evaluate_cands(problem, ev, list(dict.fromkeys(live.values())))
            except BudgetExhausted:
                break
            for cell, x in live.items():
                try:
                    pending[cell] = gens[cell].send(res.get(x))
                except StopIteration:
                    pending[cell] = None
        return assemble(problem, ev)

    def _descend(self, problem: Problem, ev: Evaluator, cell: tuple[int, int], budget: int,
                 rng) -> Generator[Cand, float | None, None]:
        c, s = cell
        knobs = problem.knobs
        m = problem.space(c, problem.base)
        subspaces = list(dict.fromkeys((a, p) for a, p, _ in m[1:]))
        ch_levels = [1, 0, -1]  # one channel, NCCL's count, the communicator's maximum

        def key_of(ki: int, sub: tuple[str, str], lvl: int) -> Key:
            comm = knobs[ki].comm_channels or problem.topo.nccl.channels
            ch = comm if ch_levels[lvl] == -1 else ch_levels[lvl]
            return (sub[0], sub[1], ch)

        def neighbour(ki: int, field: int, step: int) -> int | None:
            """The next knob setting up (or down) ``field`` from ``ki``: the grid is not a product
            (threads come with sockets), so the one changing the fewest other fields, then the
            nearest."""
            here = knobs[ki].knobs
            best = None
            for j, k in enumerate(knobs):
                d = k.knobs[field] - here[field]
                if d * step <= 0:
                    continue
                others = sum(k.knobs[f] != here[f] for f in range(len(here)) if f != field)
                rank = (others, abs(d), sum(abs(k.knobs[f] - here[f]) for f in range(len(here)) if f != field))
                if best is None or rank < best[0]:
                    best = (rank, j)
            return None if best is None else best[1]

        used = 0
        cache: dict[Cand, float] = {}

        def value(x: Cand):
            nonlocal used
            if x in cache:
                return cache[x]
            got = ev.measured(knobs[x[0]], *x[1:])
            if got is None:
                if used >= budget:
                    return None
                used += 1
                got = yield x
            cache[x] = got if got is not None else math.inf
            return cache[x]

        starts = [(sub, 0, 1) for sub in subspaces]  # each subspace from NCCL's defaults
        stale = 0
        while used < budget and stale < 20:  # stop once restarts find nothing new
            before = used
            if starts:
                sub, ki, lvl = starts.pop(0)
            else:  # restart from a random point
                sub = subspaces[int(rng.integers(len(subspaces)))]
                ki, lvl = int(rng.integers(len(knobs))), int(rng.integers(len(ch_levels)))
            cur = (ki, c, s, key_of(ki, sub, lvl))
            best = yield from value(cur)
            if best is None:
                return
            improved = True
            while improved and used < budget:
                improved = False
                for coord in range(len(KNOB_FIELDS) + 1):
                    for step in (1, -1):
                        moved = False
                        while True:
                            if coord == len(KNOB_FIELDS):
                                nl = lvl + step
                                if not 0 <= nl < len(ch_levels):
                                    break
                                nk = ki
                            else:
                                nxt = neighbour(ki, coord, step)
                                if nxt is None:
                                    break
                                nk, nl = nxt, lvl
                            x = (nk, c, s, key_of(nk, sub, nl))
                            v = yield from value(x)
                            if v is None or v >= best:
                                break
                            best, ki, lvl, moved, improved = v, nk, nl, True, True
                        if moved:
                            break  # unimodal: no need to try the other direction
            stale = stale + 1 if used == before else 0


TUNERS = {t.name: t for t in (DefaultTuner, SweepTuner, SweepRaceTuner, RandomTuner, AfnfaTuner, TpeTuner,
                               AutocclTuner)}


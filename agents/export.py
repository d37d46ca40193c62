"""Export the zero-shot table of one target platform: the exact argmin of its simulator, as
tuner-plugin tables, with no measurement.

A job calls collectives on communicators of several shapes (the world group, tensor-parallel groups
inside a node, data-parallel groups of one rank per node), and NCCL's tuner sees each one's
``nNodes``/``nRanks``. The table holds rows for each shape asked for (:func:`default_shapes`
unless given), each shape simulated as its own platform (:meth:`Topology.shape`), its rows naming
that shape's ``nNodes,nRanks``. A shape of one rank gets no rows (NCCL runs no algorithm there).

For each shape, each collective and every power of two from 1 B to 2 GiB, every valid per-call
configuration is timed in the simulator and the fastest kept; the decision for ``2^k`` covers
``[2^k, 2^(k+1) - 1]`` (the first row starts at 0, the last ends at 4294967295), neighbours with
equal decisions merge. Outputs:

* ``nccl_tuner.csv``: NVIDIA's example-plugin format, explicit channel counts everywhere (that
  plugin runs anything uncovered, or any row with channels -1, on ONE channel), no gaps: a row that
  keeps NCCL's decision states NCCL's own choice for each of its sizes, as the replica predicts it
  (:meth:`ncclrl.costmodel.table.Table.complete`);
* ``nccl_tuner.json``: the same rows with provenance (the shapes included) and predicted times;
* ``nccl.conf``: per-process knobs (``NCCL_BUFFSIZE``, socket threads/sockets, minimum channels)
  when they lower the predicted time over the table's sizes of every shape together (a process
  has one setting for all its communicators), else nothing.

A row keeps NCCL's own decision unless the simulator predicts the fastest configuration faster by
more than ``margin`` (a table never carries a decision the model does not support), and
``nccl.conf`` keeps NCCL's defaults unless the knobs are predicted to gain more than it (at least
0.5%) per row. The margin is the simulator's measured error (docs/results/calibration.md):
:data:`UNCALIBRATED_MARGIN` on a platform its simulator was never calibrated for,
:data:`CALIBRATED_MARGIN` where it was (:func:`margin_for`).
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.platforms import Platform
from ncclrl.costmodel.replica import auto_channels, build_model, default_decisions
from ncclrl.costmodel.simulator import Configs, Simulator
from ncclrl.costmodel.table import MAX_BYTES, Row, Table
from ncclrl.costmodel.topology import Topology
from ncclrl.costmodel.workload import Choice, Key, Target, Workload, candidates, choose, step_costs, table_choices
from ncclrl.envs import spaces as S

EXPORT_SIZES = 1 << np.arange(0, 32, dtype=np.int64)  # 1 B .. 2 GiB; the last row runs to 4 GiB - 1

#: the margin rule (docs/results/calibration.md, chosen on the recorded H200 sweeps, judged on the
#: public grids): a row leaves NCCL's decision only when predicted faster by more than this share.
#: Uncalibrated: the median error of the default simulator's predicted gain over NCCL's choice
#: (|log error| 0.321) on the H200 sweeps; calibrated on one S-curve: its 75th percentile (0.720)
UNCALIBRATED_MARGIN = 0.274
CALIBRATED_MARGIN = 0.513


def simulator_is_calibrated(sim: Simulator) -> bool:
    """Whether ``sim`` runs on a calibration for its platform: the topology carries a fitted ``sim``
    block (``ncclrl calibrate output=`` writes one; the shipped H200 presets carry their machine's
    fit) and ``sim`` runs on exactly those parameters."""
    if not sim.topo.sim:
        return False
    from ncclrl.costmodel.simulator import SimParams

    return sim.params.to_dict() == SimParams.from_topology(sim.topo).to_dict()


def margin_for(calibrated: bool) -> float:
    """The margin rule's margin: :data:`CALIBRATED_MARGIN` or :data:`UNCALIBRATED_MARGIN`."""
    return CALIBRATED_MARGIN if calibrated else UNCALIBRATED_MARGIN


def _candidates(topo: Topology, coll: int, n: int) -> np.ndarray:
    """Every valid action at each of ``n`` sizes: ``(actions, n)``."""
    valid = np.flatnonzero(S.action_mask(topo, coll))
    return np.repeat(valid[:, None], n, axis=1)


def _explicit_channels(topo: Topology, coll: int, sizes: np.ndarray, algo: np.ndarray, proto: np.ndarray,
                       channels: np.ndarray, comm_channels: int) -> np.ndarray:
    """Channel counts to write: the policy's, or NCCL's own per-call choice where it said 0."""
    auto, _ = auto_channels(build_model(topo), sizes, algo, proto, comm_channels or topo.nccl.channels)
    return np.where(channels > 0, channels, auto)


def _candidate_confs(topo: Topology) -> list[dict[str, int]]:
    confs: list[dict[str, int]] = [{}]
    for b in (1 << 20, 2 << 20, 8 << 20):
        confs.append({"NCCL_BUFFSIZE": b})
    if topo.nodes > 1 and topo.net.kind == "socket":
        for t in (1, 2, 4):
            for s in (1, 2, 4, 8):
                if (t, s) != (topo.nccl.socket_nthreads, topo.nccl.nsocks_perthread) and t * s <= 64:
                    confs.append({"NCCL_SOCKET_NTHREADS": t, "NCCL_NSOCKS_PERTHREAD": s})
    base = list(confs)
    for c in (4, 8, 16, 32):
        if c > topo.nccl.channels:
            confs += [dict(k, NCCL_MIN_NCHANNELS=c) for k in base]
    return confs


def _times(sim: Simulator, coll: np.ndarray, sizes: np.ndarray, algo: np.ndarray, proto: np.ndarray,
           channels: np.ndarray, conf: dict[str, int]) -> np.ndarray:
    return sim.time_us(Configs.make(coll, sizes, algo, proto, channels, conf.get("NCCL_MIN_NCHANNELS", 0),
                                    conf.get("NCCL_BUFFSIZE", 0), conf.get("NCCL_SOCKET_NTHREADS", 0),
                                    conf.get("NCCL_NSOCKS_PERTHREAD", 0)))


def default_shapes(topo: Topology) -> list[tuple[int, int]]:
    """The communicator shapes ``(nodes, nranks)`` a table covers unless told otherwise: the whole
    job; on several nodes also one node with all its GPUs (tensor-parallel groups) and one rank on
    every node (data-parallel groups across nodes). Shapes of one rank and repeats are dropped."""
    shapes = [(topo.nodes, topo.nranks)]
    if topo.nodes > 1:
        shapes += [(1, topo.gpus_per_node), (topo.nodes, topo.nodes)]
    return resolve_shapes(topo, shapes)


def resolve_shapes(topo: Topology, shapes: Sequence[Sequence[int]] | None) -> list[tuple[int, int]]:
    """``shapes`` checked against ``topo`` (:meth:`Topology.shape`: a one-line :class:`ConfigError`
    for a shape the job cannot hold), repeats and one-rank shapes dropped, order kept; ``None`` or
    empty: :func:`default_shapes`.

    :param topo: the job's platform
    :param shapes: ``[nodes, nranks]`` pairs
    """
    if not shapes:
        return default_shapes(topo)
    out: list[tuple[int, int]] = []
    for shape in shapes:
        pair = list(shape) if isinstance(shape, Sequence) and not isinstance(shape, str) else [shape]
        if len(pair) != 2:
            raise ConfigError("shapes", f"each shape is a pair [nodes, ranks], got {shape!r}")
        nodes, nranks = (int(x) if isinstance(x, (int, np.integer)) and not isinstance(x, bool) else x for x in pair)
        topo.shape(nodes, nranks)
        if nranks > 1 and (nodes, nranks) not in out:
            out.append((nodes, nranks))
    if not out:
        raise ConfigError("shapes", f"no shape of more than one rank in {[list(s) for s in shapes]}: nothing to tune")
    return out


def _prepare(topo: Topology, colls: list[int], sizes: np.ndarray) -> dict[int, dict[str, np.ndarray]]:
    """Per collective: every valid action at every size, and NCCL's own decision."""
    per: dict[int, dict[str, np.ndarray]] = {}
    for c in colls:
        a = _candidates(topo, c, sizes.size)
        algo, proto, ch, _chunk = (x[a] for x in S.decode_all())
        d = default_decisions(topo, c, sizes)
        per[c] = {"algo": algo, "proto": proto, "ch": ch, "d_algo": d.algo, "d_proto": d.proto}
    return per


def _evaluate(sim: Simulator, per: dict[int, dict[str, np.ndarray]], sizes: np.ndarray, conf: dict[str, int],
              margin: float) -> tuple[dict[int, dict[str, np.ndarray]], float]:
    """The fastest candidate per (collective, size) on ``sim``'s platform under the per-process
    knobs ``conf``, whether it beats NCCL's decision by ``margin``, and the sum of log times."""
    topo = sim.topo
    out, total = {}, 0.0
    comm = conf.get("NCCL_MIN_NCHANNELS", 0)
    cols = np.arange(sizes.size)
    for c, p in per.items():
        cand_ch = np.stack([_explicit_channels(topo, c, sizes, p["algo"][j], p["proto"][j], p["ch"][j], comm)
                            for j in range(p["algo"].shape[0])])
        cand_t = np.stack([_times(sim, np.full(sizes.shape, c), sizes, p["algo"][j], p["proto"][j], cand_ch[j],
                                  conf) for j in range(p["algo"].shape[0])])
        j = np.argmin(cand_t, axis=0)
        ch, t_pol = cand_ch[j, cols], cand_t[j, cols]
        d_ch = _explicit_channels(topo, c, sizes, p["d_algo"], p["d_proto"], np.zeros_like(sizes), comm)
        t_def_conf = _times(sim, np.full(sizes.shape, c), sizes, p["d_algo"], p["d_proto"], d_ch, conf)
        t_default = _times(sim, np.full(sizes.shape, c), sizes, p["d_algo"], p["d_proto"], np.zeros_like(sizes), {})
        use = t_pol < t_def_conf * (1.0 - margin)
        out[c] = {"use": use, "ch": ch, "d_ch": d_ch, "t": np.where(use, t_pol, t_def_conf),
                  "t_default": t_default, "pick": j}
        total += float(np.sum(np.log(out[c]["t"])))
    return out, total


def export_table(sim: Simulator, collectives: list[str] | None = None, margin: float | None = None,
                 tune_conf: bool = True, provenance: dict[str, Any] | None = None,
                 shapes: Sequence[Sequence[int]] | None = None) -> Table:
    """The zero-shot table of ``sim``'s platform (see the module docstring).

    :param sim: the job's simulated platform; each other shape is simulated with its parameters
    :param collectives: collectives to cover (default: all five)
    :param margin: a row leaves NCCL's decision only if predicted faster by more than this fraction,
        and ``nccl.conf`` its defaults only if predicted to gain more than it per row (``None``: the
        simulator's measured error, :func:`margin_for` whether ``sim`` is calibrated)
    :param tune_conf: also choose per-process knobs (``nccl.conf``)
    :param provenance: recorded in the JSON, with the method's own settings added
    :param shapes: ``[nodes, nranks]`` communicator shapes to write rows for (default:
        :func:`default_shapes`)
    """
    topo = sim.topo
    calibrated = simulator_is_calibrated(sim)
    if margin is None:
        margin = margin_for(calibrated)
    if not 0 <= margin < 1:
        raise ConfigError("margin", f"must be in [0, 1), got {margin}")
    colls = [N.parse_name("collective", c, N.COLLECTIVES) for c in (collectives or N.COLLECTIVES)]
    sizes = EXPORT_SIZES
    shape_list = resolve_shapes(topo, shapes)
    sims = [sim if (n, r) == (topo.nodes, topo.nranks) else Simulator(topo.shape(n, r), params=sim.params)
            for n, r in shape_list]
    pers = [_prepare(s.topo, colls, sizes) for s in sims]

    def evaluate(conf: dict[str, int]) -> tuple[list[dict[int, dict[str, np.ndarray]]], float]:
        results = [_evaluate(s, per, sizes, conf, margin) for s, per in zip(sims, pers, strict=True)]
        return [r for r, _ in results], sum(t for _, t in results)

    best_conf: dict[str, int] = {}
    best, best_total = evaluate({})
    if tune_conf:
        n = sizes.size * len(colls) * len(sims)
        for conf in _candidate_confs(topo)[1:]:
            res, total = evaluate(conf)
            # a per-process knob must pay for itself: more than the margin (and >= 0.5%) geometric-mean
            # gain over all rows of all shapes
            if total < best_total - n * max(CONF_GAIN, -np.log1p(-margin)):
                best, best_total, best_conf = res, total, conf
    rows: list[Row] = []
    for s, per, res in zip(sims, pers, best, strict=True):
        for c in colls:
            p, r = per[c], res[c]
            for i, size in enumerate(sizes):
                use = bool(r["use"][i])
                j = int(r["pick"][i])
                algo = int(p["algo"][j, i] if use else p["d_algo"][i])
                proto = int(p["proto"][j, i] if use else p["d_proto"][i])
                ch = int(r["ch"][i] if use else r["d_ch"][i])
                lo = 0 if i == 0 else int(size)
                hi = MAX_BYTES if i == sizes.size - 1 else int(sizes[i + 1] - 1)
                row = Row(N.COLLECTIVES[c], lo, hi, N.ALGOS[algo], N.PROTOS[proto], ch, 0.0,
                          "simulator" if use else "nccl-default", float(r["t_default"][i]), float(r["t"][i]),
                          nnodes=s.topo.nodes, nranks=s.topo.nranks)
                last = rows[-1] if rows else None
                if last and i > 0 and last.collective == row.collective and \
                        (last.nnodes, last.nranks) == (row.nnodes, row.nranks) and \
                        (last.algo, last.proto, last.channels) == (row.algo, row.proto, row.channels) and \
                        last.source == row.source:
                    last.max_bytes = row.max_bytes
                    continue
                rows.append(row)
    prov = dict(provenance or {})
    prov.update(topology=topo.name, nodes=topo.nodes, nranks=topo.nranks, nccl_version=topo.nccl.version,
                shapes=[[n, r] for n, r in shape_list], git_revision=_git_revision(), margin=margin,
                simulator_calibrated=calibrated, times="predicted by the simulator")
    # sizes between the powers of two whose decision stayed NCCL's get NCCL's own choice for each size
    return Table(topology=topo, rows=rows, conf=best_conf, provenance=prov, cover=shape_list).complete()


def _git_revision() -> str:
    """The code's git revision where ncclrl runs from its own checkout; installed from a wheel (or
    inside someone else's repository), the package's version instead."""
    from ncclrl import __version__

    root = Path(__file__).resolve().parents[1]
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel", "HEAD"], capture_output=True, text=True,
                             timeout=5, cwd=root).stdout.split()
    except (OSError, subprocess.SubprocessError):
        top = []
    if len(top) == 2 and Path(top[0]).resolve() == root:
        return top[1]
    return f"ncclrl {__version__}"




# -- a table for one job's calls ---------------------------------------------------------------------

OBJECTIVES = ("step", "isolated")
#: a per-process knob must lower the step's predicted communication cost by more than this share
#: (the share :func:`export_table` asks of the geometric-mean time of its rows)
CONF_GAIN = 0.005
#: the step objective's safety rule (chosen on simulated draws, judged on fresh ones:
#: docs/results/workload.md): an overlapped call counts as hidden only if it stays hidden at
#: (1 + HEADROOM) times its predicted time, and a choice must cost no more than the isolated
#: table's on every platform it is chosen on
HEADROOM, DOMINANCE = 1.0, True


@dataclass
class WorkloadExport:
    """A table with rows only for a job's calls, and the tables it is judged against.

    :param table: the rows (one per (collective, shape, bytes) the job calls, NCCL's choice around
        them) and their ``nccl.conf``
    :param isolated: :func:`export_table` for the job's shapes (today's export), whose rows for the
        job's keys are the ``objective=isolated`` table
    :param choices: per key, what ``table`` runs
    :param isolated_choices: per key, what ``isolated`` runs
    :param workload: the job (compute resolved)
    :param objective: step or isolated
    :param chosen_on: the platforms the step objective was chosen on (names)
    """

    table: Table
    isolated: Table
    choices: dict[Key, Choice]
    isolated_choices: dict[Key, Choice]
    workload: Workload
    objective: str
    chosen_on: list[str] = field(default_factory=list)


def _row_for(topo: Topology, key: Key, ch: Choice, conf: dict[str, int], source: str) -> Row:
    """One row covering exactly ``key``'s bytes on ``key``'s shape: ``ch`` with its channel count
    written out (NCCL's own per-call count where it says 0; NCCL's decision where it is the default)."""
    coll, nodes, nranks, nbytes = key
    shape = topo.shape(nodes, nranks)
    c = N.parse_name("collective", coll, N.COLLECTIVES)
    size = np.array([nbytes], dtype=np.int64)
    comm = int(conf.get("NCCL_MIN_NCHANNELS", 0))
    if ch.algo == "default":
        d = default_decisions(shape, c, size, comm_channels=comm)
        algo, proto, source = d.algo, d.proto, "nccl-default"
    else:
        algo = np.array([N.parse_name("algorithm", ch.algo, N.ALGOS)])
        proto = np.array([N.parse_name("protocol", ch.proto, N.PROTOS)])
    chans = _explicit_channels(shape, c, size, algo, proto, np.array([ch.channels]), comm)
    return Row(coll, nbytes, nbytes, N.ALGOS[int(algo[0])], N.PROTOS[int(proto[0])], int(chans[0]), 0.0, source,
               nnodes=nodes, nranks=nranks)


def workload_table(sim: Simulator, workload: Workload, objective: str = "step", margin: float = 0.01,
                   tune_conf: bool = True, choose_on: Sequence[Platform] = (),
                   provenance: dict[str, Any] | None = None, headroom: float = HEADROOM,
                   dominance: bool = DOMINANCE) -> WorkloadExport:
    """A table for ``workload``'s calls: one row per (collective, communicator shape, bytes) it
    calls; every other size and collective of those shapes gets NCCL's own choice, as the replica
    predicts it (:meth:`~ncclrl.costmodel.table.Table.complete`); shapes it never calls get no row.

    * ``isolated``: each key's row of :func:`export_table` for the workload's shapes (today's
      export, its ``nccl.conf`` included);
    * ``step``: per key, the configuration of least step cost with interference
      (:func:`ncclrl.costmodel.workload.choose`, costs averaged over ``sim`` and ``choose_on``),
      or the isolated table's row where that costs no more; the ``nccl.conf`` among the export's
      candidates (when ``tune_conf``) that lowers the step's cost by more than :data:`CONF_GAIN`.
      The table never costs more than the isolated one on the platforms it was chosen on.

    :param sim: the job's platform (nominal simulator); each shape simulated with its parameters
    :param workload: the job, compute resolved (:func:`ncclrl.costmodel.workload.resolve_compute`)
    :param objective: step or isolated
    :param margin: a key leaves NCCL's decision only when predicted better by more than this share
    :param tune_conf: also choose per-process knobs (``nccl.conf``)
    :param choose_on: platforms the step objective is averaged over besides ``sim``
    :param provenance: recorded in the JSON, with the method's settings added
    :param headroom: ``step``: a call counts as hidden only if it stays hidden at ``1 + headroom`` times
        its predicted time (:func:`ncclrl.costmodel.workload.choose`)
    :param dominance: ``step``: a choice must cost no more than the isolated one on every platform
        it is chosen on, not only on their mean
    """
    if objective not in OBJECTIVES:
        raise ConfigError("objective", f"allowed: {', '.join(OBJECTIVES)}; got {objective!r}")
    topo = sim.topo
    keys = workload.call_keys()
    shapes = list(dict.fromkeys((k[1], k[2]) for k in keys))
    iso_table = export_table(sim, margin=margin, tune_conf=tune_conf, shapes=[list(s) for s in shapes],
                             provenance={"method": "zero-shot"})
    iso_rows = {k: iso_table.lookup(k[0], k[3], k[1], k[2]) for k in keys}
    iso_choices = table_choices(iso_table, workload)
    chosen_on: list[str] = []
    if objective == "isolated":
        rows = {k: replace(r, min_bytes=k[3], max_bytes=k[3]) for k, r in iso_rows.items() if r is not None}
        choices, conf = dict(iso_choices), dict(iso_table.conf)
    else:
        targets = [Target(sim)] + [Target(p) for p in choose_on]
        chosen_on = [topo.name] + [f"{p.sim.topo.name} draw {i}" for i, p in enumerate(choose_on)]

        def mean_costs(choices: Mapping[Key, Choice], conf: dict[str, int]) -> dict[Key, float]:
            per = [step_costs(t, workload, choices, conf) for t in targets]
            return {k: float(np.mean([p[k] for p in per])) for k in keys}

        iso_total = sum(mean_costs(iso_choices, dict(iso_table.conf)).values())
        results = []  # (conf, per-key choice, total cost)
        for conf in (_candidate_confs(topo) if tune_conf else [{}]):
            picks = choose(targets, workload, margin=margin, conf=conf, headroom=headroom, dominance=dominance)
            iso_here = mean_costs(iso_choices, conf)
            pick = {k: picks.aware[k] if picks.aware_cost[k] <= iso_here[k] else iso_choices[k] for k in keys}
            total = sum(min(picks.aware_cost[k], iso_here[k]) for k in keys)
            results.append((conf, pick, total))
        conf, choices, total = results[0]  # no knobs
        best = min(results, key=lambda r: r[2])
        if best[2] < total * (1.0 - CONF_GAIN):
            conf, choices, total = best
        if total > iso_total:  # never above the isolated table where chosen: its own knobs hold its rows
            conf, choices, total = next(r for r in results if r[0] == dict(iso_table.conf))
        rows = {}
        for k, ch in choices.items():
            if ch == iso_choices[k] and conf == dict(iso_table.conf) and iso_rows[k] is not None:
                rows[k] = replace(iso_rows[k], min_bytes=k[3], max_bytes=k[3])
            else:
                rows[k] = _row_for(topo, k, ch, conf, "workload")
    order = sorted(rows, key=lambda k: (shapes.index((k[1], k[2])), N.COLLECTIVES.index(k[0]), k[3]))
    out_rows = [rows[k] for k in order]
    _predicted_times(sim, out_rows, conf)
    prov = dict(provenance or {})
    prov.update(topology=topo.name, nodes=topo.nodes, nranks=topo.nranks, nccl_version=topo.nccl.version,
                shapes=[[n, r] for n, r in shapes], git_revision=_git_revision(), margin=margin,
                objective=objective, workload=workload.name, keys=len(keys), chosen_on=chosen_on,
                **({"headroom": headroom, "dominance": dominance} if objective == "step" else {}))
    table = Table(topology=topo, rows=out_rows, conf=conf, provenance=prov,
                  title=f"ncclrl table for the job {workload.name} ({objective} objective)", cover=shapes).complete()
    return WorkloadExport(table, iso_table, table_choices(table, workload), iso_choices, workload, objective,
                          chosen_on)


def _predicted_times(sim: Simulator, rows: list[Row], conf: dict[str, int]) -> None:
    """Each row's isolated time (under ``conf``) and NCCL's default's (no knobs) at its size, filled in."""
    target = Target(sim)
    for r in rows:
        shape = target.shape(r.nnodes, r.nranks)
        c = N.parse_name("collective", r.collective, N.COLLECTIVES)
        size = np.array([r.min_bytes], dtype=np.int64)
        d = default_decisions(shape.topo, c, size)
        r.default_time_us = float(_times(shape, np.array([c]), size, d.algo, d.proto, np.zeros(1, np.int64), {})[0])
        r.time_us = float(_times(shape, np.array([c]), size, np.array([N.ALGOS.index(r.algo)]),
                                 np.array([N.PROTOS.index(r.proto)]), np.array([r.channels]), conf)[0])


def online_candidates(sim: Simulator, k: int = 3, min_bytes: int = 1 << 16, max_bytes: int = 1 << 30,
                      collectives: Sequence[str] | None = None) -> list[str]:
    """The alternatives the plugin's online mode explores beside the static table and NCCL's own
    choice (``NCCLRL_ONLINE_CANDIDATES``): for each collective and each power-of-two size bucket
    from ``min_bytes`` to ``max_bytes``, the ``k`` configurations (algorithm, protocol, channels)
    the model predicts fastest at the bucket's middle size, other than NCCL's own choice there, as
    CSV rows of the table's format that cover the bucket (rows of one bucket overlap on purpose:
    each is one arm). Predictions, labelled by the header comment.

    :param sim: the model (a calibrated simulator of the cluster, or a preset's)
    :param k: alternatives per bucket (the plugin holds at most 8 arms, 2 of them the table's and NCCL's)
    :param min_bytes: the smallest bucket's lower bound (rounded down to a power of two)
    :param max_bytes: the largest bucket's upper bound
    :param collectives: collectives to cover (default: every one the topology runs)
    """
    if not 1 <= k <= 6:
        raise ConfigError("k", f"must be in 1..6, got {k}")
    topo = sim.topo
    lo_lg, hi_lg = int(min_bytes).bit_length() - 1, int(max_bytes).bit_length() - 1
    rows = [f"# ncclrl online-mode candidates (model predictions, {k} per bucket) for {topo.name}: "
            f"{topo.nodes} nodes x {topo.gpus_per_node} GPUs"]
    for name in collectives or N.COLLECTIVES:
        coll = N.parse_name("collective", name, N.COLLECTIVES)
        alts = [c for c in candidates(topo, name) if c.algo != "default"]
        if not alts:
            continue
        for lg in range(lo_lg, hi_lg + 1):
            mid = (3 << lg) // 2
            unit = 4 * (topo.nranks if coll in (2, 3) else 1)  # whole float32 elements per rank
            nbytes = max(unit, mid // unit * unit)
            d = default_decisions(topo, coll, np.array([nbytes]))
            cfg = Configs.make(coll, nbytes, [N.ALGOS.index(c.algo) for c in alts],
                               [N.PROTOS.index(c.proto) for c in alts], [c.channels for c in alts])
            t = np.asarray(sim.time_us(cfg, validate=False), dtype=float)
            picked = 0
            for j in np.argsort(t):
                c = alts[int(j)]
                if not np.isfinite(t[j]) or (N.ALGOS.index(c.algo) == int(d.algo[0])
                                             and N.PROTOS.index(c.proto) == int(d.proto[0]) and c.channels == 0):
                    continue
                rows.append(f"{name},{1 << lg},{(2 << lg) - 1},{c.algo},{c.proto},{c.channels},"
                            f"{topo.nodes},{topo.nranks}")
                picked += 1
                if picked == k:
                    break
    return rows

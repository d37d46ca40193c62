"""Tuned tables: NVIDIA's example-plugin CSV format (read and matched as the plugins do), the
one table type ncclrl writes and reads (:class:`Table`: CSV, JSON, ``nccl.conf``).

Light on purpose (no numpy, no gymnasium): the GPU-side verifier imports it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any

from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.space import Point
from ncclrl.costmodel.topology import Topology
from ncclrl.costmodel.units import plural

log = logging.getLogger(__name__)


def format_row(collective: str, min_bytes: int | str, max_bytes: int | str, algo: str, proto: str, channels: int,
               nnodes: int = -1, nranks: int = -1) -> str:
    """One line in that format: NCCL's own algorithm and protocol (``algo == "default"``) as
    ``-1,-1``, a channel count <= 0 (NCCL's per-call choice) as ``-1``."""
    a, p = ("-1", "-1") if algo == "default" else (algo, proto)
    return f"{collective},{min_bytes},{max_bytes},{a},{p},{channels if channels > 0 else -1},{nnodes},{nranks}"


def parse_example_rows(text: str) -> list[dict[str, Any]]:
    """Rows as NVIDIA's example plugin reads them (first match wins; lines > 256 chars dropped;
    the optional ``numPipeOps`` and ``regBuff`` columns, -1 when absent); ``nccl_choice``: the row
    follows ncclrl's mark of a row stating NCCL's choice (ncclrl's plugin skips it)."""
    rows, marked = [], False
    for line in text.splitlines():
        if line.strip().startswith("#ncclrl:nccl-choice"):
            marked = True
            continue
        if len(line) > 256 or not line.strip() or line.lstrip().startswith("#"):
            continue
        f = [x.strip() for x in line.split(",")]
        if len(f) < 8:
            raise ValueError(f"too few fields: {line!r}")
        opt = [int(x) for x in f[8:10]] + [-1, -1]
        rows.append({"collective": f[0], "min_bytes": int(f[1]), "max_bytes": int(f[2]), "algo": f[3],
                     "proto": f[4], "channels": int(f[5]), "nNodes": int(f[6]), "nRanks": int(f[7]),
                     "numPipeOps": opt[0], "regBuff": opt[1], "nccl_choice": marked})
        marked = False
    return rows


def lookup(rows: list[dict[str, Any]], collective: str, nbytes: int, nodes: int, nranks: int,
           num_pipe_ops: int = 1, reg_buff: int = 0) -> dict | None:
    """The first row that matches a call, as NVIDIA's example plugin matches (None: no row)."""
    for r in rows:
        if r["collective"] == collective and r["min_bytes"] <= nbytes <= r["max_bytes"] and \
                r["nNodes"] in (-1, nodes) and r["nRanks"] in (-1, nranks) and \
                r.get("numPipeOps", -1) in (-1, num_pipe_ops) and r.get("regBuff", -1) in (-1, reg_buff):
            return r
    return None


# A decision as (algorithm, protocol, channels): "nccl" for NCCL's own algorithm and protocol, channels 0
# for NCCL's own channel count.
NCCL_OWN = "nccl"
EXAMPLE_COLLECTIVES = ("broadcast", "reduce", "allgather", "reducescatter", "allreduce")
EXAMPLE_ALGOS = ("tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat")
EXAMPLE_PROTOS = ("ll", "ll128", "simple")


def example_decision(rows: list[dict[str, Any]], collective: str, nbytes: int, nodes: int, nranks: int,
                     num_pipe_ops: int = 1, reg_buff: int = 0) -> tuple[str, str, int]:
    """What NVIDIA's example tuner plugin makes of a call, every cost-table entry enabled: it sets
    ``*nChannels = 1`` before matching; the first matching row (as :func:`lookup` matches) forces its
    algorithm and protocol (names are case-sensitive; one it does not know, ``-1`` included, parses
    as ``ring``/``simple``, an unknown collective as ``allreduce``) and sets its channel count
    unless that is -1 (0 hands the count back to NCCL); no matching row leaves NCCL's algorithm and
    protocol on ONE channel.

    :param rows: the table as that plugin reads it (:func:`parse_example_rows`)
    :return: (algorithm, protocol, channels); channels 0 is NCCL's own count
    """
    for r in rows:
        coll = r["collective"] if r["collective"] in EXAMPLE_COLLECTIVES else "allreduce"  # its parser's fallback
        if coll == collective and r["min_bytes"] <= nbytes <= r["max_bytes"] and r["nNodes"] in (-1, nodes) and \
                r["nRanks"] in (-1, nranks) and r["numPipeOps"] in (-1, num_pipe_ops) and \
                r["regBuff"] in (-1, reg_buff):
            break
    else:
        return NCCL_OWN, NCCL_OWN, 1
    algo = r["algo"] if r["algo"] in EXAMPLE_ALGOS else "ring"
    proto = r["proto"] if r["proto"] in EXAMPLE_PROTOS else "simple"
    return algo, proto, 1 if r["channels"] == -1 else r["channels"]


# Every rank of a job must apply the same table byte for byte (ranks that decide differently hang
# NCCL); ranks compare this fingerprint of the text they were handed, and the plugin logs the same.
FNV_OFFSET, FNV_PRIME, MASK64 = 0xCBF29CE484222325, 0x100000001B3, (1 << 64) - 1


def fingerprint(text: str | bytes) -> str:
    """FNV-1a (64-bit) of a table's bytes as 16 lowercase hex digits; the plugin computes the same."""
    h = FNV_OFFSET
    for b in text.encode() if isinstance(text, str) else text:
        h = ((h ^ b) * FNV_PRIME) & MASK64
    return f"{h:016x}"


MAX_BYTES = 4294967295  # the last row of a table runs to 4 GiB - 1
CSV_HEADER = "# collective,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks"


@dataclass
class Row:
    """One row of a tuned table: NCCL runs ``collective`` calls of ``min_bytes``..``max_bytes``
    (inclusive) with this algorithm, protocol and channel count (``default``/``-1``: NCCL's
    own), on communicators of ``nnodes`` nodes and ``nranks`` ranks (-1: any).

    :param source: where the decision comes from: simulator (the zero-shot table), nccl-default, measured
    :param chunk_factor: the policy's chunk factor (0: NCCL's chunk size)
    :param default_time_us: predicted or measured time of NCCL's default at ``min_bytes`` (if known)
    :param time_us: predicted or measured time of this row's decision at ``min_bytes`` (if known)
    """

    collective: str
    min_bytes: int
    max_bytes: int
    algo: str
    proto: str
    channels: int
    chunk_factor: float = 0.0
    source: str = "measured"
    default_time_us: float | None = None
    time_us: float | None = None
    nnodes: int = -1
    nranks: int = -1

    def line(self) -> str:
        return format_row(self.collective, self.min_bytes, self.max_bytes, self.algo, self.proto, self.channels,
                          self.nnodes, self.nranks)


@dataclass
class Table:
    """A tuned table: its rows (``nccl_tuner.csv``), the per-process knobs it needs
    (``nccl.conf``), and where it comes from (the JSON next to them). The one type every producer
    (export, fine-tuning, the baseline tuners) writes and every reader (show, validate, plugin
    verify) reads; rows match as both plugins match them (:meth:`lookup`: the first row wins).

    :param topology: the platform the table is for (rows name its nodes and ranks when written)
    :param rows: the rows, in order
    :param conf: ``nccl.conf``: NCCL variable -> value
    :param provenance: what made the table (written into the JSON)
    :param title: the CSV's first comment line
    :param cover: communicator shapes ``(nnodes, nranks)`` the table speaks for besides those its
        rows name (a shape whose decisions all stayed NCCL's still gets rows: :meth:`complete`)
    """

    topology: Topology | None
    rows: list[Row]
    conf: dict[str, int] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)
    title: str = "ncclrl table"
    cover: list[tuple[int, int]] = field(default_factory=list)

    def lookup(self, collective: str, nbytes: int, nodes: int = -1, nranks: int = -1) -> Row | None:
        """The row a communicator of ``nodes`` nodes and ``nranks`` ranks applies to a call of
        ``nbytes``: the first that matches, as both plugins pick it (None: NCCL decides)."""
        for r in self.rows:
            if r.collective == collective and r.min_bytes <= nbytes <= r.max_bytes and \
                    r.nnodes in (-1, nodes) and r.nranks in (-1, nranks):
                return r
        return None

    def shapes(self) -> list[tuple[int, int]]:
        """The communicator shapes ``(nnodes, nranks)`` the rows name, in the order they first
        appear (-1: any)."""
        return list(dict.fromkeys((r.nnodes, r.nranks) for r in self.rows))

    def for_shape(self, nodes: int, nranks: int) -> Table:
        """The rows a communicator of ``nodes`` nodes and ``nranks`` ranks can match (its own and
        those for any shape), in order, with the same ``nccl.conf``, provenance and topology.

        :param nodes: the communicator's node count (NCCL's ``nNodes``)
        :param nranks: the communicator's rank count (NCCL's ``nRanks``)
        """
        rows = [r for r in self.rows if r.nnodes in (-1, nodes) and r.nranks in (-1, nranks)]
        return Table(self.topology, rows, dict(self.conf), dict(self.provenance), self.title,
                     [s for s in self.cover if s == (nodes, nranks)])

    def complete(self) -> Table:
        """The table both plugins read the same way: for every communicator shape it names (its
        rows' ``nNodes,nRanks`` and :attr:`cover`) and every collective, rows cover every size
        ``0 .. MAX_BYTES`` with an explicit algorithm, protocol and channel count.

        * A size no row covers gets NCCL's own choice for that size, as the replica of NCCL's
          decision (:func:`ncclrl.costmodel.replica.default_decisions`) predicts it: algorithm,
          protocol and the channel count NCCL would use (``source`` ``nccl-default``).
        * A row of the shape's own whose ``source`` is ``nccl-default`` (a decision left to NCCL) is
          replaced the same way, size by size; a row whose algorithm is NCCL's (``default``) or whose
          channel count is NCCL's (<= 0) gets the replica's algorithm/protocol or channel count for
          each size, split where that changes. Other rows stay as they are.
        * The communicator channel count is the topology's, or ``nccl.conf``'s
          ``NCCL_MIN/MAX_NCHANNELS``.

        NVIDIA's example plugin runs any size no row covers, and any row with channels -1, on one
        channel; ncclrl's leaves them to NCCL: after this, both apply the same row to every size.
        A table that cannot be completed is a one-line :class:`ConfigError`: rows for any shape
        (-1) that leave sizes or channels to NCCL (NCCL's choice depends on the shape), rows of one
        communicator that overlap, or a shape the topology cannot hold (or no topology).
        """
        return _complete(self)

    def csv_text(self, where: str = "", versions: dict[str, Any] | None = None) -> str:
        """The ``nccl_tuner.csv`` text of the rows (a title comment, the header, one row a line);
        ``versions`` (:func:`nccl_versions`): the NCCL releases the rows mean the same on, as a line
        ncclrl's plugin reads (a WARN on other releases) and a comment saying why."""
        shapes = self.shapes()
        named = "" if len(shapes) < 2 else "\n# communicator shapes (nNodes x nRanks): " + \
            ", ".join(f"{n}x{r}" for n, r in shapes)
        lines = [f"# {self.title}{where}{named}"]
        if versions:
            if versions["versions"]:
                lines.append(f"{NCCL_VERSIONS_MARK}{versions['versions']}")
            else:
                lines.append("# no NCCL release runs every row as written (see the two lines below)")
            if versions["capped_rows"]:
                lines.append(f"# rows {', '.join(map(str, versions['capped_rows']))} (in row order) ask for more "
                             f"channels than NCCL {CAPS_FROM[:4]}+ lets a plugin give at some sizes: there NCCL runs "
                             "its own count")
            if versions.get("ll128_rows"):
                lines.append(f"# rows {', '.join(map(str, versions['ll128_rows']))} (in row order) force LL128 where "
                             f"NCCL up to 2.30 disables it (a socket network or PCIe): NCCL's choice runs there")
        lines.append(CSV_HEADER)
        for r in self.rows:  # NCCL's choice: our plugin leaves it to NCCL, the example plugin runs the row
            lines += [NCCL_CHOICE_MARK, r.line()] if r.source == FILLED else [r.line()]
        return "\n".join(lines) + "\n"

    def write(self, out_dir: Path, json_name: str = "nccl_tuner.json", extra: dict[str, Any] | None = None,
              ) -> dict[str, Path]:
        """``nccl_tuner.csv``, ``nccl.conf`` and the JSON (``extra`` added to it) into ``out_dir``,
        as one unit (:func:`write_unit`): a reader never sees half a file, and :func:`check_unit`
        (run by :meth:`read`) tells a table beside another write's ``nccl.conf`` from a whole one.
        The rows are completed first (:meth:`complete`; the table's rows become the written ones), so
        both plugins apply the same row to every size; a table that cannot be completed is a
        one-line :class:`ConfigError` and nothing is written."""
        self.rows = self.complete().rows
        out_dir = Path(out_dir)
        topo = self.topology
        where = (f" for {topo.name} ({plural(topo.nodes, 'node')}, {plural(topo.nranks, 'rank')}), NCCL "
                 f"{topo.nccl.version}") if topo else ""
        rows = [dict(r.__dict__) for r in self.rows]
        doc = {"provenance": self.provenance, "nccl_conf": self.conf, "rows": rows, **(extra or {})}
        if doc["rows"] is not rows:  # ``extra`` has rows of its own: the table's go beside them
            doc["table_rows"] = rows
        doc = json.dumps(doc, indent=1, default=str)
        conf = "".join(f"{k}={v}\n" for k, v in sorted(self.conf.items()))
        versions = nccl_versions(self) if topo else None
        written = write_unit(out_dir, {"nccl.conf": conf, json_name: doc,
                                       "nccl_tuner.csv": self.csv_text(where, versions)},
                             meta={"nccl": versions} if versions else None)
        return {"csv": written["nccl_tuner.csv"], "json": written[json_name], "conf": written["nccl.conf"]}

    @classmethod
    def read(cls, path: str | Path, topology: Topology | None = None) -> Table:
        """A table from ``nccl_tuner.csv`` (with the ``nccl.conf`` beside it, if any) or from its
        JSON; a file that is neither is a one-line :class:`ConfigError`."""
        path = Path(path)
        if not path.is_file():
            raise ConfigError("table", f"file not found: {path}")
        check_unit(path)
        text = path.read_text()
        if path.suffix == ".json":
            try:
                doc = json.loads(text)
                fields_ = set(Row.__dataclass_fields__)
                rows = [Row(**{k: v for k, v in r.items() if k in fields_}) for r in doc.get("table_rows", doc["rows"])]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise ConfigError("table", f"{path} is not an ncclrl JSON table ({type(e).__name__}: {e})") from None
            return cls(topology, rows, dict(doc.get("nccl_conf", {})), dict(doc.get("provenance", {})))
        try:
            raw = parse_example_rows(text)
        except ValueError as e:
            raise ConfigError("table", f"{path}: {e}") from None
        rows = [Row(r["collective"], r["min_bytes"], r["max_bytes"], r["algo"], r["proto"], r["channels"],
                    nnodes=r["nNodes"], nranks=r["nRanks"], **({"source": FILLED} if r["nccl_choice"] else {}))
                for r in raw]
        conf_path = path.with_name("nccl.conf")
        return cls(topology, rows, read_conf_env(conf_path) if conf_path.is_file() else {})


# -- the NCCL releases a table means the same on -------------------------------------------------------

# written after the title: the releases on which every row means what it says (ncclrl's plugin WARNs on others)
NCCL_VERSIONS_MARK = "#ncclrl:nccl-versions="
CAPS_FROM = "2.31.0"  # from this release a plugin's channels cap NCCL's own per-call count


def own_channels(topo: Topology, nbytes: int, algo: int, proto: int) -> int:
    """NCCL's own per-call channel count for a call of ``nbytes`` on this algorithm/protocol (indices),
    before its scheduler spreads the call (``topoGetAlgoInfo``)."""
    import numpy as np

    from ncclrl.costmodel import replica as R

    return int(R.auto_channels(R.build_model(topo), np.array([nbytes]), np.array([algo]), np.array([proto]))[0][0])


def caps_channels(topo: Topology) -> bool:
    """Whether the topology's NCCL (2.31+) takes a plugin's channels as a cap on its own count."""
    from ncclrl.costmodel import replica as R

    return R.parse_release(topo.nccl.version) >= R.parse_release(CAPS_FROM)


def channels_capped(topo: Topology, collective: str, nbytes: int, algo: str, proto: str, channels: int,
                    version: str = CAPS_FROM) -> int | None:
    """NCCL's own per-call channel count where NCCL ``version`` (2.31+) runs a row forcing
    ``algo/proto/channels`` on fewer channels than the row asks (a plugin's channels cap NCCL's own
    count there, after the scheduler spreads the call), else ``None``."""
    import numpy as np

    from ncclrl.costmodel import nccl as N
    from ncclrl.costmodel import replica as R

    if channels <= 0 or algo in ("default", "-1") or proto in ("default", "-1") or \
            R.parse_release(version) < R.parse_release(CAPS_FROM):
        return None
    t = topo.with_nccl(version=version)
    c, a, p = N.COLLECTIVES.index(collective), N.ALGOS.index(algo), N.PROTOS.index(proto)
    own = own_channels(t, nbytes, a, p)
    if own >= channels:
        return None
    args = (c, np.array([nbytes]), np.array([p]))
    rest = (t.nccl.channels, t.nranks, t.nccl.version)
    capped = int(R.scheduled_channels(*args, np.array([own]), *rest)[0])
    written = int(R.scheduled_channels(*args, np.array([channels]), *rest)[0])
    return own if capped < written else None


def _row_topologies(table: Table, r: Row) -> list[Topology]:
    """The communicator platforms a row applies to: its own shape, or for a row of any shape (-1) every
    shape the table names and the job's own (a shape this topology cannot hold is judged on the job's)."""
    topo = table.topology
    shapes = [(r.nnodes, r.nranks)] if r.nnodes > 0 and r.nranks > 0 else \
        [(n, k) for n, k in [*table.shapes(), *table.cover] if n > 0 and k > 0
         and r.nnodes in (-1, n) and r.nranks in (-1, k)]
    out = [topo]
    for n, k in shapes:
        try:
            out.append(topo.shape(n, k))
        except ConfigError:
            continue
    return list({id(t): t for t in out}.values())


def nccl_versions(table: Table) -> dict[str, Any]:
    """The NCCL releases on which every row of ``table`` means what it says, from those the replica
    follows (:data:`ncclrl.costmodel.replica.FIRST_RELEASE` .. ``LAST_RELEASE``):

    * up to 2.30 when a row asks for more channels than NCCL 2.31+ lets a plugin give at its first
      byte, a middle size or its last byte (up to 1 GiB), on every shape it applies to (``capped_rows``);
    * from 2.31 when the table is made for 2.31+ and a row forces LL128 where NCCL up to 2.30 disables
      it (a socket network or PCIe: ``ll128_rows``); both: no release (``versions`` empty).

    Rows stating NCCL's choice are left to NCCL by ncclrl's plugin and do not count. ``{"versions":
    "2.27-2.32", "made_for": ..., "capped_rows": [row numbers, 1-based], "ll128_rows": [...]}``."""
    from ncclrl.costmodel import replica as R

    lo, hi = R.FIRST_RELEASE, R.LAST_RELEASE
    capped: list[int] = []
    ll128: list[int] = []
    topo = table.topology
    made_for = R.parse_release(topo.nccl.version) if topo else lo
    cap = R.parse_release(CAPS_FROM)
    for i, r in enumerate(table.rows):
        if topo is None or r.source == FILLED or r.algo in ("default", "-1") or r.proto in ("default", "-1"):
            continue
        top = min(r.max_bytes, 1 << 30)
        sizes = sorted({max(r.min_bytes, 1), max(1, int((max(r.min_bytes, 1) * max(top, 1)) ** 0.5)), max(top, 1)})
        tops = _row_topologies(table, r)
        if r.channels > 0 and any(channels_capped(t, r.collective, s, r.algo, r.proto, r.channels)
                                  for t in tops for s in sizes):
            capped.append(i + 1)
        if made_for >= cap and r.proto == "ll128" and any(R.ll128_hw_gate(t) for t in tops):
            ll128.append(i + 1)
    first = (cap[0], cap[1]) if ll128 else lo[:2]
    last = (cap[0], cap[1] - 1) if capped else hi[:2]
    versions = f"{first[0]}.{first[1]}-{last[0]}.{last[1]}" if first <= last else ""
    return {"versions": versions, "made_for": topo.nccl.version if topo else None, "capped_rows": capped,
            "ll128_rows": ll128}


# -- completion: every size of every collective and shape, explicit everywhere ----------------------

FILLED = "nccl-default"  # the source of a row that states NCCL's own choice (the replica's prediction)
# the comment line written before such a row: ncclrl's plugin skips the row and NCCL decides that size
# itself (its real choice, not a prediction of it); plugins that need every size covered (NVIDIA's
# example, which runs any size no row covers on one channel) read it as a comment and run the row
NCCL_CHOICE_MARK = "#ncclrl:nccl-choice"
COLLECTIVES = EXAMPLE_COLLECTIVES  # NCCL's order


def _explicit(r: Row) -> bool:
    return r.algo not in ("default", "-1") and r.proto not in ("default", "-1") and r.channels > 0


def _shape_name(nodes: int, nranks: int) -> str:
    return f"{'any' if nodes == -1 else nodes} nodes x {'any' if nranks == -1 else nranks} ranks"


def uncovered_spans(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The sizes ``0 .. MAX_BYTES`` no span (inclusive) covers, as inclusive ranges."""
    gaps, nxt = [], 0
    for lo, hi in sorted(spans):
        if lo > nxt:
            gaps.append((nxt, min(lo - 1, MAX_BYTES)))
        nxt = max(nxt, hi + 1)
        if nxt > MAX_BYTES:
            break
    if nxt <= MAX_BYTES:
        gaps.append((nxt, MAX_BYTES))
    return gaps


def _first_overlap(rows: list[Row]) -> tuple[Row, Row] | None:
    ordered = sorted(rows, key=lambda r: (r.min_bytes, r.max_bytes))
    for a, b in zip(ordered, ordered[1:], strict=False):
        if b.min_bytes <= a.max_bytes:
            return a, b
    return None


def _comm_channels(table: Table, topo: Topology) -> int:
    """The communicator's channel count NCCL settles on: the topology's within ``nccl.conf``'s
    ``NCCL_MIN_NCHANNELS`` .. ``NCCL_MAX_NCHANNELS``."""
    ch = topo.nccl.channels
    if table.conf.get("NCCL_MAX_NCHANNELS"):
        ch = min(ch, int(table.conf["NCCL_MAX_NCHANNELS"]))
    if table.conf.get("NCCL_MIN_NCHANNELS"):
        ch = max(ch, int(table.conf["NCCL_MIN_NCHANNELS"]))
    return ch


def replica_pieces(topo: Topology, collective: str, lo: int, hi: int, algo: str = "default", proto: str = "default",
                   channels: int = 0, comm_channels: int = 0) -> list[tuple[int, int, str, str, int]]:
    """``lo .. hi`` cut where the replica's decision changes: ``(min_bytes, max_bytes, algorithm,
    protocol, channels)`` pieces, exact to the byte. NCCL's algorithm/protocol where ``algo`` is
    ``default``, NCCL's per-call channel count for them (``topoGetAlgoInfo``'s ``nMaxChannels``,
    what a tuner's ``nChannels`` sets) where ``channels`` <= 0. Size 0 takes the decision of 1 B.

    The decision is piecewise constant in the size: the cost table's times are linear in it between
    powers of two (the Tree correction's steps) and the Ring/Simple plateau, and channels step at
    multiples of threads x threshold. Sizes on a grid that holds all those points and 64 per octave
    are decided, then every neighbouring pair that differs is bisected to the byte.

    :param topo: the communicator's platform (:meth:`Topology.shape`)
    :param comm_channels: the communicator's channel count (0: the topology's)
    """
    import numpy as np

    from ncclrl.costmodel import nccl as N
    from ncclrl.costmodel import replica as R

    c = N.COLLECTIVES.index(collective)
    model = R.build_model(topo)
    comm = comm_channels if comm_channels > 0 else topo.nccl.channels
    fixed = None if algo in ("default", "-1") else (N.ALGOS.index(algo), N.PROTOS.index(proto))

    def decide(sizes: np.ndarray) -> np.ndarray:
        s = np.maximum(sizes, 1)
        if fixed is None:
            d = R.default_decisions(topo, c, s, comm_channels=comm)
            a, p, ch = d.algo, d.proto, d.max_channels
        else:
            a, p = np.full(s.shape, fixed[0]), np.full(s.shape, fixed[1])
            ch, _ = R.auto_channels(model, s, a, p, comm)
        if channels > 0:
            ch = np.full(s.shape, channels)
        return (a.astype(np.int64) * 8 + p) * 4096 + ch

    pts = {lo, hi}
    k = 0
    while (1 << k) <= hi:
        b = 1 << k
        pts.update(v + e for j in range(64) for v in (b + ((b * j) >> 6),) for e in (-1, 0))
        k += 1
    steps = {int(x) for x in np.unique(model.max_threads * model.thread_thresholds) if x > 0}
    pts.update(m * t + e for t in steps for m in range(1, comm + 2) for e in (-1, 0))
    plateau = 64 * model.channels * topo.nranks
    pts.update((plateau - 1, plateau))
    grid = np.array(sorted(p for p in pts if lo <= p <= hi), dtype=np.int64)
    known = dict(zip(grid.tolist(), decide(grid).tolist(), strict=True))
    todo = [(a, b) for a, b in zip(grid[:-1].tolist(), grid[1:].tolist(), strict=True)
            if known[a] != known[b] and b - a > 1]
    while todo:
        mids = np.array([(a + b) // 2 for a, b in todo], dtype=np.int64)
        known.update(zip(mids.tolist(), decide(mids).tolist(), strict=True))
        nxt = []
        for (a, b), m in zip(todo, mids.tolist(), strict=True):
            nxt += [(x, y) for x, y in ((a, m), (m, b)) if known[x] != known[y] and y - x > 1]
        todo = nxt
    sizes = sorted(known)
    out: list[tuple[int, int, str, str, int]] = []
    for i, size in enumerate(sizes):
        code = known[size]
        if out and known[sizes[i - 1]] == code:
            continue
        end = next((sizes[j] - 1 for j in range(i + 1, len(sizes)) if known[sizes[j]] != code), hi)
        ap, ch = divmod(code, 4096)
        out.append((size, end, N.ALGOS[ap // 8], N.PROTOS[ap % 8], ch))
    return out


def _complete(table: Table) -> Table:
    """:meth:`Table.complete`."""
    from dataclasses import replace

    rows = table.rows
    for r in rows:
        if r.collective not in COLLECTIVES:
            raise ConfigError("table", f"row {r.line()!r}: unknown collective {r.collective!r}; allowed: "
                              f"{', '.join(COLLECTIVES)}")
    named = [(r.nnodes, r.nranks) for r in rows if r.nnodes != -1 and r.nranks != -1]
    shapes = list(dict.fromkeys(named + [tuple(s) for s in table.cover]))
    wild = [r for r in rows if r.nnodes == -1 or r.nranks == -1]
    for r in wild:  # a row for any shape cannot state NCCL's choice: it differs by shape
        if not _explicit(r) or r.source == FILLED:
            raise ConfigError("table", f"{r.collective} {r.min_bytes}..{r.max_bytes} B for "
                              f"{_shape_name(r.nnodes, r.nranks)} leaves its algorithm, protocol or channels to "
                              "NCCL, which differ by communicator shape: name the shape (nNodes, nRanks) instead")
    for pattern in dict.fromkeys((r.nnodes, r.nranks) for r in wild):  # shapes no row names: wild rows alone
        for coll in dict.fromkeys(r.collective for r in wild if (r.nnodes, r.nranks) == pattern):
            lane = [r for r in wild if r.collective == coll and r.nnodes in (-1, pattern[0]) and
                    r.nranks in (-1, pattern[1])]
            both = _first_overlap(lane)
            if both:
                raise ConfigError("table", f"rows {both[0].line()!r} and {both[1].line()!r} overlap: the plugins "
                                  "would read them differently")
            gaps = uncovered_spans([(r.min_bytes, r.max_bytes) for r in lane])
            if gaps:
                raise ConfigError("table", f"the rows for {_shape_name(*pattern)} leave {coll} "
                                  f"{gaps[0][0]}..{gaps[0][1]} B uncovered, where NVIDIA's example plugin runs one "
                                  "channel; cover it, or name the shape (nNodes, nRanks) so NCCL's choice can fill it")
    out: list[Row] = []
    for nodes, nranks in shapes:
        topo, comm, nccl = None, 0, {}
        # the collectives its rows name first, in their order, then the others in NCCL's
        for coll in dict.fromkeys([r.collective for r in rows if (r.nnodes, r.nranks) == (nodes, nranks)]
                                  + list(COLLECTIVES)):
            lane = [r for r in rows if r.collective == coll and r.nnodes in (-1, nodes) and r.nranks in (-1, nranks)]
            mine = [r for r in lane if (r.nnodes, r.nranks) == (nodes, nranks)]
            if table.topology is not None:  # rows left to NCCL are stated anew, size by size
                lane = [r for r in lane if (r.nnodes, r.nranks) != (nodes, nranks) or r.source != FILLED]
                mine = [r for r in mine if r.source != FILLED]
            both = _first_overlap(lane)
            if both:
                raise ConfigError("table", f"rows {both[0].line()!r} and {both[1].line()!r} overlap on "
                                  f"communicators of {_shape_name(nodes, nranks)}: the plugins would read them "
                                  "differently")
            gaps = uncovered_spans([(r.min_bytes, r.max_bytes) for r in lane])
            if not gaps and all(_explicit(r) for r in mine):
                out += sorted(mine, key=lambda r: r.min_bytes)
                continue
            if topo is None:
                if table.topology is None:
                    what = f"{coll} {gaps[0][0]}..{gaps[0][1]} B" if gaps else \
                        next(r.line() for r in mine if not _explicit(r))
                    raise ConfigError("table", f"{what} on {_shape_name(nodes, nranks)} is left to NCCL and there is "
                                      "no topology to fill it with NCCL's choice")
                if nranks < 2:
                    raise ConfigError("table", f"rows for {_shape_name(nodes, nranks)}: NCCL runs no algorithm on "
                                      "one rank; leave that shape out")
                try:
                    topo = table.topology.shape(nodes, nranks)
                except ConfigError as e:
                    raise ConfigError("table", f"cannot fill rows for {_shape_name(nodes, nranks)} with NCCL's "
                                      f"choice: {e}") from None
                comm = _comm_channels(table, topo)
            new: list[Row] = []
            for r in mine:
                if _explicit(r):
                    new.append(r)
                    continue
                for i, (lo, hi, a, p, ch) in enumerate(replica_pieces(topo, coll, r.min_bytes, r.max_bytes, r.algo,
                                                                      r.proto, r.channels, comm)):
                    new.append(replace(r, min_bytes=lo, max_bytes=hi, algo=a, proto=p, channels=ch,
                                       **({} if i == 0 else {"time_us": None, "default_time_us": None})))
            if gaps and coll not in nccl:
                nccl[coll] = replica_pieces(topo, coll, 0, MAX_BYTES, comm_channels=comm)
            for glo, ghi in gaps:  # NCCL's pieces, cut to the gap
                new += [Row(coll, max(lo, glo), min(hi, ghi), a, p, ch, source=FILLED, nnodes=nodes, nranks=nranks)
                        for lo, hi, a, p, ch in nccl.get(coll, []) if lo <= ghi and hi >= glo]
            out += sorted(new, key=lambda r: r.min_bytes)
    out += wild
    return Table(table.topology, out, dict(table.conf), dict(table.provenance), table.title, list(table.cover))


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


CONF_KEYS = {"NCCL_MIN_NCHANNELS": "comm_channels", "NCCL_MAX_NCHANNELS": "comm_channels",
             "NCCL_BUFFSIZE": "buffsize_bytes", "NCCL_SOCKET_NTHREADS": "socket_nthreads",
             "NCCL_NSOCKS_PERTHREAD": "nsocks_perthread", "NCCL_SOCKET_INLINE": "socket_inline_bytes"}


def read_conf_env(path: str | Path) -> dict[str, int]:
    """An ``nccl.conf`` (KEY=VALUE lines, ``#`` comments) as NCCL variable -> value, every variable
    as written (``NCCL_MIN_NCHANNELS`` and ``NCCL_MAX_NCHANNELS`` each); a file that is not UTF-8
    text, a key ncclrl does not set, or a value that is not a whole number >= 1, is a one-line
    :class:`ConfigError` naming the file."""
    env: dict[str, int] = {}
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(str(path), f"not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start}); an "
                          "nccl.conf holds KEY=VALUE lines in ASCII") from None
    except OSError as e:
        raise ConfigError(str(path), f"cannot read: {e.strerror}") from None
    for ln, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        key, sep, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or key not in CONF_KEYS:
            raise ConfigError(f"{path}:{ln}", f"unknown setting {key!r}; allowed: {', '.join(CONF_KEYS)}")
        if not value.isdigit() or int(value) < 1:
            raise ConfigError(f"{path}:{ln}:{key}", f"must be a whole number >= 1, got {value!r}")
        env[key] = int(value)
    return env


def read_conf(path: str | Path) -> Point:
    """The per-process knobs of an ``nccl.conf`` as a knob setting. A knob setting holds one channel
    count per communicator (``NCCL_MIN_NCHANNELS`` = ``NCCL_MAX_NCHANNELS``, what ncclrl writes), so
    both bounds given and different (a range, within which NCCL picks) is a one-line
    :class:`ConfigError`; one bound alone is taken as that count."""
    env = read_conf_env(path)
    lo, hi = env.get("NCCL_MIN_NCHANNELS"), env.get("NCCL_MAX_NCHANNELS")
    if lo is not None and hi is not None and lo != hi:
        raise ConfigError(f"{path}:NCCL_MIN_NCHANNELS", f"NCCL_MIN_NCHANNELS={lo} and NCCL_MAX_NCHANNELS={hi} are a "
                          "range, within which NCCL picks the channel count; ncclrl measures one count per "
                          "communicator (both set to it): set both to one value")
    return Point("allreduce", 1, **{CONF_KEYS[k]: v for k, v in env.items()})


# -- tables written whole ----------------------------------------------------------------------------

MANIFEST = "nccl_tuner.manifest"  # beside the files a table write produced: their fingerprints
MANIFEST_FORMAT = 1


def _umask() -> int:
    """The process's file-creation mask, read without changing it (``/proc/self/status`` on Linux;
    elsewhere set and restored at once)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _replace_file(path: Path, data: bytes) -> None:
    """``path`` holds ``data`` or what it held before, never part of it: a temporary file in the same
    folder, flushed to disk, renamed over ``path``. The file gets the mode any new file gets
    (``0666 & ~umask``), not the temporary file's 0600: a job under another account reads it."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_unit(out_dir: Path, texts: dict[str, str], meta: dict[str, Any] | None = None) -> dict[str, Path]:
    """Write the files ``texts`` (name -> content) into ``out_dir`` as one unit, in the order given
    (a table: ``nccl.conf`` first, ``nccl_tuner.csv`` last). First :data:`MANIFEST` is replaced by one
    that says a write is under way, then each file goes to a temporary name and is renamed into place,
    then the manifest is replaced by one naming every file's fingerprint (:func:`fingerprint`) and
    size. A writer that dies midway leaves the "writing" manifest, or files whose fingerprints differ
    from the manifest's: :func:`check_unit` refuses both, so no reader takes a table with another
    write's ``nccl.conf`` for a whole one. A table's fingerprint (the manifest's ``fingerprint``) is
    also logged, as the ``NCCLRL_TUNER_TABLE_FINGERPRINT`` a deployment sets on every rank (the
    plugin then fails a rank's init whose file has other bytes; it refuses a table file read without
    that variable).

    :param out_dir: the folder (created if needed)
    :param texts: file name -> text
    :param meta: more keys of the complete manifest (a table's: ``nccl``, the NCCL releases its rows mean
        the same on, :func:`nccl_versions`)
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    data = {name: text.encode() for name, text in texts.items()}
    _replace_file(out_dir / MANIFEST, json.dumps({"format": MANIFEST_FORMAT, "state": "writing",
                                                  "files": sorted(data)}, indent=1).encode() + b"\n")
    for name, blob in data.items():
        _replace_file(out_dir / name, blob)
    files_ = {name: {"fingerprint": fingerprint(blob), "bytes": len(blob)} for name, blob in data.items()}
    table = files_.get("nccl_tuner.csv", {}).get("fingerprint")
    _replace_file(out_dir / MANIFEST, json.dumps({"format": MANIFEST_FORMAT, "state": "complete",
                                                  "fingerprint": table, "files": files_, **(meta or {})},
                                                 indent=1).encode() + b"\n")
    if table:
        log.info("# %s: fingerprint %s; deploy it with NCCLRL_TUNER_TABLE=%s NCCLRL_TUNER_TABLE_FINGERPRINT=%s on "
                 "every rank (also in %s)", out_dir / "nccl_tuner.csv", table, (out_dir / "nccl_tuner.csv").resolve(),
                 table, MANIFEST)
    return {name: out_dir / name for name in data}


def check_unit(path: str | Path) -> dict[str, Any] | None:
    """Whether the files of the table write that ``path`` (a table file, or its folder) belongs to
    are whole and of one write: ``None`` when the folder has no :data:`MANIFEST` (written by hand, or
    before manifests), else the manifest; a write that did not finish, or a listed file whose bytes
    differ from what that write put there, is a one-line :class:`ConfigError`."""
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    man = folder / MANIFEST
    if not man.is_file():
        return None
    try:
        doc = json.loads(man.read_text())
        state, listed = doc["state"], doc["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError("table", f"{man} is unreadable ({type(e).__name__}): the table's files may come from "
                          "different writes; write the table again") from None
    if state != "complete":
        raise ConfigError("table", f"{folder}: a write of this table did not finish ({MANIFEST} says {state!r}): "
                          "its files may mix two writes; write the table again")
    for name, meta in listed.items():
        f = folder / name
        if not f.is_file():
            raise ConfigError("table", f"{f} is missing: {MANIFEST} lists it (fingerprint {meta['fingerprint']})")
        got = fingerprint(f.read_bytes())
        if got != meta["fingerprint"]:
            raise ConfigError("table", f"{f} changed after the table was written (fingerprint {got}, {MANIFEST} "
                              f"says {meta['fingerprint']}): it no longer goes with the other files of that write; "
                              f"write the table again (or delete {MANIFEST} to use the files as they are)")
    return doc


# -- the plugin's own reading of a table --------------------------------------------------------------

CHECKER = "ncclrl-table-check"


@dataclass
class RowVerdict:
    """What the plugin does with one line of a table: ``accepted`` (``row`` holds its fields as the
    plugin read them: collective, min_bytes, max_bytes, algorithm, protocol, channels (-1: NCCL's),
    nNodes, nRanks, numPipeOps, regBuff, chunk_bytes) or rejected (``message``: its WARN)."""

    line: int
    accepted: bool
    message: str = ""
    row: tuple | None = None


@dataclass
class TableCheck:
    """A table as the plugin reads it (:func:`check_table`).

    :param source: the file checked
    :param size: its bytes
    :param fingerprint: FNV-1a of its bytes (the plugin's INFO line)
    :param rows: well-formed rows (every communicator shape)
    :param refused: why the plugin refuses the whole table (NCCL decides everything), or ""
    :param verdicts: per row or rejected line, in line order
    :param shapes: the communicator shapes checked, ``(nNodes, nRanks, rows loaded)`` (-1: a value no row names)
    :param nccl_choice: rows marked as stating NCCL's choice (:data:`NCCL_CHOICE_MARK`): the plugin
        skips them and NCCL decides those sizes itself
    """

    source: str
    size: int = 0
    fingerprint: str = ""
    rows: int = 0
    refused: str = ""
    verdicts: list[RowVerdict] = field(default_factory=list)
    shapes: list[tuple[int, int, int]] = field(default_factory=list)
    nccl_choice: int = 0

    @property
    def rejected(self) -> list[RowVerdict]:
        return [v for v in self.verdicts if not v.accepted]

    @property
    def accepted(self) -> list[RowVerdict]:
        return [v for v in self.verdicts if v.accepted]

    @property
    def ok(self) -> bool:
        """The plugin loads every row (nothing refused, nothing rejected)."""
        return not self.refused and not self.rejected

    def summary(self) -> str:
        if self.refused:
            return f"plugin check: refused whole, NCCL decides everything: {self.refused}"
        loads = f"{plural(len(self.accepted), 'row')} load{'s' if len(self.accepted) == 1 else ''}"
        return (f"plugin check: {self.size} bytes, fingerprint {self.fingerprint}, {loads}, "
                f"{len(self.rejected)} rejected" + (f", {self.nccl_choice} marked as NCCL's choice (NCCL decides "
                                                    "those sizes)" if self.nccl_choice else ""))


def plugin_checker(build_dir: str | Path | None = None) -> Path:
    """The program that reads a table with the plugin's own code (``plugin/table_check.c`` compiled
    with ``ncclrl_tuner.c``), built from the installed sources into ``build_dir`` (default: where
    ``ncclrl plugin build`` puts the plugin, ``$NCCLRL_PLUGIN_DIR`` or ``~/.cache/ncclrl/plugin``)
    when missing or older than its sources, said on stderr (a progress line) when it compiles; a failed
    build is a one-line :class:`ConfigError` and leaves no folder it made."""
    src = Path(str(files("ncclrl") / "plugin"))
    out = Path(build_dir or os.environ.get("NCCLRL_PLUGIN_DIR", "~/.cache/ncclrl/plugin")).expanduser().resolve()
    make = ["make", "--no-print-directory", "-C", str(src), f"BUILD={out}", str(out / CHECKER)]
    made = None if out.exists() else out  # the topmost folder this build makes (removed again if it fails)
    while made is not None and not made.parent.exists():
        made = made.parent
    try:
        current = subprocess.run([*make[:1], "-q", *make[1:]], capture_output=True, timeout=60).returncode == 0
        if not current:
            log.info("# compiling the table checker (the plugin's own parser, %s) into %s: once, and again when its "
                     "sources change", CHECKER, out)
            out.mkdir(parents=True, exist_ok=True)
            p = subprocess.run(make, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as e:
        _unmake(made)
        raise ConfigError("plugin", f"cannot build the table checker ({e}): it needs make and a C compiler") from None
    if not current and p.returncode != 0:
        _unmake(made)
        last = (p.stderr or p.stdout).strip().splitlines()[-1:] or ["make failed"]
        raise ConfigError("plugin", f"building the table checker failed: {last[0]}")
    return out / CHECKER


def _unmake(made: Path | None) -> None:
    """After a failed build: the folders it made (``made`` the topmost; None: none), removed."""
    if made is not None:
        shutil.rmtree(made, ignore_errors=True)


def check_table(path: str | Path, checker: str | Path | None = None) -> TableCheck:
    """Read the table file ``path`` with the plugin's own code (:func:`plugin_checker`): the same
    file checks (a regular file, at most 16 MiB, no NUL byte), parser and per-communicator rules
    (overlaps, filter limit) for every communicator shape the table can meet. Nothing is
    re-implemented here, so what this reports is what NCCL's ranks will load.

    :param path: the CSV table
    :param checker: the checker program (default: :func:`plugin_checker`)
    """
    prog = Path(checker) if checker else plugin_checker()
    try:
        p = subprocess.run([str(prog), str(path)], capture_output=True, text=True, timeout=120, errors="replace")
    except (OSError, subprocess.SubprocessError) as e:
        raise ConfigError("plugin", f"the table checker failed on {path}: {e}") from None
    lines = p.stdout.splitlines()
    if p.returncode != 0 or not lines or lines[0] != f"{CHECKER}\t1":
        raise ConfigError("plugin", f"the table checker failed on {path}: {(p.stderr or p.stdout).strip()[:200]}")
    out = TableCheck(str(path))
    for line in lines[1:]:
        kind, _, rest = line.partition("\t")
        f = rest.split("\t")
        if kind == "table":
            out.size, out.fingerprint, out.rows = int(f[0]), f[1], int(f[2])
        elif kind == "refused":
            out.refused = rest
        elif kind == "nccl_choice":
            out.nccl_choice = int(f[0])
        elif kind == "shape":
            out.shapes.append((int(f[0]), int(f[1]), int(f[2])))
        elif kind == "accepted":
            row = (f[1], int(f[2]), int(f[3]), f[4], f[5], *map(int, f[6:12]))
            out.verdicts.append(RowVerdict(int(f[0]), True, "", row))
        elif kind == "rejected":
            out.verdicts.append(RowVerdict(int(f[0]), False, rest.partition("\t")[2]))
    return out


def check_text(text: str | bytes, checker: str | Path | None = None) -> TableCheck:
    """:func:`check_table` on a table's text (through a temporary file)."""
    with tempfile.TemporaryDirectory(prefix="ncclrl-check-") as d:
        path = Path(d) / "nccl_tuner.csv"
        path.write_bytes(text.encode() if isinstance(text, str) else text)
        res = check_table(path, checker)
    res.source = "<text>"
    res.refused = res.refused.replace(str(path), "the table")
    return res


def plugin_decision(check: TableCheck, collective: str, nbytes: int, nodes: int, nranks: int,
                    num_pipe_ops: int = 1, reg_buff: int = 0) -> tuple[str, str, int]:
    """What ncclrl's plugin makes of a call, every cost-table entry enabled, from the rows its own
    code accepted (:func:`check_table`): the one accepted row that matches (rows of one
    communicator never overlap) forces its algorithm and protocol (-1: NCCL's) and sets its channel
    count (-1: NCCL's); no row leaves everything to NCCL.

    :return: (algorithm, protocol, channels) as :func:`example_decision` gives them (0: NCCL's count)
    """
    if check.refused:
        return NCCL_OWN, NCCL_OWN, 0
    for v in check.accepted:
        c, lo, hi, a, p, ch, nn, nr, pipe, reg = v.row[:10]
        if c == collective and lo <= nbytes <= hi and nn in (-1, nodes) and nr in (-1, nranks) and \
                pipe in (-1, num_pipe_ops) and reg in (-1, reg_buff):
            return NCCL_OWN if a == "-1" else a, NCCL_OWN if p == "-1" else p, max(ch, 0)
    return NCCL_OWN, NCCL_OWN, 0

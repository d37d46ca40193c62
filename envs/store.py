"""The durable measurement store: every live measurement in one embedded SQLite database.

One row per measured point (configuration x size) with all its samples, so nothing measured is
lost and an interrupted sweep resumes where it stopped (``has``). WAL journal with full sync:
a row is on disk once ``add`` returns (the rows of one job together, in one transaction, under
:meth:`Store.batch`). Several processes may share a store: SQLite's busy timeout makes a writer wait
for the other's transaction. ``Store(path, readonly=True)`` (:func:`open_readonly`) never changes
the store's file nor the ``-wal``/``-shm`` files beside it, and never migrates its schema (an older
store is read as it is). Light on purpose (stdlib + numpy): it runs on the GPU machine too.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import socket
import sqlite3
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.noise import summarize
from ncclrl.costmodel.space import KNOB_FIELDS, Point
from ncclrl.envs.live import HANG, block_group, timing_label

log = logging.getLogger(__name__)
# how long a writer waits for another process's transaction on the same store
BUSY_TIMEOUT_S = 60.0

JOBS_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (  -- what ran each job: one row per job (set of processes)
    job TEXT PRIMARY KEY,
    ts REAL NOT NULL,
    backend TEXT NOT NULL,
    topology TEXT NOT NULL,
    tag TEXT NOT NULL,
    nccl_version TEXT NOT NULL,  -- the NCCL that ran (as the library reported it)
    launcher TEXT NOT NULL,      -- local, torchrun, srun, mpirun, nccl-tests' own
    command TEXT NOT NULL,       -- the launcher's command line
    hosts TEXT NOT NULL,         -- JSON list
    gpus TEXT NOT NULL,          -- JSON list of GPU models
    driver TEXT NOT NULL,        -- JSON list of driver versions
    cuda TEXT NOT NULL,          -- JSON list of CUDA versions
    nccl_env TEXT NOT NULL,      -- JSON object: rank 0's NCCL_* environment
    ranks_reported INTEGER NOT NULL
);
"""

SCHEMA = """
CREATE TABLE IF NOT EXISTS measurements (
    id INTEGER PRIMARY KEY,
    ts REAL NOT NULL,
    host TEXT NOT NULL,
    backend TEXT NOT NULL,
    topology TEXT NOT NULL,
    nccl_version TEXT NOT NULL,
    collective TEXT NOT NULL,
    nbytes INTEGER NOT NULL,
    algo TEXT NOT NULL,          -- 'default' = NCCL's own choice
    proto TEXT NOT NULL,
    channels INTEGER NOT NULL,   -- 0 = NCCL's own
    comm_channels INTEGER NOT NULL,
    buffsize_bytes INTEGER NOT NULL,
    socket_nthreads INTEGER NOT NULL,
    nsocks_perthread INTEGER NOT NULL,
    socket_inline_bytes INTEGER NOT NULL DEFAULT 0,  -- NCCL_SOCKET_INLINE, 0 = NCCL's default
    timing TEXT NOT NULL,        -- 'graph' or 'eager'
    tag TEXT NOT NULL,           -- what the measurement was for: sweep, finetune, guard, validate
    status TEXT NOT NULL,        -- ok, failed, timeout
    samples_us TEXT NOT NULL,    -- JSON list of per-call times
    median_us REAL,
    ci_lo_us REAL,
    ci_hi_us REAL,
    error TEXT,
    job TEXT NOT NULL DEFAULT '',  -- one id per job (set of processes); '' in stores from before it
    compute_slowdown TEXT  -- JSON list per sample: a compute load's slowdown beside the call (sweep load=); NULL: none
);
CREATE INDEX IF NOT EXISTS by_point ON measurements
    (topology, backend, collective, nbytes, algo, proto, channels, comm_channels, buffsize_bytes,
     socket_nthreads, nsocks_perthread, tag);
"""


@dataclass
class Store:
    """An SQLite measurement store at ``path`` (created on first use)."""

    path: Path
    host: str = field(default_factory=socket.gethostname)

    readonly: bool = False

    def __post_init__(self) -> None:
        self.path = Path(self.path)
        self._batch = 0
        self._snapshot: tempfile.TemporaryDirectory | None = None
        if self.readonly:
            self._open_readonly()
            return
        self._check_writable()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(str(self.path), timeout=BUSY_TIMEOUT_S)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(SCHEMA)
            cols = {r[1] for r in self._db.execute("PRAGMA table_info(measurements)")}
            if "socket_inline_bytes" not in cols:  # a store from before the knob: its rows ran with NCCL's default
                self._db.execute("ALTER TABLE measurements ADD COLUMN socket_inline_bytes INTEGER NOT NULL DEFAULT 0")
            if "job" not in cols:  # a store from before job ids: job_ids() infers them from the timestamps
                self._db.execute("ALTER TABLE measurements ADD COLUMN job TEXT NOT NULL DEFAULT ''")
            if "compute_slowdown" not in cols:  # a store from before compute loads: none ran
                self._db.execute("ALTER TABLE measurements ADD COLUMN compute_slowdown TEXT")
            self._db.commit()
        except (sqlite3.Error, OSError) as e:
            raise ConfigError("store", f"cannot open {self.path}: {e}") from None

    def _check_writable(self) -> None:
        """Refuse, before anything is measured, a store this process must not write: a file or
        folder without write permission (even for root, who could write it anyway)."""
        p, folder = self.path, self.path.parent
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
        if p.exists():
            if not p.is_file():
                raise ConfigError("store", f"{p} is not a file; name the SQLite store file (store=runs/store.sqlite)")
            if not (p.stat().st_mode & 0o222) or not os.access(p, os.W_OK):
                raise ConfigError("store", f"{p} is read-only; make it writable (chmod u+w) or name another store=")
        if folder.exists() and (not folder.is_dir() or not (folder.stat().st_mode & 0o222)
                                or not os.access(folder, os.W_OK | os.X_OK)):
            raise ConfigError("store", f"cannot write in {folder} (read-only or not a folder); SQLite needs to "
                              "write its journal next to the store: name a store= in a writable folder")

    def _open_readonly(self) -> None:
        """Read without writing a byte anywhere, file permissions aside. With no journal beside the
        file (no ``-wal``, or an empty one: no writer has rows in it), SQLite opens the file itself
        ``mode=ro&immutable=1``: no lock, no ``-shm``, nothing created. With rows in a ``-wal`` (a
        writer at work, or one that died), SQLite would write the ``-shm`` to read them (its read
        marks, or a recovery) and ``immutable`` would miss them: the file and its journal are copied
        into a private folder and read there, every committed row included."""
        if not self.path.is_file():
            raise ConfigError("store", f"no store at {self.path}")
        wal = self.path.with_name(self.path.name + "-wal")
        try:
            src = self._snapshot_copy(wal) if wal.is_file() and wal.stat().st_size > 0 else self.path.resolve()
            uri = f"file:{quote(str(src))}?mode=ro&immutable=1"
            self._db = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S)
            self._db.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
        except (sqlite3.Error, OSError) as e:
            self._drop_snapshot()
            raise ConfigError("store", f"cannot read {self.path}: {e}") from None

    def _snapshot_copy(self, wal: Path) -> Path:
        """The store and its ``-wal`` copied into a private temporary folder (taken again while a
        writer changes them under the copy, up to 5 times; SQLite's frame checksums leave out a
        journal frame copied half-written); the copy's path. The copy is opened once read-write, so
        that SQLite folds the journal into it there; it is then read ``immutable`` like a file alone."""
        self._snapshot = tempfile.TemporaryDirectory(prefix="ncclrl-store-")
        dst = Path(self._snapshot.name) / self.path.name
        def state() -> list:
            return [(p.stat().st_size, p.stat().st_mtime_ns) if p.is_file() else None for p in (self.path, wal)]

        for _ in range(5):
            before = state()
            shutil.copyfile(self.path, dst)
            if wal.is_file():
                shutil.copyfile(wal, dst.with_name(dst.name + "-wal"))
            if state() == before:
                break
        db = sqlite3.connect(str(dst))
        try:
            db.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            db.close()
        return dst

    def _drop_snapshot(self) -> None:
        if self._snapshot is not None:
            self._snapshot.cleanup()
            self._snapshot = None

    @contextlib.contextmanager
    def batch(self):
        """Rows added inside are committed together when it closes (one job's rows: a kill stores
        all of them or none); an error rolls them back."""
        self._batch += 1
        try:
            yield self
        except BaseException:
            self._batch -= 1
            if not self._batch:
                with contextlib.suppress(sqlite3.Error):
                    self._db.rollback()
            raise
        self._batch -= 1
        if not self._batch:
            try:
                self._db.commit()
            except sqlite3.Error as e:
                raise ConfigError("store", f"cannot write to {self.path}: {e}; earlier measurements are kept, "
                                  "rerun to resume") from None

    def close(self) -> None:
        self._db.close()
        self._drop_snapshot()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add(self, point: Point, samples: list[float], *, backend: str, topology: str, nccl_version: str,
            timing: str, tag: str, status: str = "ok", error: str | None = None, job: str = "",
            compute_slowdown: list[float] | None = None) -> None:
        """Store one point's samples. A time that is not a finite number above zero (NaN, 0,
        negative: a broken timer or output) is no measurement: the point is stored ``failed`` with
        the reason, never ``ok``, so it can never be the best. ``compute_slowdown``: per sample, the
        slowdown of a compute load that ran beside it (``None``: no load)."""
        bad = bad_time(samples)
        if bad is not None and status == "ok":
            status, error = "failed", f"invalid time {bad!r} us: not a finite number > 0"
            log.warning("# %s %d B %s/%s/%d: %s; stored as failed", point.collective, int(point.nbytes), point.algo,
                        point.proto, int(point.channels), error)
        if bad is not None:
            samples = []
        med, lo, hi = summarize(samples) if samples else (None, None, None)
        try:
            self._db.execute(
                "INSERT INTO measurements (ts, host, backend, topology, nccl_version, collective, nbytes, algo, proto,"
                " channels, comm_channels, buffsize_bytes, socket_nthreads, nsocks_perthread, socket_inline_bytes,"
                " timing, tag, status, samples_us, median_us, ci_lo_us, ci_hi_us, error, job, compute_slowdown)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (time.time(), self.host, backend, topology, nccl_version, point.collective, int(point.nbytes),
                 point.algo, point.proto, int(point.channels), *map(int, point.knobs), timing, tag, status,
                 json.dumps([round(float(s), 4) for s in samples]), med, lo, hi, error, job,
                 None if compute_slowdown is None else json.dumps([round(float(x), 4) for x in compute_slowdown])))
            if not self._batch:
                self._db.commit()
        except sqlite3.Error as e:  # a full disk lands here; what was committed before stays
            raise ConfigError("store", f"cannot write to {self.path}: {e}; earlier measurements are kept, "
                              "free space and rerun to resume") from None

    def has(self, point: Point, *, backend: str, topology: str, tag: str, launch: str | None = None,
            hung: bool = False) -> bool:
        """Whether ``point`` has a measurement (``status='ok'`` with a median above 0) under ``tag``;
        only one taken with ``launch`` (torch|nccl) when given; with ``hung``, a recorded hang, timeout
        or too-slow point counts too (``NCCL hung``, a point skipped after one, status ``timeout`` or
        ``slow``): such a point is never measured again (``after_hang=retry`` measures it)."""
        where = dict(zip(KNOB_FIELDS, map(int, point.knobs), strict=True))
        q, args = self._where(dict(topology=topology, backend=backend, collective=point.collective,
                                   nbytes=int(point.nbytes), algo=point.algo, proto=point.proto,
                                   channels=int(point.channels), tag=tag, **where), launch)
        q += (" AND ((status='ok' AND typeof(median_us) IN ('real', 'integer') AND median_us > 0)"
              + (" OR status IN ('timeout', 'slow') OR (status='failed' AND instr(error, ?) > 0))" if hung else ")"))
        return self._db.execute(f"SELECT 1 FROM measurements{q} LIMIT 1",
                                args + [HANG] * hung).fetchone() is not None

    def blocked(self, *, topology: str, backend: str) -> dict[tuple, tuple[int, str]]:
        """Where NCCL hung, timed out or ran far too slowly, in any command's measurements for
        ``topology`` and ``backend``: per (knob setting, :func:`ncclrl.envs.live.block_group`), the
        smallest such size and its error. Those points, and their group at larger sizes under the same
        knobs, are never measured again (NCCL's own choice is never blocked: it is the reference)."""
        knob_cols = ", ".join(KNOB_FIELDS)
        rows = self._db.execute(
            f"SELECT collective, algo, proto, channels, {knob_cols}, nbytes, status, error FROM measurements"
            " WHERE topology=? AND backend=? AND (status IN ('timeout', 'slow') OR (status='failed' AND"
            " instr(error, ?) > 0)) ORDER BY nbytes", [topology, backend, HANG]).fetchall()
        out: dict[tuple, tuple[int, str]] = {}
        for coll, algo, proto, ch, *rest in rows:
            knobs, nbytes, status, error = tuple(map(int, rest[:len(KNOB_FIELDS)])), *rest[len(KNOB_FIELDS):]
            if algo == "default" and int(ch) == 0:
                continue
            key = (knobs, block_group(Point(coll, int(nbytes), algo, proto, int(ch)), status == "failed"))
            out.setdefault(key, (int(nbytes), str(error or "")))
        return out

    def add_job(self, job: str, *, backend: str, topology: str, tag: str, nccl_version: str = "?",
                launcher: str = "", command: str = "", hosts: list | None = None, gpus: list | None = None,
                driver: list | None = None, cuda: list | None = None, nccl_env: dict | None = None,
                ranks_reported: int = 0) -> None:
        """Record what ran job ``job`` (its provenance); a backend that knows nothing of it records
        only the job."""
        try:
            if not self._db.execute("SELECT 1 FROM sqlite_master WHERE name='jobs'").fetchone():
                self._db.execute(JOBS_SCHEMA)  # made on first use: a store only read stays as it was
            self._db.execute(
                "INSERT OR REPLACE INTO jobs (job, ts, backend, topology, tag, nccl_version, launcher, command, hosts,"
                " gpus, driver, cuda, nccl_env, ranks_reported) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (job, time.time(), backend, topology, tag, nccl_version or "?", launcher, command,
                 json.dumps(hosts or []), json.dumps(gpus or []), json.dumps(driver or []), json.dumps(cuda or []),
                 json.dumps(nccl_env or {}, sort_keys=True), int(ranks_reported)))
            if not self._batch:
                self._db.commit()
        except sqlite3.Error as e:
            raise ConfigError("store", f"cannot write to {self.path}: {e}; earlier measurements are kept") from None

    def jobs(self):
        """Every job's provenance as a pandas DataFrame."""
        import pandas as pd

        if not self._db.execute("SELECT 1 FROM sqlite_master WHERE name='jobs'").fetchone():
            return pd.DataFrame(columns=["job", "ts", "backend", "topology", "tag", "nccl_version", "launcher",
                                         "command", "hosts", "gpus", "driver", "cuda", "nccl_env", "ranks_reported"])
        return pd.read_sql_query("SELECT * FROM jobs ORDER BY ts", self._db)

    def count(self, **where: Any) -> int:
        q, args = self._where(where)
        return int(self._db.execute(f"SELECT COUNT(*) FROM measurements{q}", args).fetchone()[0])

    def _where(self, where: dict[str, Any], launch: str | None = None) -> tuple[str, list]:
        """The SQL ``WHERE`` clause of column equalities, and of the timings of ``launch`` when given."""
        cols, args = [f"{k}=?" for k in where], list(where.values())
        if launch is not None:
            cols.append("timing IN (?, ?)")
            args += [timing_label(launch, "eager"), timing_label(launch, "graph")]
        return (" WHERE " + " AND ".join(cols), args) if cols else ("", [])

    def frame(self, launch: str | None = None, **where: Any):
        """All matching rows as a pandas DataFrame (samples as lists); only those measured with
        ``launch`` (torch|nccl) when given."""
        import pandas as pd

        q, args = self._where(where, launch)
        df = pd.read_sql_query(f"SELECT * FROM measurements{q} ORDER BY id", self._db, params=args)
        for col, default in (("socket_inline_bytes", 0), ("job", ""), ("compute_slowdown", None)):
            if col not in df.columns:  # an old store opened read-only
                df[col] = default
        df["compute_slowdown"] = df["compute_slowdown"].map(lambda s: json.loads(s) if isinstance(s, str) else None)
        return drop_corrupt(df, self.path)

    def export_csv(self, out: Path, **where: Any) -> Path:
        df = self.frame(**where)
        df["samples_us"] = df["samples_us"].map(lambda s: " ".join(f"{v:g}" for v in s))
        df.to_csv(out, index=False)
        return Path(out)


def bad_time(samples) -> Any:
    """The first sample that is not a finite time above zero, else ``None``."""
    for v in samples:
        try:
            f = float(v)
        except (TypeError, ValueError):
            return v
        if not math.isfinite(f) or f <= 0:
            return f
    return None


def drop_corrupt(df, path: Path):
    """``df`` with ``samples_us`` parsed, without the rows whose stored values are unusable (samples
    that are not a JSON list of times, an ``ok`` row whose times or median are not finite numbers
    above zero): each is reported in one line naming its row id, the rest is kept."""
    keep, parsed = [], []
    for rid, status, raw, med in zip(df["id"], df["status"], df["samples_us"], df["median_us"], strict=True):
        why, smp = "", []
        try:
            smp = json.loads(raw) if isinstance(raw, str) else None
            if not isinstance(smp, list):
                why = f"samples_us is not a JSON list: {str(raw)[:40]!r}"
            elif status == "ok" and (not smp or bad_time(smp) is not None):
                why = f"samples_us holds {bad_time(smp)!r}, not times > 0" if smp else "an ok row without samples"
        except (ValueError, TypeError):
            why = f"samples_us is not JSON: {str(raw)[:40]!r}"
        if not why and status == "ok":
            try:
                m = float(med)
            except (TypeError, ValueError):
                m = math.nan
            if not math.isfinite(m) or m <= 0:
                why = f"median_us is {med!r}, not a time > 0"
        if why:
            log.warning("# store %s: row id %s is corrupt (%s); left out, the other rows are used", path, rid, why)
        keep.append(not why)
        parsed.append(smp if not why else [])
    import pandas as pd

    df = df.assign(samples_us=pd.Series(parsed, index=df.index, dtype=object))
    df = df.loc[pd.Series(keep, index=df.index, dtype=bool)].reset_index(drop=True)
    for col in ("median_us", "ci_lo_us", "ci_hi_us"):
        df[col] = pd.to_numeric(df[col], errors="coerce").astype(float)
    return df


def open_readonly(path: str | Path) -> Store:
    """A store opened only to read (``mode=ro``): what commands that read a store use."""
    return Store(Path(path), readonly=True)


def job_ids(df, gap_s: float = 3.0):
    """The job of each row of a :meth:`Store.frame` as a Series: the ``job`` column where it is set;
    for rows from before job ids, inferred from the order of insertion (a job's rows are written
    together when it returns): a new job starts after a pause of more than ``gap_s``, at a change of
    topology, tag or per-process knobs, or when a point repeats."""
    import pandas as pd

    out, n, last, seen, prev = [], 0, None, set(), None
    for r in df.sort_values("id").itertuples():
        if r.job:
            out.append((r.id, r.job))
            continue
        head = (r.topology, r.tag, *(getattr(r, k) for k in KNOB_FIELDS))
        key = (r.collective, r.nbytes, r.algo, r.proto, r.channels)
        if last is not None and (r.ts - last > gap_s or head != prev or key in seen):
            n, seen = n + 1, set()
        seen.add(key)
        last, prev = r.ts, head
        out.append((r.id, f"ts{n}"))
    ids = dict(out)
    return pd.Series([ids[i] for i in df["id"]], index=df.index, name="job")

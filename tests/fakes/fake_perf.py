#!/usr/bin/env python3
"""A stand-in for nccl-tests' *_perf binaries: prints REAL recorded all_reduce_perf output from
../shared/data, chosen by the configuration our plugin's one-row table asks for, and misbehaves on
cue to exercise fault handling.

It reads the table as the plugin does (``NCCLRL_TUNER_TABLE_DATA``, else the file named by
``NCCLRL_TUNER_TABLE``, which loads only when ``NCCLRL_TUNER_TABLE_FINGERPRINT`` is its fingerprint
or ``any``: otherwise the plugin's WARN and, unless ``NCCLRL_TUNER_ON_ERROR=fallback``, a failed
init) and, with ``NCCL_DEBUG=INFO`` and the TUNING subsystem, prints the plugin's line
``TUNER/ncclrl: table from SOURCE (N bytes, R rows, fingerprint F): ...`` once per GPU it drives.
Under ``mpirun`` (``OMPI_COMM_WORLD_*``) or ``srun`` (``SLURM_PROCID``/``SLURM_NTASKS``) it is one
rank of the job: every rank prints its plugin line; rank 0 prints the recorded output with its
``# Rank`` lines rewritten for the job's world size and this host.

Cues (environment):

* ``FAKE_PERF_MODE=hang|fail|warn|wrong|truncate|ttimeout`` (rank 0): sleep; exit 3 after an NCCL
  WARN; an NCCL WARN in the output; a wrong result; a cut output; nccl-tests' ``-T`` timeout message
* ``FAKE_PERF_HANG_ON=<config>``: hang on that configuration (``tree_LL``, ``c4``, ``default``)
* ``FAKE_PERF_HANG_RANK=r``: rank r hangs after NCCL's init; the others wait for it, as NCCL would
* ``FAKE_PERF_DIE_RANK=r``: rank r is killed (SIGKILL) after NCCL's init; the others wait
* ``FAKE_PERF_TABLE_RANK=r``: rank r sees a different table; with a table forced, every rank then
  waits forever (ranks that decide differently hang NCCL)
* ``FAKE_PERF_PLAIN_RANK=r``: rank r runs without the plugin (as on a node where it did not load);
  with a table forced on the others, every rank then waits forever
* ``FAKE_PERF_NO_MPI=1``: behave like a binary built without MPI=1: every process runs alone;
  ``interleave``: the same, each process printing a line every 30 ms, the launcher's rank r
  starting r x 45 ms late, so that the processes' runs interleave line by line
* ``FAKE_PERF_SLEEP=s``: rank 0 takes ``s`` seconds before it prints its table
* ``FAKE_PERF_TIME=v``: rank 0 prints ``v`` (``nan``, ``0``, ``-5``) as the out-of-place time of the
  8 B and 1 GiB rows
* ``FAKE_PERF_BINARY=1``: rank 0 writes bytes that are not UTF-8 (in a log line and in the header)
* ``FAKE_PERF_LINGER=s``: rank 0 leaves a grandchild, in a session of its own, that holds the
  output open for ``s`` seconds after a complete run
"""
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path

FOREVER = 600


def fnv1a(data: bytes) -> str:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def rank_env() -> tuple[int, int, int, int]:
    """(rank, world, local rank, local size) of this process."""
    if os.environ.get("FAKE_PERF_NO_MPI"):
        return 0, 1, 0, 1
    e = os.environ
    if "OMPI_COMM_WORLD_RANK" in e:
        return (int(e["OMPI_COMM_WORLD_RANK"]), int(e["OMPI_COMM_WORLD_SIZE"]),
                int(e.get("OMPI_COMM_WORLD_LOCAL_RANK", "0")), int(e.get("OMPI_COMM_WORLD_LOCAL_SIZE", "1")))
    if "SLURM_PROCID" in e:
        return (int(e["SLURM_PROCID"]), int(e["SLURM_NTASKS"]), int(e.get("SLURM_LOCALID", "0")),
                int(e.get("SLURM_NTASKS_PER_NODE", e["SLURM_NTASKS"]).split("(")[0]))
    return 0, 1, 0, 1


def nccl_line(dev: int, text: str) -> None:
    """One NCCL debug line, written whole in one write as NCCL does."""
    os.write(1, f"{host}:{pid}:{pid} [{dev}] NCCL {text}\n".encode())


def flag(name: str, default: str) -> str:
    args = sys.argv[1:]
    for i, a in enumerate(args[:-1]):
        if a == name:
            return args[i + 1]
    return default


def debug_on(subsys: str) -> bool:
    """Whether NCCL prints INFO lines of subsystem ``subsys`` under this environment."""
    if os.environ.get("NCCL_DEBUG", "").upper() not in ("INFO", "TRACE"):
        return False
    spec = os.environ.get("NCCL_DEBUG_SUBSYS", "INIT,BOOTSTRAP,ENV").upper()
    names = [x.strip() for x in spec.lstrip("^").split(",")]
    hit = subsys in names or "ALL" in names
    return not hit if spec.startswith("^") else hit


rank, world, local, local_size = rank_env()
if os.environ.get("FAKE_PERF_NO_MPI") == "interleave":
    time.sleep(0.045 * int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("SLURM_PROCID", "0"))))
ngpus = int(flag("-g", "1"))
host = socket.gethostname().split(".")[0]
pid = os.getpid()
data = Path(os.environ["FAKE_PERF_DATA"])
mode = os.environ.get("FAKE_PERF_MODE", "")



def file_table(path: str) -> str | None:
    """The table file as the plugin takes it: loaded when NCCLRL_TUNER_TABLE_FINGERPRINT is the
    fingerprint of its bytes or ``any``; else its WARN, then NCCL decides (fallback) or the init fails."""
    raw = Path(path).read_bytes()
    want, got = os.environ.get("NCCLRL_TUNER_TABLE_FINGERPRINT", "").lower(), fnv1a(raw)
    if want in ("any", got):
        return raw.decode()
    why = (f"is a file and NCCLRL_TUNER_TABLE_FINGERPRINT is unset: ...; set NCCLRL_TUNER_TABLE_FINGERPRINT={got} "
           f"(these {len(raw)} bytes' fingerprint; ...) on every rank, or =any to load files unchecked" if not want
           else f"has fingerprint {got}, not the {want} that NCCLRL_TUNER_TABLE_FINGERPRINT expects ({len(raw)} bytes)")
    if os.environ.get("NCCLRL_TUNER_ON_ERROR", "").lower() == "fallback":
        nccl_line(local * ngpus, f"WARN TUNER/ncclrl: table {path} {why}: NCCL's own decisions everywhere")
        return None
    nccl_line(local * ngpus, f"WARN TUNER/ncclrl: table {path} {why}: this communicator's init fails "
              "(NCCLRL_TUNER_ON_ERROR=fallback keeps NCCL's own decisions instead)")
    nccl_line(local * ngpus, "WARN ncclCommInitRank: invalid usage")
    sys.exit(1)


table = None
source = "NCCLRL_TUNER_TABLE_DATA"
plain = os.environ.get("FAKE_PERF_PLAIN_RANK", "") == str(rank)
if os.environ.get("NCCL_TUNER_PLUGIN", "none") not in ("", "none"):
    if os.environ.get("NCCLRL_TUNER_TABLE_DATA"):
        table = os.environ["NCCLRL_TUNER_TABLE_DATA"]
    elif os.environ.get("NCCLRL_TUNER_TABLE"):
        source = os.environ["NCCLRL_TUNER_TABLE"]
        table = file_table(source)
mismatch = table is not None and (os.environ.get("FAKE_PERF_TABLE_RANK", "") != "" or
                                  os.environ.get("FAKE_PERF_PLAIN_RANK", "") != "")
if plain:
    table = None
if table is not None and os.environ.get("FAKE_PERF_TABLE_RANK") == str(rank):
    table += "broadcast,0,max,ring,simple,1,-1,-1\n"

name = "default"
if table is not None:
    f = next(ln for ln in table.splitlines() if ln.strip() and not ln.startswith("#")).split(",")
    algo, proto, ch = f[3], f[4], int(f[5])
    if algo == "-1":  # NCCL's own algorithm and protocol at a channel count: recorded as c1, c4, c16
        name = f"c{ch}" if ch > 0 else "default"
    else:
        name = f"{algo}_{ {'ll': 'LL', 'll128': 'LL128', 'simple': 'Simple'}[proto] }" + (f"_c{ch}" if ch > 0 else "")
if os.environ.get("FAKE_PERF_HANG_ON") == name:
    mode = "hang"
path = data / f"all_reduce__{name.replace(' ', '')}.txt"
if not path.exists():
    path = data / "all_reduce__default.txt"
text = path.read_text()
lines = text.splitlines()
code = re.search(r"nccl-library=(\d+)", text)
version = f"{int(code.group(1)) // 10000}.{int(code.group(1)) % 10000 // 100}.{int(code.group(1)) % 100}" \
    if code else "2.28.3"

# rank 0 prints the header and every rank's device line (nccl-tests gathers them over MPI)
cut = next(i for i, ln in enumerate(lines) if ln.startswith("#  Rank"))
rest = [ln for ln in lines[cut:] if not ln.startswith("#  Rank")]
gpu = lines[cut].split("]", 1)[1].strip()
if rank == 0:
    out = lines[:cut]
    for r in range(world * ngpus):
        dev = r % (max(local_size, 1) * ngpus)
        out.append(f"#  Rank {r:2d} Group  0 Pid {pid + r // ngpus:6d} on {host:>10s} device {dev:2d} "
                   f"[0000:00:{6 + dev:02x}] {gpu}")
    print("\n".join(out), flush=True)

# NCCL's init on every GPU this process drives: the plugin logs the table it loaded
for i in range(ngpus):
    dev = local * ngpus + i
    if debug_on("INIT"):
        nccl_line(dev, f"INFO NCCL version {version}+cuda12.8")
    if debug_on("ENV"):
        for k in ("NCCL_HOSTID", "NCCL_SOCKET_IFNAME"):
            if k in os.environ:
                nccl_line(dev, f"INFO {k} set by environment to {os.environ[k]}")
    if table is not None and debug_on("TUNING"):
        raw = table.encode()
        rows = sum(1 for ln in table.splitlines() if ln.strip() and not ln.lstrip().startswith("#"))
        nccl_line(dev, f"INFO TUNER/ncclrl: table from {source} ({len(raw)} bytes, {rows} rows, "
                  f"fingerprint {fnv1a(raw)}): {rows} for this communicator ({world * ngpus} ranks), 0 rejected; "
                  "tuner ABI v5")



def init_barrier() -> None:
    """NCCL's init is collective: no rank runs a collective (rank 0: prints a row) before every
    rank has finished its init, so every rank's init lines reach the launcher before rank 0's
    rows. The fake ranks meet in a folder named by their launch (Open MPI's job id, Slurm's step);
    rank 0 waits (10 s at most) until every rank has been there."""
    e = os.environ
    job = e.get("OMPI_MCA_ess_base_jobid") or e.get("PMIX_NAMESPACE") or \
        (f"slurm{e.get('SLURM_JOB_ID', '')}.{e.get('SLURM_STEP_ID', '')}" if "SLURM_PROCID" in e else "")
    if not job or world < 2:
        return
    meet = Path(tempfile.gettempdir()) / f"fake-perf-init-{job}"
    meet.mkdir(exist_ok=True)
    (meet / f"rank{rank}").touch()
    if rank == 0:
        end = time.time() + 10
        while time.time() < end and len(list(meet.glob("rank*"))) < world:
            time.sleep(0.01)
        shutil.rmtree(meet, ignore_errors=True)


def meet_folder(what: str) -> Path | None:
    """The folder the job's fake ranks meet in for ``what``, named by their launch (Open MPI's job
    id, Slurm's step); ``None`` for a single process."""
    e = os.environ
    job = e.get("OMPI_MCA_ess_base_jobid") or e.get("PMIX_NAMESPACE") or \
        (f"slurm{e.get('SLURM_JOB_ID', '')}.{e.get('SLURM_STEP_ID', '')}" if "SLURM_PROCID" in e else "")
    if not job or world < 2:
        return None
    return Path(tempfile.gettempdir()) / f"fake-perf-{what}-{job}"


def finalize() -> None:
    """MPI_Finalize is collective: no rank exits before rank 0 has printed its last row, so the
    launcher still runs every rank while rank 0's output drains (a rank that left early lets the
    launcher wind the job down around rank 0's last lines). Rank 0 leaves its mark after printing;
    the others wait for it (10 s at most), and rank 0 for them before it removes the folder."""
    meet = meet_folder("fini")
    if meet is None:
        return
    meet.mkdir(exist_ok=True)
    (meet / f"rank{rank}").touch()
    end = time.time() + 10
    if rank == 0:
        while time.time() < end and len(list(meet.glob("rank*"))) < world:
            time.sleep(0.01)
        time.sleep(0.05)  # the others see rank 0's mark before the folder goes
        shutil.rmtree(meet, ignore_errors=True)
    else:
        while time.time() < end and (meet / "rank0").exists() is False and meet.exists():
            time.sleep(0.01)


init_barrier()
if os.environ.get("FAKE_PERF_DIE_RANK") == str(rank):
    os.kill(pid, signal.SIGKILL)
if mismatch or os.environ.get("FAKE_PERF_HANG_RANK", "") != "" or os.environ.get("FAKE_PERF_DIE_RANK", "") != "":
    time.sleep(FOREVER)  # the hung rank, and every rank waiting on it
if rank != 0:
    finalize()
    sys.exit(0)

time.sleep(float(os.environ.get("FAKE_PERF_SLEEP", "0")))
body = "\n".join(rest)
if mode == "hang":
    time.sleep(FOREVER)
if mode == "fail":
    print(f"{host}:{pid}:{pid} [0] NCCL WARN Net : Connection closed by remote peer", file=sys.stderr, flush=True)
    sys.exit(3)
if mode == "warn":
    body = f"{host}:{pid}:{pid} [0] misc/alloc.cc:42 NCCL WARN Cuda failure 'out of memory'\n" + body
if mode == "wrong":
    body = body.replace("N/A", "7", 1)
if mode == "truncate":
    body = "\n".join(body.splitlines()[:10])
if mode == "ttimeout":
    t = flag("-T", "0")
    head = "\n".join(body.splitlines()[:6])
    print(head + f"\n           8             2     float     sum      -1{host}: Test timeout ({t}s) common.cu:523",
          flush=True)
    sys.exit(1)
bad = os.environ.get("FAKE_PERF_TIME")
if bad is not None:
    rows = body.split("\n")
    for i, ln in enumerate(rows):
        f = ln.split()
        if len(f) > 5 and f[0] in ("8", "1073741824"):
            rows[i] = ln.replace(f" {f[5]} ", f" {bad:>{len(f[5])}} ", 1)
    body = "\n".join(rows)
if os.environ.get("FAKE_PERF_BINARY"):
    sys.stdout.flush()
    os.write(1, b"# \xff\xfe device name \xc3\x28 not UTF-8\n")
    os.write(1, f"{host}:{pid}:{pid} [0] NCCL INFO \x80\x81 bytes \xe9t\xe9\n".encode("latin-1"))
if os.environ.get("FAKE_PERF_LINGER"):
    if os.fork() == 0:  # the grandchild: a session of its own (no group kill reaches it), stdout kept
        os.setsid()
        time.sleep(float(os.environ["FAKE_PERF_LINGER"]))
        os._exit(0)
if os.environ.get("FAKE_PERF_NO_MPI") == "interleave":
    for ln in body.split("\n"):
        print(ln, flush=True)
        time.sleep(0.03)
else:
    print(body, flush=True)
finalize()

"""Everything that starts, watches and ends a job's processes, and the keys that describe a job.

A *job* is one set of processes, one per GPU, that together make one NCCL communicator. The
launcher (:class:`LaunchConfig`, ``launcher.kind``) decides how they start:

* ``local``: ncclrl starts one process per rank on this host (several "nodes" on one host are
  emulated with a distinct ``NCCL_HOSTID`` per node and sockets on loopback);
* ``torchrun``: one ``torchrun`` agent per node (c10d rendezvous), started on this host or through
  ``remote`` (``ssh {host}`` by default) on the others;
* ``srun``: one Slurm step of ``nodes x gpus_per_node`` tasks inside the user's allocation;
* ``mpirun``: Open MPI with a host list, ranks per node and the environment forwarded with ``-x``.

The modules, in the order a job lives:

* :mod:`.config`: :class:`LaunchConfig`; how a process learns its rank (:func:`rank_env`) and GPU;
* :mod:`.spec`: :class:`JobSpec` (launcher, nodes, what every rank is handed, the worker module,
  :class:`JobOptions`: the timeouts) and the command lines it becomes (:func:`launch_commands`).
  What a job must know travels in environment variables, never through a file, so it reaches
  every node byte for byte without a shared file system;
* :mod:`.process`: :class:`Job`, the running processes: each launcher process in a process group
  of its own, read as it writes, and ended with everything it started (its group, its
  descendants, every process on this host holding the job's token :data:`TOKEN_ENV`);
* :mod:`.records`: the one-line records ``NCCLRL|rank|kind|payload`` a rank writes;
* :mod:`.run`: :func:`run_job`, the one wait loop (end, a watch's reason, every rank done, the
  timeout, SIGINT/SIGTERM), :func:`run_to_end` on top of it, and :class:`Interrupted`;
* :mod:`.rank`: the rank's side: :func:`join_job`, :class:`Out`, the watchdog, :func:`run_worker`;
* :mod:`.coordinator`: the online mode's coordinator beside a job.

Errors are typed by cause: what the user wrote is a :class:`ncclrl.costmodel.errors.ConfigError`
(exit 2); what the cluster did is reported in the :class:`JobEnd` (a timeout, a rank's error, a
signal) and becomes a stored failure or an :class:`Interrupted` at the caller.
"""

from ncclrl.envs.jobs.config import KINDS, LOCAL_HOSTS, RANK_VARS_BY_KIND, LaunchConfig, rank_env, rank_gpu
from ncclrl.envs.jobs.coordinator import start_coordinator, stop_coordinator
from ncclrl.envs.jobs.process import TOKEN_ENV, Job, LauncherOutput, exit_words, job_folder
from ncclrl.envs.jobs.records import MARK, Record, parse_record, parse_records, payload_json
from ncclrl.envs.jobs.run import (
    FirstError,
    Interrupted,
    JobEnd,
    SignalLatch,
    Watch,
    ending_on_signals,
    run_job,
    run_to_end,
    stop_requested,
)
from ncclrl.envs.jobs.spec import (
    FORWARD,
    JOB_ENV,
    MAX_ENV_BYTES,
    OTHER_TABLE_ENV,
    RANK_VARS,
    TABLE_ENV,
    WORKER,
    JobOptions,
    JobSpec,
    base_env,
    decode,
    encode,
    first_node,
    free_port,
    launch_commands,
    user_env,
)

__all__ = [
    "FORWARD", "JOB_ENV", "KINDS", "LOCAL_HOSTS", "MARK", "MAX_ENV_BYTES", "OTHER_TABLE_ENV", "RANK_VARS",
    "RANK_VARS_BY_KIND", "TABLE_ENV", "TOKEN_ENV", "WORKER", "FirstError", "Interrupted", "Job", "JobEnd",
    "JobOptions", "JobSpec", "LaunchConfig", "LauncherOutput", "Record", "SignalLatch", "Watch", "base_env",
    "decode", "encode", "ending_on_signals", "exit_words", "first_node", "free_port", "job_folder",
    "launch_commands", "parse_record", "parse_records", "payload_json", "rank_env", "rank_gpu", "run_job",
    "run_to_end", "start_coordinator", "stop_coordinator", "stop_requested", "user_env",
]

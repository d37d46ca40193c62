"""ncclrl: learn how NCCL should run each collective on your cluster.

Subpackages, each importing only from the ones before it:

* :mod:`ncclrl.costmodel`: what NCCL is (topology, replica of NCCL's decision, simulator,
  calibration, the search space, the table format, noise statistics);
* :mod:`ncclrl.envs`: the Gymnasium environment and the measurement backends;
* :mod:`ncclrl.agents`: learning and tuning (pretraining, fine-tuning, the baseline tuners);
* :mod:`ncclrl.runners`: the ``ncclrl`` command.

Importing :mod:`ncclrl.envs` registers the Gymnasium environment ``ncclrl/NcclTune-v0``; so does
importing ``ncclrl`` after ``gymnasium`` (``import gymnasium as gym, ncclrl``), and
``gym.make("ncclrl.envs:ncclrl/NcclTune-v0")`` imports it itself. Otherwise the package imports no
subpackage, so a command loads only what it uses (no Gymnasium for a table command).
"""

from __future__ import annotations

import logging
import sys
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("ncclrl")
except PackageNotFoundError:  # not installed: a source tree on sys.path
    __version__ = "0+unknown"

logging.getLogger(__name__).addHandler(logging.NullHandler())

if "gymnasium" in sys.modules:  # a Gymnasium user: register the environments now
    from ncclrl import envs as _envs  # noqa: E402,F401

"""``python -m ncclrl``: the ``ncclrl`` command."""

import sys

from ncclrl.runners.cli import main

sys.exit(main())

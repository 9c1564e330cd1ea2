"""``python -m gpulayer.local``: the embedded cluster's supervisor (started by ``up`` and ``start_for_process``)."""

import sys

from .supervisor import main

sys.exit(main())

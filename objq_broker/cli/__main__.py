"""``python -m objq_broker.cli``: the ``objq`` command."""

import sys

from objq_broker.cli import main

sys.exit(main())

"""``python -m objq_broker``: the same as ``objq demo`` (it takes the same options)."""

import sys

from objq_broker.cli import main

sys.exit(main(["demo", *sys.argv[1:]]))

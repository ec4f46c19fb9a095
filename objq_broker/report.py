"""``python -m objq_broker.report``: the Spark report over the archive (see
:mod:`objq_broker.spark.report`)."""

from __future__ import annotations

import sys

from objq_broker.spark.report import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())

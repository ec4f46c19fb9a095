"""The old name of ``tests/support/servers.py``, kept for the benchmarks.

They put ``tests/`` on ``sys.path`` and ``import servers``; the helpers now live in the
``tests.support`` package, importable from the repository root, which is put on the path here.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.servers import *  # noqa: F403

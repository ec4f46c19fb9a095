"""The build: pure Python, unless ``OBJQ_COMPILE=1`` asks for the commit path compiled.

Everything is declared in ``pyproject.toml``; this file only adds the compiled modules. With
``OBJQ_COMPILE=1`` (and mypy, a C compiler and Python's headers at hand), the modules every
commit runs through are compiled to C extensions with mypyc, which takes about a third off an
operation's time when the store answers at once (``benchmarks/README.md``, "The compiled
build"). The ``.py`` files ship beside them. The build backend (``_build/backend.py``) adds
mypy to the build's requirements when it is asked for. The published wheels for CPython are
built so (``CONTRIBUTING.md``, "Releasing"); a build from source, an editable install
included, stays pure unless asked. CI runs the tests of what it compiles, and of the API over
it, against a compiled copy (``scripts/test-compiled``).

    PYTHON=python scripts/build-compiled /tmp/objq-compiled    # a compiled copy of the tree
    scripts/test-compiled tests/engine                          # the tests against one
    OBJQ_COMPILE=1 python -m pip wheel --no-deps . -w dist      # a compiled wheel
"""

from __future__ import annotations

import os

from setuptools import setup

#: The modules a commit runs through, compiled when asked: the engine's commit path and the
#: model it applies and encodes. ``scripts/test-compiled`` runs the tests against them. What
#: compiled code does otherwise than Python, and so what a module here must not do:
#:
#: - a value that does not match its annotation (a float for an ``int``) is refused with a
#:   TypeError where it is passed: the modules that take the user's values and check them
#:   (``core``, ``builders``, the ``Engine``'s constructor) stay Python, so that the error
#:   stays the one that says what was expected;
#: - a class written in Python cannot subclass a compiled one: the stores, which tests and
#:   users subclass to inject faults, stay Python;
#: - a function assigned in a class body is not bound as a method, and a descriptor there is
#:   not called (``Forwarded``): such classes stay Python, and ``QueueState``'s transitions
#:   are methods that call their modules' functions;
#: - an instance has no ``__dict__``;
#: - a variable bound by two ``except`` clauses keeps the type of the first;
#: - a dataclass's ``__init__`` is still Python: what is made per operation is a plain class.
COMPILED = [
    "objq_broker/engine/applying.py",
    "objq_broker/engine/archive.py",
    "objq_broker/engine/batch.py",
    "objq_broker/engine/batcher.py",
    "objq_broker/engine/guard.py",
    "objq_broker/engine/loading.py",
    "objq_broker/engine/loop.py",
    "objq_broker/engine/oversize.py",
    "objq_broker/engine/timings.py",
    "objq_broker/engine/writing.py",
    "objq_broker/model/backlog.py",
    "objq_broker/model/encoding.py",
    "objq_broker/model/ids.py",
    "objq_broker/model/indexed.py",
    "objq_broker/model/leases.py",
    "objq_broker/model/lifecycle.py",
    "objq_broker/model/producing.py",
    "objq_broker/model/reading.py",
    "objq_broker/model/spilling.py",
    "objq_broker/model/state.py",
    "objq_broker/model/tally.py",
]


def _extensions() -> list[object]:
    if os.environ.get("OBJQ_COMPILE", "") in ("", "0"):
        return []
    from mypyc.build import mypycify  # only a compiled build needs mypy

    # Not the project's mypy settings (strict, for the type check): a build must not depend
    # on the stubs that check wants (boto3's, say), only on what the compiled modules import.
    options = ["--config-file", os.devnull, "--ignore-missing-imports"]
    return list(mypycify([*options, *COMPILED], opt_level="3"))


setup(ext_modules=_extensions())

"""The test suite, a package: each folder mirrors the ``objq_broker`` package it tests (two folders
may hold files of the same name), and shared helpers are imported as ``tests.support.*``.

Run from the repository root: ``python -m pytest -n 2 --dist loadgroup`` (see CONTRIBUTING.md).
"""

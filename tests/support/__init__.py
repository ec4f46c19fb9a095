"""What the tests share: real peers to run against (``servers``), child processes
(``processes``), waiting for a condition (``waiting``) and upstream suites (``upstream_sdist``).

Shared constants and helpers live here, imported by their module path; no test imports a
``conftest`` by name (with several test folders, another folder's ``conftest`` may answer).
"""

"""How objq's main components are built: files, lines, classes, the longest chain of classes
that inherit from each other inside a component, and the attributes assigned in more than one
class of one such chain (an attribute with more than one owner).

    python benchmarks/structure.py            # this checkout
    python benchmarks/structure.py --root DIR # another checkout (a worktree of an older commit)
    python benchmarks/structure.py -v         # name the attributes

An attribute counts as assigned by a class when a method of it assigns ``self.<name>`` (or a
state transition ``state.<name>``); classes are linked by the base names they list.
"""

from __future__ import annotations

import argparse
import ast
from collections import Counter
from pathlib import Path

COMPONENTS = {
    "engine": ("objq_broker/engine", None),
    "queue API": (
        "objq_broker",
        (
            "queue.py",
            "queue_base.py",
            "queue_admin.py",
            "core.py",
            "aio.py",
            "ops.py",
            "builders.py",
        ),
    ),
    "model": ("objq_broker/model", None),
    "model/ops": ("objq_broker/model/ops", None),
    "broker": ("objq_broker/broker", None),
}
_OWNERS = ("self", "state")


def files_of(root: Path, folder: str, names: tuple[str, ...] | None) -> list[Path]:
    if names is None:
        return sorted((root / folder).glob("*.py"))
    return [root / folder / name for name in names if (root / folder / name).exists()]


def assigned(cls: ast.ClassDef) -> set[str]:
    """The attributes the methods of ``cls`` assign."""
    names: set[str] = set()
    for node in ast.walk(cls):
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        else:
            continue
        while targets:
            target = targets.pop()
            if isinstance(target, ast.Tuple | ast.List):
                targets.extend(target.elts)
            elif (
                isinstance(target, ast.Attribute)
                and isinstance(target.value, ast.Name)
                and target.value.id in _OWNERS
            ):
                names.add(target.attr)
    return names


def _base_name(base: ast.expr) -> str | None:
    """``Op`` of ``Op``, ``ops.Op`` or ``Op[T]``."""
    if isinstance(base, ast.Subscript):
        base = base.value
    if isinstance(base, ast.Name):
        return base.id
    return base.attr if isinstance(base, ast.Attribute) else None


def measure(files: list[Path]) -> tuple[int, int, int, set[str]]:
    """Lines, classes, the longest chain, and the attributes with more than one owner."""
    lines = 0
    bases: dict[str, list[str]] = {}
    sets: dict[str, set[str]] = {}
    for path in files:
        source = path.read_text()
        lines += len(source.splitlines())
        for cls in (n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef)):
            bases[cls.name] = [name for b in cls.bases if (name := _base_name(b))]
            sets[cls.name] = assigned(cls)

    def chain(name: str) -> list[str]:
        found = [name]
        for base in bases.get(name, []):
            if base in bases and base != name:
                found += chain(base)
        return found

    leaves = [c for c in bases if not any(c in listed for listed in bases.values())]
    shared: set[str] = set()
    longest = 0
    for leaf in leaves:
        members = chain(leaf)
        longest = max(longest, len(members))
        counts = Counter(a for member in members for a in sets[member])
        shared |= {a for a, n in counts.items() if n > 1}
    return lines, len(bases), longest, shared


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("-v", action="store_true", help="name the attributes")
    args = parser.parse_args()
    print("| component | files | lines | classes | longest chain | attributes with >1 owner |")
    print("|---|---:|---:|---:|---:|---:|")
    for component, (folder, names) in COMPONENTS.items():
        files = files_of(args.root, folder, names)
        lines, classes, longest, shared = measure(files)
        print(f"| {component} | {len(files)} | {lines:,} | {classes} | {longest} | {len(shared)} |")
        if args.v and shared:
            print(f"|   | {', '.join(sorted(shared))} | | | | |")


if __name__ == "__main__":
    main()

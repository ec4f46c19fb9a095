"""docs/architecture.md draws the layers contract of pyproject.toml: one row per layer, in order."""

from __future__ import annotations

import re
import tomllib

from tests.docs.test_examples import ROOT, blocks

ARCHITECTURE = ROOT / "docs" / "architecture.md"


def contract_layers() -> list[list[str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    [layers] = [
        contract["layers"]
        for contract in config["tool"]["importlinter"]["contracts"]
        if contract["type"] == "layers"
    ]
    return [[name.strip() for name in layer.split("|")] for layer in layers]


def diagram_layers() -> list[list[str]]:
    picture = next(block for block in blocks(ARCHITECTURE) if "▼" in block.text)
    rows = []
    for line in picture.text.splitlines():
        if not line.strip() or line.strip() == "▼":
            continue
        # The names come first, before the parts in parentheses and the description.
        names = re.split(r"\s{2,}|\(", line.strip())[0]
        rows.append([name.strip().rstrip("/") for name in names.split("│")])
    return rows


def test_the_architecture_diagram_has_one_row_per_layer_of_the_contract() -> None:
    assert diagram_layers() == contract_layers()

"""Data flows forward only: traces/ -> solvers/ -> placer/. No stage imports a later one."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LATER = {"traces": {"solvers", "placer"}, "solvers": {"placer"}}


def imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("stage", sorted(LATER))
def test_no_stage_imports_a_later_one(stage: str) -> None:
    files = sorted((REPO / stage).rglob("*.py"))
    assert files
    offenders = {str(p.relative_to(REPO)): sorted(imported_packages(p) & LATER[stage])
                 for p in files if imported_packages(p) & LATER[stage]}
    assert not offenders, offenders

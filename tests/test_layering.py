"""Data flows forward only: traces/ -> solvers/ -> placer/. No stage imports a later one."""

from __future__ import annotations

import ast
import subprocess
import sys
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


def imports_of(path: Path) -> set[str]:
    """Every absolute module name `path` imports (`from a.b import c` gives a.b)."""
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_offline_stages_do_not_import_the_runtime() -> None:
    """Within placer/, the runtime (a serving host's loader) comes last: inventory, plan,
    emit, verify and evaluate never import it; only it and the CLI layer do."""
    allowed = {REPO / "placer" / "runtime", REPO / "placer" / "commands"}
    offenders = {str(p.relative_to(REPO)) for p in sorted((REPO / "placer").rglob("*.py"))
                 if not any(a in p.parents for a in allowed)
                 and p.name != "cli.py"
                 and any(m == "placer.runtime" or m.startswith("placer.runtime.")
                         for m in imports_of(p))}
    assert not offenders, offenders


def test_the_cli_starts_without_torch() -> None:
    """torch and transformers take seconds to import: only collecting (and the runtime) may
    load them, not every `placer` command (`placer --help` went from 5.4 s to 1.2 s)."""
    code = ("import sys, placer.cli; "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"

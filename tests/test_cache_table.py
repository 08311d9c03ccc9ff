"""One table of cache policies (solvers/cache_table.py, issue #51 item 6): the classes that run
them, the kernel's victim rules, the options check, the plan check and its schema, the
candidates `--cache-policy auto` judges and `placer solve --help` all come from its rows."""

from __future__ import annotations

import pytest

import solvers.cache_table as table
from placer.errors import PlacerError
from placer.plan.check import plan_schema
from placer.plan.options import SolveOptions, check_options
from solvers.cache import POLICIES
from solvers.cache.choice import CHOICES
from solvers.cache_table import (
    AUTO_POLICIES,
    POLICY_NAMES,
    POLICY_TABLE,
    PolicyRow,
    cache_policy_help,
    policy_row,
)


def solve_help() -> str:
    """The help of `placer solve --cache-policy` as the CLI built it."""
    from typer.main import get_command

    from placer.cli import app

    (option,) = [p for p in get_command(app).commands["solve"].params
                 if p.name == "cache_policy"]
    return option.help


def test_the_policy_names_candidates_and_help_come_from_the_one_table():
    names = tuple(row.name for row in POLICY_TABLE)
    assert names == POLICY_NAMES == ("lru", "lfru", "lfuda", "classlru", "learned")
    # the classes: one per row, in its order, each running its row's victim rule
    assert tuple(POLICIES) == names
    assert [(POLICIES[n].name, POLICIES[n].score) for n in names] == [
        (row.name, row.score) for row in POLICY_TABLE]
    assert len({row.score for row in POLICY_TABLE}) == len(POLICY_TABLE)
    # the choice's candidates: the rows auto tries, in the table's order
    assert CHOICES == AUTO_POLICIES == tuple(row.name for row in POLICY_TABLE if row.auto)
    # the options check takes each row and auto, and names the rows when it refuses
    for name in (*names, "auto"):
        check_options(SolveOptions(offload=0.5, cache_policy=name))
    with pytest.raises(PlacerError, match=f"auto or one of {', '.join(names)}, not 'fifo'"):
        check_options(SolveOptions(offload=0.5, cache_policy="fifo"))
    # --help: every name in the table's order, and each row's own line
    text = solve_help()
    assert text == cache_policy_help()
    assert f"auto | {' | '.join(names)}." in text
    for row in POLICY_TABLE:
        assert f"{row.name}: {row.help}" in text
    # the plan's schema lists the same names
    card = plan_schema()["$defs"]["card"]["properties"]["cache_policy"]
    assert card["enum"] == [*names, None]


def test_the_help_is_built_from_the_rows_it_is_given(monkeypatch):
    """A row added to the table shows in the help, in its place (the help reads the rows)."""
    extra = PolicyRow("fifo", 9, "first in, first out", auto=False)
    monkeypatch.setattr(table, "POLICY_TABLE", (*POLICY_TABLE, extra))
    text = cache_policy_help()
    assert text.endswith("; fifo: first in, first out.")
    assert f"auto | {' | '.join(POLICY_NAMES)} | fifo." in text


def test_a_row_is_found_by_name_and_an_unknown_name_names_the_rows():
    assert policy_row("learned").fitted and not policy_row("lfru").fitted
    assert [row.name for row in POLICY_TABLE if row.fitted] == ["learned"]
    with pytest.raises(ValueError, match="unknown cache policy 'fifo'; choose from lru, "):
        policy_row("fifo")


def test_the_cli_help_reads_the_table_without_the_compiled_caches():
    """solvers/cache_table.py imports nothing heavy (`placer solve --help` reads it)."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys\nimport solvers.cache_table\nimport placer.plan.options\n"
            "print(sorted(m for m in ('numpy', 'numba', 'solvers.cache') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parent.parent)
    assert out.stdout.strip() == "[]"

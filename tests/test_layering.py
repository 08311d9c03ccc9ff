"""Data flows forward only: traces/ -> solvers/ -> placer/, and within placer/ from room to
room (checkpoint -> hardware -> plan -> placed, predict, exporters -> runtime -> serve ->
report -> commands -> cli). No stage imports a later one, no room a later one, and no module imports
itself back through others."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("traces", "solvers", "placer")
LATER = {"traces": {"solvers", "placer"}, "solvers": {"placer"}}
# Each room of placer/ may import only rooms of a lower rank (and the basics, rank 0).
ROOMS = {"errors": 0, "units": 0, "files": 0, "progress": 0,
         "checkpoint": 1, "hardware": 1.5,  # probe --step times a checkpoint's decode step
         "plan": 2,
         "placed": 3, "predict": 3, "exporters": 3,
         "runtime": 4,
         "serve": 5,
         "report": 5.25,  # what the commands print: tables, figures and summaries
         "pipeline": 5.5,
         "commands": 6,
         "cli": 7, "__main__": 8}
BASICS = {room for room, rank in ROOMS.items() if rank == 0}
MAX_TOP_LEVEL = 8  # modules directly in placer/ besides __init__, __main__ and cli
MAX_LINES = 500


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """Every module of `known` that `path` imports, at any depth of the file (imports inside
    functions count: a cycle through a deferred import is still a cycle). `from a import b`
    names module a.b where that is a module, else a."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = {f"{node.module}.{a.name}" for a in node.names} & known
            names |= subs or {node.module}
    return {n for n in names if n in known}


def sources() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))}


def import_graph() -> dict[str, set[str]]:
    mods = sources()
    return {name: imported_modules(path, set(mods)) - {name} for name, path in mods.items()}


def room_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "placer" and len(parts) > 1 else None


@pytest.mark.parametrize("stage", sorted(LATER))
def test_no_stage_imports_a_later_one(stage: str) -> None:
    graph = import_graph()
    offenders = {m: sorted(d for d in deps if d.split(".")[0] in LATER[stage])
                 for m, deps in graph.items()
                 if m.split(".")[0] == stage and any(d.split(".")[0] in LATER[stage]
                                                     for d in deps)}
    assert not offenders, offenders


def test_every_room_is_ranked() -> None:
    rooms = {room_of(m) for m in sources()} - {None}
    assert rooms <= set(ROOMS), sorted(rooms - set(ROOMS))


def test_no_room_imports_a_later_or_sibling_room() -> None:
    """A room imports itself, the basics and rooms of a lower rank only: checkpoint/ imports
    nothing of hardware/ or after, hardware/ nothing of plan/ or after; the offline rooms never
    import the runtime."""
    offenders = []
    for module, deps in import_graph().items():
        room = room_of(module)
        if room is None:
            continue
        for dep in deps:
            other = room_of(dep)
            if other is None or other == room:
                continue
            if not (ROOMS[other] < ROOMS[room] or (room in BASICS and other in BASICS)):
                offenders.append(f"{module} ({room}) imports {dep} ({other})")
    assert not offenders, offenders


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle() -> None:
    assert not cycles(import_graph())


def test_the_cycle_check_finds_a_cycle() -> None:
    """The check itself can fail: a two-module cycle and a three-module one are found."""
    graph = {"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"e"}, "e": {"c"}, "f": {"a"}}
    assert sorted(cycles(graph)) == [["a", "b"], ["c", "d", "e"]]


def test_rooms_keep_placer_shallow_and_modules_small() -> None:
    top = {p.stem for p in (REPO / "placer").glob("*.py")} - {"__init__", "__main__", "cli"}
    assert len(top) <= MAX_TOP_LEVEL, sorted(top)
    long = {str(p.relative_to(REPO)): n for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, long


def test_ggml_block_sizes_are_read_in_one_place() -> None:
    """gguf's GGML_QUANT_SIZES: by type name in traces/formats/ggml.py (the table of the checkpoint
    estimate's and the hardware timings' ggml types), by type in the GGUF reader; nowhere
    else, so that the two rooms cannot drift apart."""
    readers = {name for name, path in sources().items()
               for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, ast.ImportFrom)
               and any(a.name == "GGML_QUANT_SIZES" for a in node.names)}
    assert readers == {"traces.formats.ggml", "traces.formats.gguf_header"}, sorted(readers)


# What no command may import before it runs (`placer --help`, `placer X --help`, `placer
# --version` load none of them; the command imports what it needs in its body): torch and
# transformers take seconds, pyarrow.dataset and pandas 0.5 s, numba 0.5 s, scipy and ortools
# a few tenths, numpy 0.14 s, gguf 28 ms (idle machine). Start-up stays under 0.4 s
# (benchmarks/bench_startup.py times it).
HEAVY = ("torch", "transformers", "numba", "gguf", "pyarrow", "pyarrow.dataset", "pandas",
         "scipy", "ortools", "numpy")


def test_the_cli_starts_without_heavy_packages() -> None:
    """`import placer.cli`, then the whole command tree built and every command's --help
    printed, as `placer ... --help` does: none of HEAVY is imported."""
    code = ("import sys\n"
            "import placer.cli\n"
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
            "from typer.main import get_command\n"
            "from typer.testing import CliRunner\n"
            "app = placer.cli.app\n"
            "def paths(cmd, path):\n"
            "    yield path\n"
            "    for name, sub in getattr(cmd, 'commands', {}).items():\n"
            "        yield from paths(sub, [*path, name])\n"
            "runner = CliRunner()\n"
            "for path in paths(get_command(app), []):\n"
            "    assert runner.invoke(app, [*path, '--help']).exit_code == 0, path\n"
            "assert runner.invoke(app, ['--version']).exit_code == 0\n"
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["[]", "[]"], out.stdout

"""Start-up: Ctrl-C at any moment of a command's start (while Python imports the command
line, while it parses or prints help) is one line on stderr and exit status 130, never a
KeyboardInterrupt traceback; the light modules the command line imports name the same
choices as the heavy modules they stand in for; a command's --help imports that command's
module alone, and the listing (placer.commands.index) says what the commands say. (No heavy
package at start-up: test_layering.py; how long it takes: benchmarks/bench_startup.py.)"""

from __future__ import annotations

import inspect
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from placer.commands.index import COMMANDS, GROUPS

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(REPO)}

# The child interrupts itself the moment Python starts importing module MODULE, then runs
# the console entry point as the `placer` script does.
INTERRUPTING = """
import os, signal, sys
class Interrupt:
    def find_spec(self, name, path=None, target=None):
        if name == {module!r}:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None
sys.meta_path.insert(0, Interrupt())
sys.argv = ["placer", *{argv!r}]
from placer.cli import main
main()
"""


def interrupted_at(module: str, argv: list[str]) -> subprocess.CompletedProcess:
    code = INTERRUPTING.format(module=module, argv=argv)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPO, env=ENV, timeout=120, preexec_fn=default_sigint)


def default_sigint() -> None:
    """In the child: SIGINT's default action, as a terminal gives it. A shell runs a
    background job (`make test &`) with SIGINT ignored, and Python then leaves it ignored:
    no Ctrl-C would reach the command."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("module", ["typer", "placer.commands.solve", "rich.table"])
def test_ctrl_c_while_importing_is_one_line_and_130(module: str) -> None:
    result = interrupted_at(module, ["solve", "--help"])
    assert result.returncode == 130, result.stderr
    assert result.stderr == "error: interrupted by SIGINT; nothing was done\n", result.stderr
    assert result.stdout == ""


def test_ctrl_c_while_printing_help_is_one_line_and_130() -> None:
    """typer imports its rich help formatter only when help is printed: an interrupt there
    comes inside the command line's own parsing."""
    result = interrupted_at("typer.rich_utils", ["solve", "--help"])
    assert result.returncode == 130, result.stderr
    assert result.stderr == "error: interrupted by SIGINT; nothing was done\n", result.stderr


# The child runs the console entry point as the `placer` script does, and says "started" as
# `main` begins to import the command line (Python's own start, site and all, the import of
# placer.cli, a module of two names, and the child's own lines before `main` are not
# placer's to handle: see placer/cli.py).
STARTED = """
import sys
class Started:
    def find_spec(self, name, path=None, target=None):
        if name == "placer.commands.app":
            sys.meta_path.remove(self)
            sys.stderr.write("started\\n")
            sys.stderr.flush()
        return None
sys.meta_path.insert(0, Started())
sys.argv = ["placer", *{argv!r}]
from placer.cli import main
main()
"""


@pytest.mark.parametrize("argv", [["solve", "--help"], ["hardware", "show", "1x-rtx4090"]])
def test_a_real_ctrl_c_at_any_early_moment_is_one_line(argv: list[str]) -> None:
    """A real Ctrl-C at a few moments after Python has started: the command finishes (0) or
    says so in one line (130), never a traceback. A help done in under 0.2 s may get the
    signal as Python exits, its handler gone: then SIGINT's default action ends it, silent
    (status -SIGINT)."""
    for delay in (0.0, 0.02, 0.05, 0.1, 0.2):
        proc = subprocess.Popen([sys.executable, "-c", STARTED.format(argv=argv)], cwd=REPO,
                                env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True, preexec_fn=default_sigint)
        assert proc.stderr.readline() == "started\n"
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
        assert proc.returncode in (0, 130, -signal.SIGINT), (delay, proc.returncode, stderr)
        if proc.returncode == -signal.SIGINT:
            assert stderr == "", (delay, stderr)
        if proc.returncode == 130:
            assert stderr == "error: interrupted by SIGINT; nothing was done\n", (delay, stderr)


def test_light_choice_tables_agree_with_their_sources() -> None:
    """The constants the command modules import at no cost are the heavy modules' own."""
    import solvers.cpu
    import traces.choices
    import traces.collecting.collect
    import traces.collecting.server
    from placer.hardware import spec
    from traces.importers import FORMATS

    assert traces.choices.FORMAT_NAMES == tuple(FORMATS)
    assert spec.OFFLOAD_MIN_BATCH == solvers.cpu.OFFLOAD_MIN_BATCH
    assert traces.collecting.collect.MODES is traces.choices.MODES
    assert traces.collecting.server.ENGINES is traces.choices.ENGINES


# The child runs the console entry point on ARGV, then says on stderr which command modules
# (placer.commands.NAME for each NAME of the index) it imported.
IMPORTED_COMMANDS = """
import json, sys
sys.argv = ["placer", *{argv!r}]
from placer.cli import main
from placer.commands.index import COMMANDS
try:
    main()
except SystemExit as exc:
    code = exc.code
sys.stderr.write(json.dumps([code, sorted(n for n in COMMANDS
                                          if f"placer.commands.{{n}}" in sys.modules)]))
"""


def imported_commands(argv: list[str]) -> list:
    result = subprocess.run([sys.executable, "-c", IMPORTED_COMMANDS.format(argv=argv)],
                            capture_output=True, text=True, cwd=REPO, env=ENV, timeout=120)
    code, names = json.loads(result.stderr.splitlines()[-1])
    return [code, names]


@pytest.mark.parametrize("path", [*([name] for name in COMMANDS),
                                  ["hardware", "new"], ["traces", "stats"],
                                  ["export", "llamacpp"]], ids=" ".join)
def test_a_command_s_help_imports_its_own_command_module_alone(path: list[str]) -> None:
    """`placer X --help` builds X alone: it imports placer.commands.X and no other command's
    module (each costs its imports and typer's reading of its options)."""
    assert imported_commands([*path, "--help"]) == [0, [path[0]]]


@pytest.mark.parametrize("argv", [["--help"], ["--version"], []], ids=" ".join)
def test_the_listing_and_the_version_import_no_command_module(argv: list[str]) -> None:
    """The top listing comes from placer.commands.index (bare `placer` prints it, exit 2)."""
    assert imported_commands(argv) == [2 if not argv else 0, []]


def test_the_index_says_what_the_commands_say() -> None:
    """placer.commands.index, which `placer --help` lists, holds each command's name (in the
    order typer lists them: commands, then groups) and the first paragraph of its help."""
    from typer.main import get_command

    from placer.cli import app

    built = get_command(app).commands
    found = {name: inspect.cleandoc(cmd.short_help or cmd.help or "").split("\n\n")[0].strip()
             for name, cmd in built.items()}
    assert list(COMMANDS) == list(found)
    stale = {name: text for name, text in found.items() if COMMANDS[name] != text}
    assert not stale, f"placer/commands/index.py: COMMANDS should read {stale!r}"
    assert GROUPS == {name for name, cmd in built.items() if hasattr(cmd, "commands")}


# The child runs the console entry point on ARGV (after importing typer.rich_utils plainly
# where PLAIN), then says on stderr which of the modules help need not load it loaded.
RENDERED = """
import json, sys
if {plain}:
    import typer.rich_utils
sys.argv = ["placer", *{argv!r}]
from placer.cli import main
try:
    main()
except SystemExit:
    pass
sys.stderr.write(json.dumps(sorted(m for m in {modules!r} if m in sys.modules)))
"""
NOT_FOR_HELP = ("rich.markdown", "rich.traceback", "markdown_it", "pygments")


@pytest.mark.parametrize("argv", [["--help"], ["solve", "--help"], ["hardware", "--help"]],
                         ids=" ".join)
def test_help_needs_no_markdown_or_traceback_renderer_and_reads_the_same(argv: list[str]
                                                                          ) -> None:
    """typer.rich_utils is imported with stand-ins for rich.markdown and rich.traceback
    (placer.commands.app.help_renderer): none of their packages is loaded, and the help
    printed is the same, byte for byte, as with typer.rich_utils imported plainly."""
    out = {}
    for plain in (False, True):
        code = RENDERED.format(plain=plain, argv=argv, modules=NOT_FOR_HELP)
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                cwd=REPO, env=ENV, timeout=120)
        out[plain] = (result.stdout, json.loads(result.stderr.splitlines()[-1]))
    assert out[False][1] == []
    assert out[True][1] != []  # the check sees them where typer.rich_utils loads them
    assert "Usage: " in out[False][0]
    assert out[False][0] == out[True][0]

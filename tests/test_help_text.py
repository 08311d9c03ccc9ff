"""Every command's --help keeps the bracketed words of its source help text: typer renders
help through rich markup, where "[host]" is a style tag and vanishes unless escaped."""

from __future__ import annotations

import re

from typer.main import get_command
from typer.testing import CliRunner

from placer.cli import app

BRACKETED = re.compile(r"\[[^\[\]]+\]")


def commands(command, path: list[str]):
    """(argv path, click command) of `command` and every command below it."""
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from commands(sub, [*path, name])


def flat(text: str) -> str:
    """Text without rich's panel borders, whitespace collapsed (help wraps lines)."""
    return " ".join(text.replace("│", " ").split())


def test_bracketed_help_words_survive_rendering():
    runner = CliRunner()
    checked = 0
    for path, command in commands(get_command(app), []):
        sources = [command.help or ""] + [getattr(p, "help", None) or "" for p in command.params]
        wanted = {w for text in sources for w in BRACKETED.findall(text.replace("\\[", "["))}
        if not wanted:
            continue
        result = runner.invoke(app, [*path, "--help"])
        assert result.exit_code == 0, result.output
        lost = sorted(w for w in wanted if flat(w) not in flat(result.output))
        assert not lost, f"placer {' '.join(path)} --help lost {lost}"
        checked += len(wanted)
    assert checked >= 2  # solve and evaluate name the spec's [host] table


def test_the_check_sees_markup_loss():
    """Unescaped, rich takes "[host]" for a tag: the check above would fail on it."""
    from rich.text import Text

    assert "[host]" not in Text.from_markup("the spec's [host] table").plain
    assert "[host]" in Text.from_markup("the spec's \\[host] table").plain

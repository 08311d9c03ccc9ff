"""The error contract, as tests check it: exit status 1 and one `error: ...` line."""

from __future__ import annotations


def assert_one_line_error(result, *needles: str, code: int = 1) -> None:
    """A CLI result that failed with exit `code` (1; 130 after Ctrl-C, 143 after SIGTERM) and
    printed one line, `error: ...`, holding every needle (stdout and stderr together: nothing
    else was printed)."""
    assert result.exit_code == code, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    for needle in needles:
        assert needle in lines[0], lines[0]

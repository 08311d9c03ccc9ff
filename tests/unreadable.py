"""Files that cannot be read, for tests that run as root (where chmod 000 changes nothing)."""

from __future__ import annotations

import builtins
import errno
import io
import os
from pathlib import Path

import pytest


def deny_reads(monkeypatch: pytest.MonkeyPatch, *paths: Path) -> None:
    """Opening any of `paths` (by open, io.open, Path.open or os.open) raises PermissionError
    naming it, as it does for a non-root user after `chmod 000`."""
    denied = {os.path.realpath(p) for p in paths}

    def guard(opener):
        def opened(file, *args, **kwargs):
            if isinstance(file, (str, bytes, os.PathLike)) and \
                    os.path.realpath(os.fsdecode(file)) in denied:
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fsdecode(file))
            return opener(file, *args, **kwargs)
        return opened

    monkeypatch.setattr(builtins, "open", guard(builtins.open))
    monkeypatch.setattr(io, "open", guard(io.open))
    monkeypatch.setattr(os, "open", guard(os.open))

"""What run, serve, bench and verify share about their PLACED argument (a module of its own,
so that none of those commands imports another command's module: see placer.commands.app)."""

from __future__ import annotations

from pathlib import Path

from placer.errors import PlacerError

MODEL_HELP = ("The checkpoint directory it was placed from (dense weights, tokenizer); default: "
              "the one the manifest records (source.dir).")


def check_placed(placed: Path) -> None:
    """What run, serve and bench refuse as PLACED."""
    if not placed.is_dir():
        raise PlacerError(f"{placed}: not a placed directory (`placer emit` writes one)")


def source_model(placed: Path, model: Path | None) -> Path:
    """--model, or the source checkpoint PLACED's manifest records; one line where that
    directory is gone."""
    if model is not None:
        return model
    from placer.placed.manifest import read_manifest

    recorded = Path(read_manifest(placed)["source"]["dir"])
    if not recorded.is_dir():
        raise PlacerError(f"{placed}: the source checkpoint its manifest records, {recorded}, "
                          "no longer exists: give --model")
    return recorded

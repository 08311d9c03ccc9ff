"""A tiny model run through collect, solve and emit: good inputs for every command, for the
tests that then feed them something hostile."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from typer.testing import CliRunner

from placer.checkpoint.tiny import build_tiny_model

BOX = Path(__file__).resolve().parent.parent / "examples" / "tiny-box.toml"


@dataclass(frozen=True)
class Pipeline:
    root: Path
    model: Path
    traces: Path
    plan: Path
    placed: Path


def invoke(*args: object):
    """`placer ARGS` in-process; the CliRunner result."""
    from placer.cli import app

    return CliRunner().invoke(app, [str(a) for a in args])


def build_pipeline(root: Path, texts: list[str]) -> Pipeline:
    """A tiny qwen3_moe in root/model, 64 random tokens collected (4 sequences), a greedy
    plan at half offload on the tiny box and its placed directory."""
    model = build_tiny_model("qwen3_moe", root / "model", texts=texts[:200])
    p = Pipeline(root, model, root / "traces", root / "plan.json", root / "placed")
    for args in (["collect", "--model", model, "--random-tokens", 64, "--max-length", 16,
                  "--out", p.traces, "--no-progress"],
                 ["solve", "--model", model, "--hardware", BOX, "--traces", p.traces,
                  "--offload", 0.5, "--solver", "greedy", "--steps", 16, "--out", p.plan],
                 ["emit", "--plan", p.plan, "--model", model, "--out", p.placed]):
        result = invoke(*args)
        assert result.exit_code == 0, result.output
    return p


def tree(path: Path) -> dict[str, bytes]:
    """Every file under `path` (links followed) by relative name, with its bytes."""
    return {str(f.relative_to(path)): f.read_bytes() for f in sorted(path.rglob("*"))
            if f.is_file()}


def write_sealed(manifest: dict, placed: Path) -> None:
    """Write `manifest` into placed/manifest.json sealed as emit seals it (a digest of its own
    bytes): a manifest that proves itself yet says something else, as a faulty or hostile
    emitter would write one, for the checks behind the digest."""
    from placer.plan.seal import manifest_text, seal_manifest

    seal_manifest(manifest)
    (Path(placed) / "manifest.json").write_text(manifest_text(manifest))

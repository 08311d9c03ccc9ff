"""The README's llama.cpp block runs as written on a tiny GGUF (llama.cpp's own converter of
a tiny qwen3_moe, tests/gguf_models.py), through llama.cpp itself (`make llama-env`'s side
environment), as tests/test_examples.py runs the quickstart: its very lines, `placer` the CLI
of this checkout, 24 prose blocks as chat.jsonl. Two lines are left out: `make llama-env` (the
side environment is there already) and `placer probe --host` (it prints a measured curve the
block does not use; the probe fixes own that line)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from placer.plan.placement import read_plan

REPO = Path(__file__).resolve().parent.parent
pytest_plugins = ["gguf_models"]


def llamacpp_block(readme: Path) -> list[str]:
    """The lines of the README's llama.cpp block (after its marker, inside the sh fence)."""
    text = readme.read_text()
    start = text.index("```sh\n", text.index("<!-- llama.cpp block")) + len("```sh\n")
    return text[start:text.index("```", start)].splitlines()


def test_readme_llamacpp_block_runs_as_written(gguf_pair, tmp_path, warm_placer):
    _, gguf = gguf_pair
    lines = llamacpp_block(REPO / "README.md")
    assert any("traces split" in x for x in lines)  # the held-out set the block evaluates on
    (tmp_path / "model.gguf").symlink_to(gguf)
    # {"text": ...} lines (the tiny GGUF has no chat template llama.cpp knows)
    prose = (REPO / "examples" / "data" / "shakespeare_head.txt").read_text().split("\n\n")
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps({"text": p[:300]}) + "\n"
                                                 for p in prose[:24]))
    kept = [x for x in lines if not x.startswith(("make ", "placer probe"))]
    script = "\n".join(["set -euo pipefail",
                        f'placer() {{ {warm_placer} "$@"; }}', *kept])
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True,
                          timeout=900, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    plan = read_plan(tmp_path / "plan.json")
    assert plan.engine["llamacpp_build"]["given"] == "b12191"
    assert any((tmp_path / "traces/calib").iterdir())
    assert any((tmp_path / "traces/heldout").iterdir())
    assert "replayed as llama.cpp b12191" in done.stdout        # evaluate on the held-out set
    command = done.stdout.strip().splitlines()[-1]
    assert command.startswith("llama-server -m model.gguf -ngl all")
    assert command.endswith(" -c 8192")  # the context `hardware new --ctx` reserved KV for

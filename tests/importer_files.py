"""What the importer tests share: a tiny model config, the rows of a trace, the error check."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

SHARED_DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data"

# A DeepSeek-V2-style model: 4 decoder layers, layer 0 dense, MoE layers 1..3 of 8 experts,
# top-2. Only what placer.checkpoint.inventory.estimate_inventory reads.
NUM_LAYERS, MOE_LAYERS, EXPERTS, TOP_K = 4, (1, 2, 3), 8, 2
CONFIG = {"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
          "num_hidden_layers": NUM_LAYERS, "first_k_dense_replace": 1, "moe_layer_freq": 1,
          "n_routed_experts": EXPERTS, "num_experts_per_tok": TOP_K, "n_shared_experts": 1,
          "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32,
          "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 256,
          "tie_word_embeddings": False}


def write_config(directory: Path) -> Path:
    """The tiny model's config.json in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "config.json"
    path.write_text(json.dumps(CONFIG))
    return path


def random_routing(rng: np.random.Generator, tokens: int, layers: int = len(MOE_LAYERS),
                   experts: int = EXPERTS, k: int = TOP_K) -> np.ndarray:
    """[tokens, layers, k] int32: k distinct experts per token and layer."""
    keys = rng.random((tokens, layers, experts))
    return np.argsort(keys, axis=2)[:, :, :k].astype(np.int32)


def trace_rows(trace_dir: Path) -> dict[str, np.ndarray]:
    """Every row of the traces in `trace_dir`, sorted by (seq_id, pos, layer)."""
    table = pq.read_table(sorted(trace_dir.rglob("*.parquet")))
    cols = {name: table.column(name).to_numpy() for name in ("seq_id", "pos", "token", "layer")}
    cols["phase"] = np.array(table.column("phase").to_pylist())
    cols["experts"] = np.array(table.column("experts").to_pylist())
    cols["weights"] = table.column("weights").to_pylist()
    order = np.lexsort((cols["layer"], cols["pos"], cols["seq_id"]))
    return {name: (np.array(col, dtype=object)[order] if name == "weights" else col[order])
            for name, col in cols.items()}


def sequences(rows: dict[str, np.ndarray]) -> np.ndarray:
    """[rows] sequence ordinal 0, 1, ... in seq_id order."""
    return np.unique(rows["seq_id"], return_inverse=True)[1]


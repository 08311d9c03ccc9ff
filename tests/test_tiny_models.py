"""The tiny checkpoints are ones llama.cpp converts and loads the way Hugging Face runs them.

Facts from llama.cpp 0c1e5709 (vendored in llama-cpp-python 0.3.36): `conversion/base.py`
`TextModel.set_gguf_parameters` writes `expert_gating_func` from the first of
`score_function, scoring_func, score_func, ...` in config.json and writes nothing without
one, and `src/models/deepseek2.cpp` then gates with softmax, where Hugging Face's DeepseekV3
gates with sigmoid; `src/models/olmoe.cpp` creates `attn_k_norm` with shape {n_embd}, where
Hugging Face's OlmoE k_norm spans num_key_value_heads x head_dim; the llama graph (Mixtral)
needs n_rot == head_dim. Checked on the written files (config.json, safetensors headers)."""

from __future__ import annotations

import json

from safetensors import safe_open

GATING_KEYS = ("score_function", "scoring_func", "score_func", "moe_router_activation",
               "moe_router_activation_func", "expert_selection_fn")


def config_of(path) -> dict:
    return json.loads((path / "config.json").read_text())


def shapes(path) -> dict[str, list[int]]:
    out = {}
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(file, "np") as f:
            out.update({name: list(f.get_slice(name).get_shape()) for name in f.keys()})
    return out


def test_deepseek_v3_gates_with_sigmoid_in_config(tiny_models):
    config = config_of(tiny_models["deepseek_v3"])
    gating = next(config[k] for k in GATING_KEYS if k in config)
    assert gating == "sigmoid" and config["topk_method"] == "noaux_tc"


def test_olmoe_k_norm_is_as_wide_as_the_hidden_state(tiny_models):
    config = config_of(tiny_models["olmoe"])
    assert config["num_key_value_heads"] == config["num_attention_heads"]
    norms = {n: s for n, s in shapes(tiny_models["olmoe"]).items()
             if n.endswith(("self_attn.k_norm.weight", "self_attn.q_norm.weight"))}
    assert len(norms) == 2 * config["num_hidden_layers"]
    assert all(s == [config["hidden_size"]] for s in norms.values()), norms


def test_mixtral_rope_spans_the_head(tiny_models):
    config = config_of(tiny_models["mixtral"])
    assert config["head_dim"] == config["hidden_size"] // config["num_attention_heads"]

"""Tiny, real Hugging Face MoE checkpoints built offline, for the demo, tests and benchmarks.

A tiny model is made from a transformers config (`AutoConfig.for_model`), initialised with a
fixed seed and written with `save_pretrained`, so its on-disk layout is exactly what the real
architecture writes: per-expert tensors for qwen3_moe, olmoe, deepseek_v3 and mixtral, fused
3D expert tensors for gpt_oss. It gets a real BPE tokenizer trained locally on the given text
with the `tokenizers` library, and a chat template, so `placer collect` can run it on corpora.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

ARCHITECTURES = ("qwen3_moe", "mixtral", "olmoe", "deepseek_v3", "gpt_oss")

CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>"]


def _config_kwargs(arch: str, layers: int, experts: int, top_k: int, hidden: int,
                   vocab: int) -> dict:
    common = dict(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=512, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        tie_word_embeddings=False,
    )
    head_dim = hidden // 4
    per_arch = {
        "qwen3_moe": dict(moe_intermediate_size=hidden // 2, num_experts=experts,
                          num_experts_per_tok=top_k, decoder_sparse_step=1, mlp_only_layers=[],
                          head_dim=head_dim, norm_topk_prob=True),
        "mixtral": dict(num_local_experts=experts, num_experts_per_tok=top_k, head_dim=head_dim),
        # llama.cpp's olmoe graph (src/models/olmoe.cpp) makes attn_k_norm {n_embd} wide, HF's
        # k_norm is num_key_value_heads * head_dim: only equal head counts convert and load.
        "olmoe": dict(num_experts=experts, num_experts_per_tok=top_k, num_key_value_heads=4),
        "deepseek_v3": dict(moe_intermediate_size=hidden // 2, n_routed_experts=experts,
                            num_experts_per_tok=top_k, n_shared_experts=1,
                            first_k_dense_replace=1, n_group=2, topk_group=1,
                            kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8,
                            qk_nope_head_dim=8, v_head_dim=8, rope_scaling=None,
                            num_key_value_heads=4,  # MLA: one KV head per attention head
                            # HF's DeepseekV3 always gates with sigmoid; convert_hf_to_gguf.py
                            # reads scoring_func (llama.cpp falls back to softmax without it).
                            scoring_func="sigmoid", topk_method="noaux_tc"),
        "gpt_oss": dict(num_local_experts=experts, num_experts_per_tok=top_k, head_dim=head_dim,
                        sliding_window=16,
                        layer_types=["sliding_attention", "full_attention"] * (layers // 2)
                        + ["sliding_attention"] * (layers % 2)),
    }
    if arch not in per_arch:
        raise ValueError(f"unknown tiny architecture {arch!r}; choose from {ARCHITECTURES}")
    return {**common, **per_arch[arch]}


def train_tokenizer(texts: Iterable[str], out_dir: Path, vocab: int) -> None:
    """Train a byte-level BPE tokenizer on `texts` and save it (with a chat template)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>",
                                   eos_token="</s>", unk_token="<unk>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out_dir)


def build_tiny_model(arch: str, out_dir: Path, *, texts: Iterable[str],
                     layers: int = 3, experts: int = 8, top_k: int = 2, hidden: int = 32,
                     vocab: int = 512, seed: int = 0, dtype: str = "float32",
                     router_scale: float = 1.0, max_shard_size: str | None = None) -> Path:
    """Write a tiny `arch` checkpoint (config, safetensors, tokenizer) into `out_dir`.

    `router_scale` multiplies the router weights: a larger scale makes routing more peaked
    (closer to what trained routers do) without changing the checkpoint's layout.
    `max_shard_size` (e.g. "20KB") writes a sharded checkpoint with an index file.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = AutoConfig.for_model(arch, **_config_kwargs(arch, layers, experts, top_k, hidden,
                                                      vocab))
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg).to(getattr(torch, dtype))
    if router_scale != 1.0:
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith(("mlp.gate.weight", "block_sparse_moe.gate.weight",
                                  "mlp.router.weight")):
                    param.mul_(router_scale)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(out_dir, **kwargs)
    train_tokenizer(texts, out_dir, vocab)
    (out_dir / "placer_tiny.json").write_text(json.dumps(
        {"arch": arch, "seed": seed, "router_scale": router_scale}) + "\n")
    return out_dir



def quantize_layout(src: Path, dst: Path, kind: str) -> Path:
    """Copy checkpoint `src` to `dst` with its routed experts stored in a quantized layout.

    `kind="fp8"`: per-expert weights as F8_E4M3 plus `weight_scale_inv` F32 block scales
    (DeepSeek-V3's layout); `kind="mxfp4"`: fused gpt-oss tensors as `*_blocks` / `*_scales`
    uint8 (the MXFP4 checkpoint layout). The bytes are a faithful cast of the originals but
    the result is for layout tests (inventory, emit, verify), not for running the model.
    """
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from placer.checkpoint.inventory import FUSED, PER_EXPERT

    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    for p in src.iterdir():
        if p.suffix != ".safetensors" and p.name != "model.safetensors.index.json":
            shutil.copy2(p, dst / p.name)
    tensors = {}
    for p in sorted(src.glob("*.safetensors")):
        tensors.update(load_file(p))
    out: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        if kind == "fp8" and PER_EXPERT.search(name) and name.endswith(".weight"):
            out[name] = t.to(torch.float8_e4m3fn)
            rows, cols = t.shape
            out[name + "_scale_inv"] = torch.rand(-(-rows // 128), -(-cols // 128))
        elif kind == "mxfp4" and FUSED.search(name) and not name.endswith("_bias"):
            experts, rows, cols = t.shape
            blocks = -(-rows // 32)
            raw = t.contiguous().view(torch.uint8).flatten()
            need = experts * cols * blocks * 16
            out[name + "_blocks"] = raw.repeat(-(-need // raw.numel()))[:need].view(
                experts, cols, blocks, 16).clone()
            out[name + "_scales"] = torch.randint(0, 255, (experts, cols, blocks),
                                                  dtype=torch.uint8)
        else:
            out[name] = t
    save_file(out, dst / "model.safetensors", metadata={"format": "pt"})
    return dst

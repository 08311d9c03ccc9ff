"""Runs a GGUF in llama.cpp itself and streams what its MoE routers select (stdlib + ctypes).

This file runs as a script under the side environment's Python (`make llama-env`:
`.venv-llama`, Python 3.12, the `cyllama-vulkan` wheel, whose `cyllama_vulkan.libs/` holds
llama.cpp b11669's shared libraries). It imports nothing from placer: placer (Python 3.11)
starts it as a subprocess (`traces.llamacpp.runner`): requests are JSON lines on its stdin,
replies are frames on a pipe of their own (`frames.py`, channel.py), which llama.cpp's prints and an
abort's gdb backtrace on stdout cannot reach.

How the selection is observed (llama.cpp b11669; sources read at ggml-org/llama.cpp
434f71a5 `src/llama-graph.cpp` and 4b060f27 `src/llama-moe-cache.cpp`):

- `build_moe_ffn` names the expert selection of layer `il` `ffn_moe_topk-<il>` (`cb(...)`
  formats `name-il`): I32 [n_expert_used, n_tokens], the ids in descending router score,
  possibly a strided view of the argsort. The context's eval callback (`cb_eval` in
  `llama_context_params`, a `ggml_backend_sched_eval_callback`) is asked, for every graph
  node, whether it wants the node (`ask`), then called again with the computed data; the
  worker asks for the `ffn_moe_topk-*` nodes and reads them with `ggml_backend_tensor_get`.
- The expert cache (`llama_context_params.moe_cache_size`, bytes: `--moe-cache-mib` x 2^20)
  looks up the slots of the selected experts with a GET_ROWS whose first source is the
  device copy of `moe_cache.slot_map-<il>`: after `llama_moe_cache::copy` planned the fetch,
  every selected expert has a slot. A slot changes hands only when a fetch fills it with one
  of its selected experts, so each fetch's hits are exactly the selected experts whose slot
  last held that same (layer, expert) (`slot_hits`); the totals the cache logs when the
  context is freed (`llama_moe_cache: ubatch <= 8: hits = H, misses = M, ...`) check them.

Struct layouts are b11669's, as the cyllama-vulkan 0.7.0 wheel compiled them (read from its
`LlamaModelParams` / `LlamaContextParams` objects); `check_layout` refuses another build.

Protocol: argv[1] is a JSON object of options (`runner.EngineOptions`); the worker answers
{"ready": true, "n_vocab": V}, then one reply frame per stdin request line:
- {"op": "tokenize", "text": ..., "chat": [messages] | null} -> {"tokens": [...]}
- {"op": "run", "tokens": [...], "max_new_tokens": n} -> {"tokens": [...], "prompt": P,
  "generated": [...], "layers": [...], "experts": [[[e, ...] per layer] per token],
  "fetches": [...]}: the prompt is one llama_decode, then with max_new_tokens > 0 greedy
  decoding, each generated token but the last fed back one at a time, stopping before an
  end-of-generation token.
- {"op": "feed", "tokens": [...], "prompt": P} -> {"prefill_s": s, "decode_s": [s, ...],
  and with `record` the "layers", "experts" and "fetches" of "run"}: a fresh sequence whose
  first P tokens are one llama_decode with the last one an output (as llama-server decodes
  a prompt; the last layer then routes that token only: the others' ids there are -1),
  then each following token one llama_decode (teacher forced: the tokens are given, none
  sampled), each timed to `llama_synchronize`. With
  `record` false (option) the context has no eval callback at all: the scheduler then runs
  each graph split whole, as llama-server does, so the times are the engine's own.
- {"op": "close"} -> frees everything: {"alignment": the GPU buffer alignment, "log": the
  cache's log lines}.
Errors: an {"error": "..."} frame, exit 1.
"""

from __future__ import annotations

import ctypes
import glob
import json
import os
import re
import sys
import time
from ctypes import (
    CFUNCTYPE,
    POINTER,
    c_bool,
    c_char_p,
    c_float,
    c_int,
    c_int32,
    c_int64,
    c_size_t,
    c_uint32,
    c_void_p,
)

from frames import reply

MODEL_PARAMS_SIZE = 80  # sizeof(llama_model_params) at b11669 (cyllama's compiled object)
CONTEXT_PARAMS_SIZE = 160  # sizeof(llama_context_params) at b11669
TOPK = re.compile(r"ffn_moe_topk-(\d+)$")
SLOT_MAP = re.compile(r"moe_cache\.slot_map-(\d+)")


class ModelParams(ctypes.Structure):
    _fields_ = [("devices", c_void_p), ("tensor_buft_overrides", c_void_p),
                ("n_gpu_layers", c_int32), ("split_mode", c_int32),
                ("load_mode", c_int32), ("lazy_mode", c_int32), ("main_gpu", c_int32),
                ("_pad0", c_int32), ("tensor_split", c_void_p), ("progress_callback", c_void_p),
                ("progress_callback_user_data", c_void_p), ("kv_overrides", c_void_p),
                ("flags", ctypes.c_uint8 * 8)]


EVAL_CB = CFUNCTYPE(c_bool, c_void_p, c_bool, c_void_p)
LOG_CB = CFUNCTYPE(None, c_int, c_char_p, c_void_p)


class ContextParams(ctypes.Structure):
    _fields_ = [("n_ctx", c_uint32), ("n_batch", c_uint32), ("n_ubatch", c_uint32),
                ("n_seq_max", c_uint32), ("n_rs_seq", c_uint32), ("n_outputs_max", c_uint32),
                ("n_outputs_max_per_seq", c_uint32), ("n_threads", c_int32),
                ("n_threads_batch", c_int32), ("ctx_type", c_int32),
                ("rope_scaling_type", c_int32), ("pooling_type", c_int32),
                ("attention_type", c_int32), ("flash_attn_type", c_int32),
                ("rope_freq_base", c_float), ("rope_freq_scale", c_float),
                ("yarn_ext_factor", c_float), ("yarn_attn_factor", c_float),
                ("yarn_beta_fast", c_float), ("yarn_beta_slow", c_float),
                ("yarn_orig_ctx", c_uint32), ("defrag_thold", c_float),
                ("cb_eval", EVAL_CB), ("cb_eval_user_data", c_void_p),
                ("type_k", c_int32), ("type_v", c_int32), ("moe_cache_size", c_size_t),
                ("abort_callback", c_void_p), ("abort_callback_data", c_void_p),
                ("flags", ctypes.c_uint8 * 8), ("samplers", c_void_p), ("n_samplers", c_size_t)]


class BufOverride(ctypes.Structure):
    _fields_ = [("pattern", c_char_p), ("buft", c_void_p)]


class Batch(ctypes.Structure):
    _fields_ = [("n_tokens", c_int32), ("token", POINTER(c_int32)), ("embd", c_void_p),
                ("pos", c_void_p), ("n_seq_id", c_void_p), ("seq_id", c_void_p),
                ("logits", c_void_p)]


class TensorHead(ctypes.Structure):
    """The stable head of `struct ggml_tensor` (ggml/include/ggml.h): type, buffer, ne, nb,
    op; the name is read with ggml_get_name, the sources with `src` below."""
    _fields_ = [("type", c_int32), ("buffer", c_void_p), ("ne", c_int64 * 4),
                ("nb", c_size_t * 4), ("op", c_int32), ("op_params", c_int32 * 16),
                ("flags", c_int32), ("src", c_void_p * 10)]


def fail(message: str) -> None:
    reply({"error": message})
    sys.exit(1)


def libraries() -> dict[str, ctypes.CDLL]:
    """llama.cpp's libraries from the cyllama-vulkan wheel next to this interpreter."""
    import site

    for root in site.getsitepackages():
        found = {}
        for key, pattern in (("base", "libggml-base-*.so*"), ("ggml", "libggml-[0-9a-f]*.so*"),
                             ("cpu", "libggml-cpu-*.so*"), ("vulkan", "libggml-vulkan-*.so*"),
                             ("llama", "libllama-*.so*")):
            hits = sorted(glob.glob(os.path.join(root, "cyllama_vulkan.libs", pattern)))
            if hits:
                found[key] = hits[0]
        if len(found) == 5:
            paths = found.pop("vulkan")
            libs = {k: ctypes.CDLL(v, mode=ctypes.RTLD_GLOBAL) for k, v in found.items()}
            libs["paths"] = {"cpu": found["cpu"], "vulkan": paths}
            return libs
    fail("llama.cpp's libraries (cyllama_vulkan.libs) are not in this environment; "
         "run `make llama-env`")
    raise AssertionError


def declare(libs: dict[str, ctypes.CDLL]) -> None:
    L, B, C, G = libs["llama"], libs["base"], libs["cpu"], libs["ggml"]
    sigs = {
        (L, "llama_backend_init"): (None, []),
        (G, "ggml_backend_load"): (c_void_p, [c_char_p]),
        (L, "llama_log_set"): (None, [LOG_CB, c_void_p]),
        (B, "ggml_log_set"): (None, [LOG_CB, c_void_p]),
        (L, "llama_model_default_params"): (ModelParams, []),
        (L, "llama_context_default_params"): (ContextParams, []),
        (L, "llama_model_load_from_file"): (c_void_p, [c_char_p, ModelParams]),
        (L, "llama_init_from_model"): (c_void_p, [c_void_p, ContextParams]),
        (L, "llama_model_get_vocab"): (c_void_p, [c_void_p]),
        (L, "llama_model_chat_template"): (c_char_p, [c_void_p, c_char_p]),
        (L, "llama_vocab_is_eog"): (c_bool, [c_void_p, c_int32]),
        (L, "llama_vocab_n_tokens"): (c_int32, [c_void_p]),
        (L, "llama_tokenize"): (c_int32, [c_void_p, c_char_p, c_int32, POINTER(c_int32),
                                          c_int32, c_bool, c_bool]),
        (L, "llama_chat_apply_template"): (c_int32, [c_char_p, c_void_p, c_size_t, c_bool,
                                                     c_char_p, c_int32]),
        (L, "llama_decode"): (c_int32, [c_void_p, Batch]),
        (L, "llama_get_memory"): (c_void_p, [c_void_p]),
        (L, "llama_memory_clear"): (None, [c_void_p, c_bool]),
        (L, "llama_sampler_init_greedy"): (c_void_p, []),
        (L, "llama_sampler_sample"): (c_int32, [c_void_p, c_void_p, c_int32]),
        (L, "llama_sampler_free"): (None, [c_void_p]),
        (L, "llama_free"): (None, [c_void_p]),
        (L, "llama_synchronize"): (None, [c_void_p]),
        (L, "llama_model_free"): (None, [c_void_p]),
        (B, "ggml_get_name"): (c_char_p, [c_void_p]),
        (B, "ggml_nbytes"): (c_size_t, [c_void_p]),
        (B, "ggml_op_name"): (c_char_p, [c_int]),
        (B, "ggml_backend_tensor_get"): (None, [c_void_p, c_void_p, c_size_t, c_size_t]),
        (C, "ggml_backend_cpu_buffer_type"): (c_void_p, []),
        (G, "ggml_backend_dev_count"): (c_size_t, []),
        (G, "ggml_backend_dev_get"): (c_void_p, [c_size_t]),
        (G, "ggml_backend_dev_type"): (c_int, [c_void_p]),
        (G, "ggml_backend_dev_buffer_type"): (c_void_p, [c_void_p]),
        (B, "ggml_backend_buft_get_alignment"): (c_size_t, [c_void_p]),
    }
    for (lib, name), (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args


def check_layout(libs) -> None:
    """Refuse a llama.cpp whose parameter structs are not b11669's (their defaults differ)."""
    m = libs["llama"].llama_model_default_params()
    c = libs["llama"].llama_context_default_params()
    assert ctypes.sizeof(m) == MODEL_PARAMS_SIZE and ctypes.sizeof(c) == CONTEXT_PARAMS_SIZE
    if (m.n_gpu_layers, c.n_ctx, c.n_batch, c.n_ubatch, c.type_k, c.type_v) != (
            -1, 512, 2048, 512, 1, 1) or c.moe_cache_size != 0:
        fail("this llama.cpp's parameter structs are not b11669's; run `make llama-env`")


def read_i32(base, t: int) -> list[list[int]]:
    """The I32 tensor at `t` as rows [ne1][ne0] (any row stride)."""
    head = TensorHead.from_address(t)
    ne0, ne1, nb1 = head.ne[0], head.ne[1], head.nb[1]
    rows = []
    buf = (c_int32 * ne0)()
    for r in range(ne1):
        base.ggml_backend_tensor_get(t, buf, r * nb1, ne0 * 4)
        rows.append(list(buf))
    return rows


class Runner:
    def __init__(self, opts: dict) -> None:
        self.libs = libraries()
        declare(self.libs)
        check_layout(self.libs)
        self.log: list[str] = []
        self._log_cb = LOG_CB(self._on_log)
        L = self.libs["llama"]
        L.llama_log_set(self._log_cb, None)
        self.libs["base"].ggml_log_set(self._log_cb, None)
        L.llama_backend_init()
        self.gpu = int(opts.get("n_gpu_layers", 0)) != 0 or bool(opts.get("moe_cache_bytes"))
        for key in ("cpu", "vulkan") if self.gpu else ("cpu",):
            if not self.libs["ggml"].ggml_backend_load(self.libs["paths"][key].encode()):
                fail(f"ggml cannot load its {key} backend: " + self._last_error())
        self.get_rows = next(i for i in range(200)
                             if self.libs["base"].ggml_op_name(i) == b"GET_ROWS")
        mp = L.llama_model_default_params()
        mp.n_gpu_layers = int(opts.get("n_gpu_layers", 0))
        self._overrides = None
        pattern = host_pattern(opts)
        if pattern is not None:
            buft = self.libs["cpu"].ggml_backend_cpu_buffer_type()
            self._overrides = (BufOverride * 2)(BufOverride(pattern, buft), BufOverride())
            mp.tensor_buft_overrides = ctypes.cast(self._overrides, c_void_p)
        self._split = None
        if opts.get("tensor_split"):
            self._split = (c_float * 128)(*[float(x) for x in opts["tensor_split"]])
            mp.tensor_split = ctypes.cast(self._split, c_void_p)
        self.model = L.llama_model_load_from_file(opts["gguf"].encode(), mp)
        if not self.model:
            fail(f"llama.cpp cannot load {opts['gguf']}: " + self._last_error())
        cp = L.llama_context_default_params()
        cp.n_ctx = int(opts.get("n_ctx", 4096))
        cp.n_batch = cp.n_ubatch = int(opts.get("n_batch", 512))
        cp.n_threads = cp.n_threads_batch = int(opts.get("threads", os.cpu_count() or 1))
        cp.moe_cache_size = int(opts.get("moe_cache_bytes", 0))
        self.record = bool(opts.get("record", True))
        self._eval_cb = EVAL_CB(self._on_eval)
        if self.record:
            cp.cb_eval = self._eval_cb
        self.ctx = L.llama_init_from_model(self.model, cp)
        if not self.ctx:
            fail("llama.cpp cannot create a context: " + self._last_error())
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_expert_used = int(opts.get("n_expert_used", 1))
        self.sampler = L.llama_sampler_init_greedy()
        self.topk: dict[int, list[list[int]]] = {}
        self.fetches: list[dict] = []
        self.slot_keys: dict[int, tuple[int, int]] = {}
        self.slot_map_ids: dict[int, int] = {}

    def _on_log(self, level: int, text: bytes, _user) -> None:
        self.log.append(text.decode(errors="replace"))

    def _last_error(self) -> str:
        lines = [x.strip() for x in self.log if x.strip()]
        return lines[-1] if lines else "no message"

    def _lookup_layer(self, t: int) -> int | None:
        """The layer of a GET_ROWS that reads a MoE cache slot map, else None."""
        head = TensorHead.from_address(t)
        if head.op != self.get_rows or not head.src[0]:
            return None
        src = head.src[0]
        # the scheduler's device copy of the slot map: "<backend>#moe_cache.slot_map-<il>#<n>"
        match = SLOT_MAP.search(self.libs["base"].ggml_get_name(src).decode(errors="replace"))
        return int(match.group(1)) if match else None

    def _on_eval(self, t, ask, _user) -> bool:
        topk = TOPK.match(self.libs["base"].ggml_get_name(t).decode(errors="replace"))
        layer = self._lookup_layer(t)
        if ask:
            return topk is not None or layer is not None
        if topk is not None:
            self.topk.setdefault(int(topk.group(1)), []).extend(read_i32(self.libs["base"], t))
        elif layer is not None:
            self._on_fetch(layer, t)
        return True

    def _on_fetch(self, layer: int, lookup: int) -> None:
        """Record one cache fetch of `layer`: its distinct selected experts (ascending), the
        slot each got, and which were hits (their slot last held this same layer's expert).
        The lookup is GET_ROWS(slot map, selected ids): both [n_tokens][n_expert_used]."""
        base = self.libs["base"]
        ids = [e for row in read_i32(base, TensorHead.from_address(lookup).src[1]) for e in row]
        slots = [s for row in read_i32(base, lookup) for s in row]
        slot_of = dict(zip(ids, slots, strict=True))
        experts = sorted(slot_of)
        hits = [e for e in experts if self.slot_keys.get(slot_of[e]) == (layer, e)]
        for e in experts:
            self.slot_keys[slot_of[e]] = (layer, e)
        self.fetches.append({"layer": layer, "tokens": len(ids) // max(1, self.n_expert_used),
                             "experts": experts, "hits": hits,
                             "slots": [slot_of[e] for e in experts]})

    def tokenize(self, text: str, chat: list | None) -> list[int]:
        L = self.libs["llama"]
        special = chat is not None
        if chat is not None:
            text = self._template(chat)
        data = text.encode()
        n = len(data) + 8
        out = (c_int32 * n)()
        got = L.llama_tokenize(self.vocab, data, len(data), out, n, not special, True)
        if got < 0:
            fail(f"llama_tokenize needs {-got} tokens")
        return list(out[:got])

    def _template(self, messages: list) -> str:
        L = self.libs["llama"]
        tmpl = L.llama_model_chat_template(self.model, None)
        if not tmpl:
            return "\n".join(f"{m['role']}: {m['content']}" for m in messages)

        class Msg(ctypes.Structure):
            _fields_ = [("role", c_char_p), ("content", c_char_p)]

        arr = (Msg * len(messages))(*[Msg(m["role"].encode(), m["content"].encode())
                                      for m in messages])
        size = 4096 + sum(len(m["content"]) * 2 for m in messages)
        buf = ctypes.create_string_buffer(size)
        n = L.llama_chat_apply_template(tmpl, arr, len(messages), True, buf, size)
        if n < 0:
            fail("llama.cpp cannot render the GGUF's chat template (llama_chat_apply_template "
                 "knows its built-in templates only); give --tokenizer DIR to template the "
                 "messages with Hugging Face's")
        return buf.raw[:n].decode(errors="replace")

    def _decode(self, tokens: list[int], every_output: bool = True) -> None:
        """One llama_decode of `tokens` (next positions of sequence 0), every token an output
        (or only the last, as llama-server decodes a prompt): the last layer computes only
        the output tokens (`inp_out_ids`), so a prompt decoded for its last logits alone
        routes only its last token there."""
        arr = (c_int32 * len(tokens))(*tokens)
        flags = [1] * len(tokens) if every_output else [0] * (len(tokens) - 1) + [1]
        outputs = (ctypes.c_int8 * len(tokens))(*flags)
        batch = Batch(len(tokens), arr, None, None, None, None,
                      ctypes.cast(outputs, c_void_p))
        rc = self.libs["llama"].llama_decode(self.ctx, batch)
        if rc != 0:
            fail(f"llama_decode returned {rc}: " + self._last_error())

    def run(self, tokens: list[int], max_new_tokens: int) -> dict:
        L = self.libs["llama"]
        L.llama_memory_clear(L.llama_get_memory(self.ctx), True)
        self.topk, self.fetches = {}, []
        self._decode(tokens)
        fed = list(tokens)
        generated = []
        for step in range(max_new_tokens):
            nxt = L.llama_sampler_sample(self.sampler, self.ctx, -1)
            generated.append(nxt)
            if step == max_new_tokens - 1 or L.llama_vocab_is_eog(self.vocab, nxt):
                break
            self._decode([nxt])
            fed.append(nxt)
        layers = sorted(self.topk)
        rows = [self.topk[il] for il in layers]
        if any(len(r) != len(fed) for r in rows):
            fail(f"expected {len(fed)} selections per layer, got {[len(r) for r in rows]}")
        experts = [[rows[i][t] for i in range(len(layers))] for t in range(len(fed))]
        return {"tokens": fed, "prompt": len(tokens), "generated": generated,
                "layers": layers, "experts": experts, "fetches": self.fetches}

    def feed(self, tokens: list[int], prompt: int) -> dict:
        """A fresh sequence of given tokens: tokens[:prompt] in one llama_decode, then one
        token a decode; the seconds of each to llama_synchronize (see the protocol)."""
        L = self.libs["llama"]
        L.llama_memory_clear(L.llama_get_memory(self.ctx), True)
        self.topk, self.fetches = {}, []
        start = time.perf_counter()
        self._decode(tokens[:prompt], every_output=False)
        L.llama_synchronize(self.ctx)
        prefill = time.perf_counter() - start
        seconds = []
        for token in tokens[prompt:]:
            start = time.perf_counter()
            self._decode([token])
            L.llama_synchronize(self.ctx)
            seconds.append(time.perf_counter() - start)
        out = {"prefill_s": prefill, "decode_s": seconds}
        if self.record:
            layers = sorted(self.topk)
            # the last layer computes the output tokens only: the prompt's last, then each
            pad = [[-1] * self.n_expert_used] * (prompt - 1)
            rows = [self.topk[il] if len(self.topk[il]) == len(tokens) else
                    pad + self.topk[il] for il in layers]
            if any(len(r) != len(tokens) for r in rows):
                fail(f"expected {len(tokens)} selections per layer, got "
                     f"{[len(r) for r in rows]}")
            out.update(layers=layers, fetches=self.fetches,
                       experts=[[rows[i][t] for i in range(len(layers))]
                                for t in range(len(tokens))])
        return out

    def gpu_alignment(self) -> int | None:
        """The buffer alignment of the first GPU device (the cache pads its banks to it)."""
        G = self.libs["ggml"]
        for i in range(G.ggml_backend_dev_count()):
            dev = G.ggml_backend_dev_get(i)
            if G.ggml_backend_dev_type(dev) == 1:  # GGML_BACKEND_DEVICE_TYPE_GPU
                return int(self.libs["base"].ggml_backend_buft_get_alignment(
                    G.ggml_backend_dev_buffer_type(dev)))
        return None

    def close(self) -> dict:
        """Free the context (the cache logs its totals then) and the model; the log lines of
        the cache (its size, slots per group, hits and misses)."""
        L = self.libs["llama"]
        alignment = self.gpu_alignment()
        L.llama_sampler_free(self.sampler)
        L.llama_free(self.ctx)
        L.llama_model_free(self.model)
        start = next((i for i, x in enumerate(self.log) if "MoE cache size" in x), len(self.log))
        return {"alignment": alignment,
                "log": [x for x in self.log[start:] if "moe_cache" in x or " slots (" in x
                        or "MoE cache" in x]}


def host_pattern(opts: dict) -> bytes | None:
    """The tensor-override pattern that keeps expert tensors in host memory: every layer's
    (`host_experts`, `-ot exps=CPU`) or those of the decoder layers `host_layers` (the
    pattern `placer export llamacpp` prints for `-ot`); None: no override."""
    if opts.get("host_experts"):
        return b"_exps"
    layers = opts.get("host_layers")
    if not layers:
        return None
    return ("blk\\.(" + "|".join(str(int(i)) for i in layers)
            + ")\\.ffn_(up|down|gate|gate_up)_(ch|)exps").encode()


def main() -> None:
    runner = Runner(json.loads(sys.argv[1]))
    n_vocab = runner.libs["llama"].llama_vocab_n_tokens(runner.vocab)
    reply({"ready": True, "n_vocab": n_vocab})
    for line in sys.stdin:
        req = json.loads(line)
        if req["op"] == "tokenize":
            reply({"tokens": runner.tokenize(req.get("text") or "", req.get("chat"))})
        elif req["op"] == "run":
            reply(runner.run(req["tokens"], int(req.get("max_new_tokens", 0))))
        elif req["op"] == "feed":
            reply(runner.feed(req["tokens"], int(req["prompt"])))
        else:
            reply(runner.close())
            return


if __name__ == "__main__":
    main()

"""Timing one cold expert with llama.cpp's own CPU kernels (stdlib + ctypes, side environment).

Run as a script by `traces.llamacpp.runner.time_expert` with the side environment's Python
(see worker.py), argv[1] a JSON object: hidden, inter, type (a ggml type name, e.g. "Q4_K"),
tokens [n...], pool (experts), threads, rounds, min_calls, min_s, budget_s. It prints one JSON
frame {"seconds": [[t...] per token count]} (or {"error": ...}) on the reply channel
(frames.py).

A host layer of llama.cpp computes its selected experts with `ggml_mul_mat_id` on the CPU
backend (`build_moe_ffn`, `src/llama-graph.cpp` at ggml-org/llama.cpp 434f71a5): gate and up
[hidden, inter, n_expert] and down [inter, hidden, n_expert] in the GGUF's type, the tokens
in F32 (the kernel converts them to the weights' dot type). This builds that graph for one
expert of a pool over n tokens:

    g = mul_mat_id(gate, x, ids), u = mul_mat_id(up, x, ids)     x [hidden, 1, n] F32
    y = mul_mat_id(down, silu(g) * u, ids)                       ids [1, n] I32 = the expert

and times `ggml_backend_graph_compute` on a CPU backend of `threads` threads, each call on
the next expert of the pool (which holds more than 4 x the last-level cache, as placer's
torch probe does, so weights come from RAM). Every expert of the pool holds the same
quantized random weights (quantized once with `ggml_quantize_chunk`, then copied): the
kernels' time does not depend on the values, and quantizing gigabytes would take minutes.
Rounds time one call per token count, after one untimed call per count.
"""

from __future__ import annotations

import ctypes
import json
import random
import sys
import time
from array import array
from ctypes import POINTER, c_bool, c_char_p, c_float, c_int, c_int64, c_size_t, c_void_p

from frames import reply
from worker import fail, libraries

GGML_TYPE_F32, GGML_TYPE_I32 = 0, 26


class InitParams(ctypes.Structure):
    _fields_ = [("mem_size", c_size_t), ("mem_buffer", c_void_p), ("no_alloc", c_bool)]


def declare(libs) -> None:
    B, C = libs["base"], libs["cpu"]
    sigs = {
        (B, "ggml_init"): (c_void_p, [InitParams]),
        (B, "ggml_free"): (None, [c_void_p]),
        (B, "ggml_type_name"): (c_char_p, [c_int]),
        (B, "ggml_type_size"): (c_size_t, [c_int]),
        (B, "ggml_blck_size"): (c_int64, [c_int]),
        (B, "ggml_new_tensor_2d"): (c_void_p, [c_void_p, c_int, c_int64, c_int64]),
        (B, "ggml_new_tensor_3d"): (c_void_p, [c_void_p, c_int, c_int64, c_int64, c_int64]),
        (B, "ggml_mul_mat_id"): (c_void_p, [c_void_p, c_void_p, c_void_p, c_void_p]),
        (B, "ggml_silu"): (c_void_p, [c_void_p, c_void_p]),
        (B, "ggml_mul"): (c_void_p, [c_void_p, c_void_p, c_void_p]),
        (B, "ggml_new_graph"): (c_void_p, [c_void_p]),
        (B, "ggml_build_forward_expand"): (None, [c_void_p, c_void_p]),
        (B, "ggml_get_data"): (c_void_p, [c_void_p]),
        (B, "ggml_nbytes"): (c_size_t, [c_void_p]),
        (B, "ggml_quantize_chunk"): (c_size_t, [c_int, POINTER(c_float), c_void_p, c_int64,
                                                c_int64, c_int64, c_void_p]),
        (B, "ggml_backend_graph_compute"): (c_int, [c_void_p, c_void_p]),
        (B, "ggml_backend_free"): (None, [c_void_p]),
        (C, "ggml_backend_cpu_init"): (c_void_p, []),
        (C, "ggml_backend_cpu_set_n_threads"): (None, [c_void_p, c_int]),
    }
    for (lib, name), (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args


def type_of(base, name: str) -> int:
    """The ggml type called `name` (gguf spelling, case-insensitive: Q4_K is ggml's q4_K)."""
    for t in range(64):
        found = base.ggml_type_name(t)
        if found and found.decode().lower() == name.lower() and base.ggml_type_size(t) > 0:
            return t
    fail(f"ggml has no type {name!r}")
    raise AssertionError


def fill(base, tensor: int, kind: int, rows: int, cols: int, experts: int, seed: int) -> None:
    """Random N(0, 1/cols) weights of one [rows x cols] expert in `kind`, copied to all."""
    rng = random.Random(seed)
    src = array("f", (rng.gauss(0.0, cols ** -0.5) for _ in range(rows * cols)))
    one = base.ggml_nbytes(tensor) // experts
    data = base.ggml_get_data(tensor)
    ptr = (c_float * len(src)).from_buffer(src)
    if kind == GGML_TYPE_F32:
        ctypes.memmove(data, ptr, one)
    else:
        base.ggml_quantize_chunk(kind, ptr, data, 0, rows, cols, None)
    for e in range(1, experts):
        ctypes.memmove(data + e * one, data, one)


def main() -> None:
    opts = json.loads(sys.argv[1])
    libs = libraries()
    declare(libs)
    base = libs["base"]
    hidden, inter, pool, tokens = opts["hidden"], opts["inter"], opts["pool"], opts["tokens"]
    kind = type_of(base, opts["type"])
    block = base.ggml_blck_size(kind)
    if hidden % block or inter % block:
        fail(f"{opts['type']} packs {block} weights a block: hidden {hidden} and inter "
             f"{inter} must be multiples of it")
    weights = 3 * pool * hidden * inter // block * base.ggml_type_size(kind)
    acts = sum(tokens) * (4 * hidden + 16 * inter + 4) * 4 + (1 << 20)
    ctx = base.ggml_init(InitParams(weights + acts + 64 * 1024 * len(tokens) + (16 << 20),
                                    None, False))
    if not ctx:
        fail(f"ggml cannot allocate {weights >> 20} MiB for the expert pool")
    gate = base.ggml_new_tensor_3d(ctx, kind, hidden, inter, pool)
    up = base.ggml_new_tensor_3d(ctx, kind, hidden, inter, pool)
    down = base.ggml_new_tensor_3d(ctx, kind, inter, hidden, pool)
    for seed, (tensor, rows, cols) in enumerate(((gate, inter, hidden), (up, inter, hidden),
                                                 (down, hidden, inter))):
        fill(base, tensor, kind, rows, cols, pool, seed)
    graphs = []
    rng = random.Random(len(tokens))
    for n in tokens:
        x = base.ggml_new_tensor_3d(ctx, GGML_TYPE_F32, hidden, 1, n)
        xs = array("f", (rng.gauss(0.0, 1.0) for _ in range(hidden * n)))
        ctypes.memmove(base.ggml_get_data(x), (c_float * len(xs)).from_buffer(xs), 4 * len(xs))
        ids = base.ggml_new_tensor_2d(ctx, GGML_TYPE_I32, 1, n)
        g = base.ggml_mul_mat_id(ctx, gate, x, ids)
        u = base.ggml_mul_mat_id(ctx, up, x, ids)
        y = base.ggml_mul_mat_id(ctx, down, base.ggml_mul(ctx, base.ggml_silu(ctx, g), u), ids)
        graph = base.ggml_new_graph(ctx)
        base.ggml_build_forward_expand(graph, y)
        graphs.append((graph, (ctypes.c_int32 * n).from_address(base.ggml_get_data(ids))))
    backend = libs["cpu"].ggml_backend_cpu_init()
    libs["cpu"].ggml_backend_cpu_set_n_threads(backend, int(opts["threads"]))

    def run(i: int, expert: int) -> float:
        graph, ids = graphs[i]
        ids[:] = [expert] * len(ids)
        start = time.perf_counter()
        if base.ggml_backend_graph_compute(backend, graph) != 0:
            fail("ggml_backend_graph_compute failed")
        return time.perf_counter() - start

    for i in range(len(graphs)):  # set-up (threads, work buffers); the pool's pages are
        run(i, i % pool)            # resident already: fill() wrote every one
    times: list[list[float]] = [[] for _ in tokens]
    call, first = 0, time.perf_counter()
    while True:
        for i in range(len(tokens)):
            times[i].append(run(i, call % pool))
            call += 1
        done, spent = len(times[0]), time.perf_counter() - first
        if (done >= opts["rounds"] and spent >= opts["min_s"]) or (
                done >= opts["min_calls"] and spent > opts["budget_s"]):
            break
    libs["base"].ggml_backend_free(backend)
    base.ggml_free(ctx)
    reply({"seconds": times})


if __name__ == "__main__":
    main()

"""A stand-in for traces/llamacpp/worker.py that misbehaves as llama.cpp can, for
tests/test_llamacpp_worker.py (no llama.cpp here: stdlib and traces/llamacpp/frames.py).

    python fake_llama_worker.py OPTIONS_JSON

OPTIONS_JSON is what placer passes the real worker; PLACER_FAKE_MODE says how to behave:
- "chatty": prints llama.cpp-like lines on stdout before every reply (the replies still
  come as frames);
- "abort": on a run request, writes a gdb backtrace to stdout and a ggml message to stderr,
  then aborts (SIGABRT), as ggml_abort does;
- "garbage": writes bytes that are no frame on the reply channel;
- "huge": announces a reply of 2**40 bytes;
- "notjson": a well-formed frame whose payload is not JSON;
- "silent-exit": exits 3 before answering, printing one line to stderr;
- "hang": answers ready, then reads requests and never answers one (a wedged worker);
- "deaf": answers ready, then never reads its stdin (a long request fills the pipe).
A tokenize request is answered with one token per character sent: [chars, 0, 0, ...].
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "traces" / "llamacpp"))

from frames import HEADER, MAGIC, REPLY_FD, reply  # noqa: E402

MODE = os.environ.get("PLACER_FAKE_MODE", "chatty")


def raw(data: bytes) -> None:
    os.write(int(os.environ[REPLY_FD]), data)


def main() -> None:
    print("llama_model_loader: loaded meta data with 33 key-value pairs", flush=True)
    if MODE == "silent-exit":
        print("ggml_vulkan: no device found", file=sys.stderr, flush=True)
        sys.exit(3)
    if MODE == "garbage":
        raw(b"#0  0x00007f in ggml_abort () from libggml-base.so\n")
        sys.exit(0)
    if MODE == "huge":
        raw(HEADER.pack(MAGIC, 1 << 40))
        sys.exit(0)
    if MODE == "notjson":
        raw(HEADER.pack(MAGIC, 5) + b"{oops")
        sys.exit(0)
    reply({"ready": True, "n_vocab": 64})
    if MODE in ("hang", "deaf"):
        if MODE == "hang":
            sys.stdin.readline()
        time.sleep(3600)
    for line in sys.stdin:
        req = json.loads(line)
        print(f"print_info: {req['op']} {'{'}not json", flush=True)
        if req["op"] == "tokenize":
            text = req["text"] if req["text"] is not None else req["chat"][0]["content"]
            reply({"tokens": [len(text)] + [0] * (len(text) - 1)})
        elif req["op"] == "run" and MODE == "abort":
            os.write(1, b'{"tokens": [1, 2]}\n#0  0x00007f3a in __GI___wait4 ()\n'
                        b"#1  0x00007f3b in ggml_print_backtrace () from libggml-base.so\n")
            os.write(2, b"/src/llama-moe-cache.cpp:412: GGML_ASSERT(slot < n_slots) failed\n")
            os.abort()
        elif req["op"] == "run":
            n = len(req["tokens"])
            reply({"tokens": req["tokens"], "prompt": n, "generated": [], "layers": [0],
                   "experts": [[[1, 2]] for _ in range(n)], "fetches": []})
        else:
            reply({"alignment": None, "log": []})
            return


if __name__ == "__main__":
    main()

"""The choices of the collect and import options, named where importing them costs nothing:
`placer`'s command modules put them in their --help text, and a command's start must not
load numpy, pyarrow or torch (tests/test_startup.py). traces.collecting.collect,
traces.collecting.server and traces.importers use these very tuples (a test checks
FORMAT_NAMES against the importers)."""

from __future__ import annotations

# MODES and DTYPES: traces.collecting.collect's; ENGINES: traces.collecting.server's
MODES = ("score", "generate")                      # how documents are run
DTYPES = ("auto", "float32", "bfloat16", "float16")  # the checkpoint's dtype
ENGINES = ("sglang", "vllm")                       # servers that return routing
ENDPOINTS = ("completions", "chat")  # vLLM's /v1/completions or /v1/chat/completions
FORMAT_NAMES = ("counts", "sglang", "sglang-http", "vllm", "imatrix", "trtllm", "tokens")

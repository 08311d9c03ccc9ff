"""Formats read below the trace files themselves: GGUF headers and ggml types, JSON text
and bounded line reading, each strictly validated."""

"""The reply frames of placer's llama.cpp workers (see channel.py), the child's side.

Stdlib only: the workers run this under the side environment's interpreter, without placer
(`from frames import reply`), and placer's side (channel.py) takes MAGIC and HEADER from here.
"""

from __future__ import annotations

import json
import os
import struct

MAGIC = b"PLCJ"
HEADER = struct.Struct(">4sQ")  # magic, payload length (bytes, big-endian)
REPLY_FD = "PLACER_REPLY_FD"    # the environment variable naming the channel's fd

_channel = None


def reply(obj: dict) -> None:
    """`obj` as one frame on the reply channel (the fd in PLACER_REPLY_FD, made
    close-on-exec on first use, so a gdb that an abort starts never holds it)."""
    global _channel
    if _channel is None:
        fd = os.environ.get(REPLY_FD)
        if fd is None:
            raise SystemExit(f"no reply channel: {REPLY_FD} is not set (placer starts this)")
        os.set_inheritable(int(fd), False)
        _channel = os.fdopen(int(fd), "wb")
    data = json.dumps(obj).encode()
    _channel.write(HEADER.pack(MAGIC, len(data)) + data)
    _channel.flush()

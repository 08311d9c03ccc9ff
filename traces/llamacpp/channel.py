"""The pipe between placer and a llama.cpp worker process, on a channel llama.cpp cannot reach.

A worker (`worker.py`, `kernels.py`) runs llama.cpp's libraries in the side environment.
llama.cpp, ggml and the Vulkan driver print to the process's stdout and stderr as they like:
on an abort ggml runs gdb, whose backtrace lands on stdout (`ggml_print_backtrace`). So the
worker's replies never travel on stdout: placer opens a dedicated pipe, passes its write end
to the child (`pass_fds`; the number in `PLACER_REPLY_FD`, made close-on-exec there so a
gdb the child spawns never holds it), and every reply is one frame on it:

    b"PLCJ" | payload length, 8 bytes big-endian | payload: one JSON object, UTF-8

(`frames.py`, stdlib only, writes them in the child.)
The child's stdout and stderr both go to one log pipe that a thread drains (so the child
never blocks on a full pipe) into the last `TAIL_LINES` lines kept. A reply that is not a
frame (another magic, a length over `MAX_REPLY_BYTES`, a payload that is no JSON object), a
closed channel or an `{"error": ...}` reply becomes one TraceError line naming the worker,
how it ended and its last output lines. The child runs in its own process group, killed
whole when the Worker closes, however it closes.

Requests go the other way as JSON lines on the child's stdin; their sizes are bounded by
the caller before they are sent (`runner.LlamaCpp`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from collections import deque
from collections.abc import Mapping, Sequence

from traces.errors import TraceError
from traces.llamacpp.frames import HEADER, MAGIC, REPLY_FD

MAX_REPLY_BYTES = 1 << 30   # a reply (a run's routing) bigger than this is refused unread
TAIL_LINES = 3              # output lines of a failed worker quoted in its error
KEPT_LINES = 200            # output lines kept while it runs (the tail is taken from these)
LINE_CHARS = 160            # each quoted line cut to this


class Worker:
    """A child process with a framed reply channel; use as a context manager. `what` names
    it in errors (e.g. "llama.cpp's worker on model.gguf")."""

    def __init__(self, argv: Sequence[str], what: str,
                 env: Mapping[str, str] | None = None) -> None:
        self.what = what
        self.lines: deque[str] = deque(maxlen=KEPT_LINES)
        reply_r, reply_w = os.pipe()
        log_r, log_w = os.pipe()
        child_env = dict(os.environ if env is None else env)
        child_env[REPLY_FD] = str(reply_w)
        try:
            self.proc = subprocess.Popen(
                list(argv), stdin=subprocess.PIPE, stdout=log_w, stderr=log_w,
                pass_fds=(reply_w,), env=child_env, start_new_session=True)
        except OSError as exc:
            for fd in (reply_r, reply_w, log_r, log_w):
                os.close(fd)
            raise TraceError(f"{what}: cannot start {argv[0]}: {exc.strerror}") from None
        os.close(reply_w)
        os.close(log_w)
        self.replies = os.fdopen(reply_r, "rb")
        self._drain = threading.Thread(target=self._read_log, args=(os.fdopen(log_r, "rb"),),
                                       daemon=True)
        self._drain.start()

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read_log(self, log) -> None:
        with log:
            for raw in log:
                self.lines.append(raw.decode(errors="replace").rstrip())

    def send(self, request: dict) -> None:
        """One request line on the child's stdin; TraceError if it is gone."""
        try:
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise self.failure("stopped before the request was sent") from None

    def receive(self) -> dict:
        """The next reply; TraceError for an error reply, a closed or garbled channel."""
        head = self._read(HEADER.size)
        if head is None:
            raise self.failure("closed its reply channel")
        magic, size = HEADER.unpack(head)
        if magic != MAGIC:
            raise self.failure(f"sent a reply that is not a frame (starts {head[:8]!r})")
        if size > MAX_REPLY_BYTES:
            raise self.failure(f"announced a reply of {size} bytes (at most "
                               f"{MAX_REPLY_BYTES} are read)")
        body = self._read(size)
        if body is None:
            raise self.failure(f"closed its reply channel inside a {size}-byte reply")
        try:
            reply = json.loads(body)
        except (UnicodeDecodeError, ValueError):
            raise self.failure(f"sent a reply that is not JSON (starts {body[:24]!r})") from None
        if not isinstance(reply, dict):
            raise self.failure("sent a reply that is not a JSON object")
        if "error" in reply:
            raise self.failure(f"says: {str(reply['error'])[:500]}")
        return reply

    def ask(self, request: dict) -> dict:
        self.send(request)
        return self.receive()

    def _read(self, size: int) -> bytes | None:
        """Exactly `size` bytes of the channel, None where it ends first."""
        parts, left = [], size
        while left:
            chunk = self.replies.read(min(left, 1 << 24))
            if not chunk:
                return None
            parts.append(chunk)
            left -= len(chunk)
        return b"".join(parts)

    def failure(self, why: str) -> TraceError:
        """The one-line error of a worker that `why`: how it ended and its last output."""
        ended = self._ended()
        self._drain.join(timeout=2)
        tail = [x.strip()[:LINE_CHARS] for x in self.lines if x.strip()][-TAIL_LINES:]
        said = "; its last output: " + " | ".join(tail) if tail else "; it printed nothing"
        self.close()
        return TraceError(f"{self.what} {why}{ended}{said}")

    def _ended(self) -> str:
        """", exit status N" / ", killed by SIGNAME" once the child ended (within 2 s), else
        "" (it is killed then)."""
        try:
            code = self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return ""
        if code < 0:
            try:
                return f", killed by {signal.Signals(-code).name}"
            except ValueError:
                return f", killed by signal {-code}"
        return f", exit status {code}"

    def close(self) -> None:
        """Kill the child's process group if it still runs; free the pipes."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()
        for stream in (self.proc.stdin, self.replies):
            try:
                stream.close()
            except OSError:
                pass


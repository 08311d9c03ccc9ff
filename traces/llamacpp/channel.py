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

No wait on the worker is unbounded. Sending a request, each reply and closing each have a
deadline: a reply (or a request's write into the child's stdin) that does not come within
`PLACER_WORKER_TIMEOUT` seconds (default REPLY_TIMEOUT_S, an hour: loading a model of
hundreds of GB from a slow disk, or a long run on the CPU, takes minutes, never an hour
without a word) is one TraceError line; a worker that is stopped (SIGSTOP, SIGTSTP, a
debugger: state T or t in /proc) for STOPPED_S seconds while placer waits on it fails the
same way at once, within STOPPED_S + POLL_S, whatever the timeout. Closing gives the killed
child KILL_WAIT_S to be reaped.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path

from traces.errors import TraceError
from traces.llamacpp.frames import HEADER, MAGIC, REPLY_FD

MAX_REPLY_BYTES = 1 << 30   # a reply (a run's routing) bigger than this is refused unread
TAIL_LINES = 3              # output lines of a failed worker quoted in its error
KEPT_LINES = 200            # output lines kept while it runs (the tail is taken from these)
LINE_CHARS = 160            # each quoted line cut to this
REPLY_TIMEOUT_S = 3600.0    # a reply (or a request's write) that takes longer fails
TIMEOUT_ENV = "PLACER_WORKER_TIMEOUT"  # seconds, instead of REPLY_TIMEOUT_S (tests: a few)
STOPPED_S = 10.0            # a worker stopped this long while waited on fails at once
POLL_S = 0.5                # how often a wait looks at the worker's state
KILL_WAIT_S = 10.0          # a killed worker reaped within this, else left to init


def reply_timeout() -> float:
    """Seconds a reply may take: PLACER_WORKER_TIMEOUT where it is a positive number, else
    REPLY_TIMEOUT_S."""
    try:
        value = float(os.environ.get(TIMEOUT_ENV, ""))
    except ValueError:
        return REPLY_TIMEOUT_S
    return value if 0 < value < float("inf") else REPLY_TIMEOUT_S


def process_state(pid: int) -> str:
    """The state letter of process `pid` in /proc (R, S, D, T, t, Z...), "" where unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat[stat.rfind(")") + 2:][:1]


class Worker:
    """A child process with a framed reply channel; use as a context manager. `what` names
    it in errors (e.g. "llama.cpp's worker on model.gguf")."""

    def __init__(self, argv: Sequence[str], what: str,
                 env: Mapping[str, str] | None = None) -> None:
        self.what = what
        self.timeout = reply_timeout()
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
        self.replies = os.fdopen(reply_r, "rb", buffering=0)
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
        """One request line on the child's stdin; TraceError if it is gone, or if the line
        is not taken within the deadline (module docstring)."""
        data = memoryview((json.dumps(request) + "\n").encode())
        fd = self.proc.stdin.fileno()
        os.set_blocking(fd, False)
        deadline = time.monotonic() + self.timeout
        try:
            while data:
                self._wait(fd, "w", deadline, "took no request")
                try:
                    data = data[os.write(fd, data[:1 << 16]):]
                except BlockingIOError:
                    continue
        except (BrokenPipeError, OSError):
            raise self.failure("stopped before the request was sent") from None

    def receive(self) -> dict:
        """The next reply; TraceError for an error reply, a closed or garbled channel, or
        none within the deadline (module docstring)."""
        deadline = time.monotonic() + self.timeout
        head = self._read(HEADER.size, deadline)
        if head is None:
            raise self.failure("closed its reply channel")
        magic, size = HEADER.unpack(head)
        if magic != MAGIC:
            raise self.failure(f"sent a reply that is not a frame (starts {head[:8]!r})")
        if size > MAX_REPLY_BYTES:
            raise self.failure(f"announced a reply of {size} bytes (at most "
                               f"{MAX_REPLY_BYTES} are read)")
        body = self._read(size, deadline)
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

    def _read(self, size: int, deadline: float) -> bytes | None:
        """Exactly `size` bytes of the channel, None where it ends first."""
        parts, left = [], size
        fd = self.replies.fileno()
        while left:
            self._wait(fd, "r", deadline, "sent no reply")
            chunk = os.read(fd, min(left, 1 << 24))
            if not chunk:
                return None
            parts.append(chunk)
            left -= len(chunk)
        return b"".join(parts)

    def _wait(self, fd: int, mode: str, deadline: float, silent: str) -> None:
        """Until `fd` is ready to read ("r") or write ("w"): a failure where the deadline
        passes first, or where the worker has been stopped for STOPPED_S."""
        stopped_since = None
        poller = select.poll()  # not select.select: an fd past 1023 is fine
        poller.register(fd, select.POLLIN if mode == "r" else select.POLLOUT)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self.failure(f"{silent} within {self.timeout:g} s "
                                   f"({TIMEOUT_ENV} sets the limit)")
            if poller.poll(max(1, int(1000 * min(POLL_S, left)))):
                return
            if process_state(self.proc.pid) in ("T", "t"):
                stopped_since = stopped_since or time.monotonic()
                if time.monotonic() - stopped_since >= STOPPED_S:
                    raise self.failure(f"is stopped (SIGSTOP or a debugger) and {silent} for "
                                       f"{STOPPED_S:g} s")
            else:
                stopped_since = None

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
        """Kill the child's process group if it still runs (a stopped one too: SIGKILL
        needs no SIGCONT); free the pipes. The child is reaped within KILL_WAIT_S."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(timeout=KILL_WAIT_S)
        except subprocess.TimeoutExpired:  # in uninterruptible sleep: init reaps it later
            pass
        for stream in (self.proc.stdin, self.replies):
            try:
                stream.close()
            except OSError:
                pass


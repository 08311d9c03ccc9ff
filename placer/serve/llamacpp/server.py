"""Driver 2 of `placer bench --engine llamacpp`: the user's own llama-server
(`--server 'llama-server -m model.gguf ...'`).

For each pass placer starts the command with the option's flags (as `placer export
llamacpp` prints them), `--host 127.0.0.1 --port P` (a free port), `-c` and `-t`, in a
process group of its own, its output to a log file; waits for `/health`; sends each
sequence to `/completion` (llama.cpp's tools/server, read in the llama.cpp that
llama-cpp-python 0.3.36 vendors: `server-task.cpp` `result_timings::to_json`): the prompt as
token ids, `n_predict` the sequence's decode tokens + 1, greedy (`top_k` 1, temperature 0),
`ignore_eos`, `cache_prompt` false (each request prefills, as the binding's passes do);
reads `timings.predicted_ms` and `predicted_n` of each response: the server's own decode
time; then stops the group (SIGTERM, SIGKILL after 30 s) and reads the cache's lines from the
log (printed when the context is freed, as the binding's).

A server cannot show which experts its tokens were routed to, so the recording pass of each
option runs through the bundled binding on the same tokens (same GGUF; when `.venv-llama` is
missing the bench says so and stops). An option whose flags the server does not take (its
`--help` lacks `--moe-cache-mib`: a build before the cache) is refused in one line before
anything starts, naming the flag.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from placer.errors import PlacerError
from placer.serve.llamacpp.binding import BenchEngine, BindingDriver, Pass
from traces.collecting.corpora import Document
from traces.llamacpp.cache import SLOTS, TOTALS

START_S = 300.0   # a server that is not healthy by then is stopped
STOP_S = 30.0     # SIGTERM, then SIGKILL
REQUEST_S = 600.0
TAIL = 3
MIN_CONTEXT = 512  # -c at least this: llama-server sizes its slots from it


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerDriver:
    """Passes through the user's llama-server; the recording through the binding."""

    name = "server"

    def __init__(self, argv: list[str], engine: BenchEngine, flags_of) -> None:
        self.argv = argv
        self.engine = engine
        self.flags_of = flags_of
        self.binding = BindingDriver(engine)
        self.help = server_help(argv)
        self.build = server_version(argv)
        self.source = f"{argv[0]} ({self.build})"

    @classmethod
    def from_command(cls, command: str, model: Path, engine: BenchEngine,
                     flags_of) -> ServerDriver:
        """The driver of `--server COMMAND`, checked: a program that runs, `-m` the model."""
        try:
            argv = shlex.split(command)
        except ValueError as exc:
            raise PlacerError(f"--server: cannot read {command!r}: {exc}") from None
        if not argv or shutil.which(argv[0]) is None:
            raise PlacerError(f"--server: {argv[0] if argv else command!r} is not a program "
                              "on PATH")
        if "-m" not in argv and "--model" not in argv:
            argv += ["-m", str(model)]
        for flag in ("--host", "--port"):
            if flag in argv:
                raise PlacerError(f"--server: leave {flag} out: placer serves on 127.0.0.1 "
                                  "at a free port")
        return cls(argv, engine, flags_of)

    def check(self, flags: list[str]) -> None:
        """One line for a flag this server's --help does not list."""
        for flag in flags:
            if flag.startswith("-") and flag not in self.help:
                raise PlacerError(f"--server: {self.argv[0]} ({self.build}) does not take "
                                  f"{flag} (not in its --help): run options it has, "
                                  "e.g. --options without the cached ones")

    def sequences(self, docs: list[Document], max_prompt: int, max_new_tokens: int
                  ) -> list[tuple[int, list[int]]]:
        return self.binding.sequences(docs, max_prompt, max_new_tokens)

    def run(self, host_layers: tuple[int, ...], cache_mib: int,
            tensor_split: tuple[float, ...] | None, sequences: list[tuple[int, list[int]]],
            record: bool) -> Pass:
        if record:
            recorded = self.binding.run(host_layers, cache_mib, tensor_split, sequences, True)
            return recorded
        flags = self.flags_of(host_layers, cache_mib)
        self.check(flags)
        decode = []
        with tempfile.TemporaryDirectory(prefix="placer-server-") as tmp:
            log = Path(tmp) / "server.log"
            port = free_port()
            argv = [*self.argv, *shlex.split(flags), "--host", "127.0.0.1", "--port",
                    str(port), "-c", str(max(self.engine.n_ctx, MIN_CONTEXT)), "-t",
                    str(self.engine.threads), "-np", "1"]
            with open(log, "wb") as out:
                proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                        stderr=subprocess.STDOUT, start_new_session=True)
            try:
                wait_healthy(proc, port, log)
                for prompt, tokens in sequences:
                    decode.append(complete(port, tokens[:prompt], len(tokens) - prompt, log))
            finally:
                stop(proc)
            text = log.read_text(errors="replace")
        totals = {m[0]: [int(m[1]), int(m[2]), float(m[3])] for m in TOTALS.findall(text)}
        slots = [(int(n), t, int(s)) for n, t, s in SLOTS.findall(text)]
        return Pass(decode, None, totals, slots, None)


def server_help(argv: list[str]) -> str:
    done = subprocess.run([argv[0], "--help"], capture_output=True, text=True, timeout=60,
                          errors="replace")
    return done.stdout + done.stderr


def server_version(argv: list[str]) -> str:
    """The first line `llama-server --version` prints (e.g. "version: 1 (0c1e5709)")."""
    done = subprocess.run([argv[0], "--version"], capture_output=True, text=True, timeout=60,
                          errors="replace")
    lines = [x.strip() for x in (done.stdout + done.stderr).splitlines()
             if x.strip().startswith("version")]
    return lines[0] if lines else "version unknown"


def tail(log: Path) -> str:
    lines = [x.strip()[:160] for x in log.read_text(errors="replace").splitlines() if x.strip()]
    return " | ".join(lines[-TAIL:]) or "nothing"


def wait_healthy(proc: subprocess.Popen, port: int, log: Path) -> None:
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise PlacerError(f"--server exited {proc.returncode} before it served; its last "
                              f"output: {tail(log)}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise PlacerError(f"--server was not healthy after {START_S:.0f} s; its last output: "
                      f"{tail(log)}")


def complete(port: int, prompt: list[int], decode: int, log: Path) -> list[float]:
    """One greedy /completion of `prompt`; the server's decode seconds, spread evenly over
    its decode tokens (it reports their total)."""
    body = {"prompt": prompt, "n_predict": decode + 1, "temperature": 0.0, "top_k": 1,
            "ignore_eos": True, "cache_prompt": False, "stream": False}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/completion",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_S) as r:
            reply = json.loads(r.read(1 << 26))
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise PlacerError(f"--server: /completion failed ({exc}); its last output: "
                          f"{tail(log)}") from None
    timings = reply.get("timings") if isinstance(reply, dict) else None
    if not isinstance(timings, dict) or not timings.get("predicted_n"):
        raise PlacerError("--server: /completion returned no timings.predicted_n (is it "
                          "llama.cpp's llama-server?)")
    n, ms = int(timings["predicted_n"]), float(timings["predicted_ms"])
    return [ms / 1e3 / n] * n


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM the server's process group (it frees its context and logs the cache), then
    SIGKILL what is left after STOP_S."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            pass
        except ProcessLookupError:
            return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()

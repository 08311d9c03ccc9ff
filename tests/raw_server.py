"""A loopback HTTP server that answers with whatever bytes a test gives it, as slowly as it
likes: for clients that must stop waiting (traces/collecting/http.py). Bounded in connections and in
time: every answer stops by itself, and the server ends with its `with` block."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

MAX_CONNECTIONS = 40
HOLD_S = 120.0  # the longest an answer keeps a connection open


@dataclass
class Seen:
    """What the server saw: requests received (`first` set at the first), the last one's
    JSON body, bytes it got out."""

    requests: int = 0
    sent: int = 0
    body: object = None
    first: threading.Event = field(default_factory=threading.Event)


Answer = Callable[[socket.socket, Seen], None]


def send(conn: socket.socket, seen: Seen, data: bytes) -> bool:
    """Send `data`; False once the client has hung up."""
    try:
        conn.sendall(data)
    except OSError:
        return False
    seen.sent += len(data)
    return True


def drip(data: bytes, every_s: float) -> Answer:
    """Answer with `data` one byte every `every_s` seconds (until the client hangs up)."""

    def answer(conn: socket.socket, seen: Seen) -> None:
        for i in range(len(data)):
            if not send(conn, seen, data[i:i + 1]):
                return
            time.sleep(every_s)

    return answer


def once(data: bytes) -> Answer:
    """Answer with `data` at once, then close."""
    return lambda conn, seen: send(conn, seen, data)


def stream(head: bytes, chunk: bytes, count: int) -> Answer:
    """Answer with `head`, then `chunk` `count` times, as fast as the client reads."""

    def answer(conn: socket.socket, seen: Seen) -> None:
        if send(conn, seen, head):
            for _ in range(count):
                if not send(conn, seen, chunk):
                    return

    return answer


def replying(make: Callable[[object], object], status: str = "200 OK") -> Answer:
    """Answer with the JSON `make(request body)`."""
    return lambda conn, seen: send(conn, seen, http_reply(json.dumps(make(seen.body)).encode(),
                                                          status))


def silence(conn: socket.socket, seen: Seen) -> None:
    """Never answer: hold the connection until the client goes (or HOLD_S)."""
    conn.settimeout(HOLD_S)
    try:
        conn.recv(1)
    except OSError:
        pass


def read_request(conn: socket.socket) -> bytes:
    """One request: its headers and the Content-Length bytes of body after them (1 MiB at
    most), all read, so that closing the connection does not reset it."""
    data = b""
    while b"\r\n\r\n" not in data and len(data) < 1 << 20:
        chunk = conn.recv(1 << 16)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < min(length, 1 << 20):
        chunk = conn.recv(1 << 16)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


@contextmanager
def raw_server(answer: Answer) -> Iterator[tuple[str, Seen]]:
    """(base URL, what it saw) of a server on 127.0.0.1 answering every request with
    `answer` (after reading the request: read_request)."""
    seen = Seen()
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    done = threading.Event()

    def handle(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(HOLD_S)
            try:
                request = read_request(conn)
            except OSError:
                return
            try:
                seen.body = json.loads(request.partition(b"\r\n\r\n")[2])
            except ValueError:
                seen.body = None
            seen.requests += 1
            seen.first.set()
            answer(conn, seen)

    def serve() -> None:
        for _ in range(MAX_CONNECTIONS):
            while not done.is_set():
                try:
                    conn, _ = listener.accept()
                    break
                except TimeoutError:
                    continue
            else:
                return
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", seen
    finally:
        done.set()
        thread.join(timeout=5)
        listener.close()


def http_reply(body: bytes, status: str = "200 OK", length: int | None = None) -> bytes:
    """A whole HTTP/1.1 reply: status line, Content-Length (of `body`, or `length`), body."""
    size = len(body) if length is None else length
    return (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {size}"
            "\r\nConnection: close\r\n\r\n").encode() + body

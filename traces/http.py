"""One JSON request to an inference server, bounded in time and in size, and abortable.

A socket timeout bounds each read, not a reply: a server that sends one byte every half
second never trips it. So every request here has a deadline for the whole exchange (connect,
status line, headers, body): a timer shuts the socket down when it passes, which ends any
read blocked on it. The body is read in chunks up to a byte limit (a reply is otherwise
buffered whole: 300 MB at concurrency 4 held 1.46 GB). `Connections.close_all` shuts every
request in flight at once, so an interrupted collect stops at once instead of waiting for
its requests to time out.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import urllib.parse

from traces.errors import TraceError
from traces.jsontext import loads_json

CHUNK = 1 << 16


class Expired(TimeoutError):
    """The whole reply did not arrive within the deadline."""


class HTTPStatus(Exception):
    """A reply with a status other than 2xx: `code` and the first bytes of its body."""

    def __init__(self, code: int, detail: str) -> None:
        super().__init__(f"HTTP {code} {detail}".strip())
        self.code = code


class Connections:
    """The connections in flight, so that an interrupt can shut them all (a thread blocked
    reading one returns at once); after `close_all` no new request starts."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: set[http.client.HTTPConnection] = set()
        self.closed = threading.Event()

    def close_all(self) -> None:
        self.closed.set()
        with self._lock:
            for conn in self._open:
                _shut(conn)

    def post_json(self, url: str, body: dict, timeout_s: float, max_bytes: int) -> object:
        """POST `body` as JSON to `url`; the JSON reply. Expired when the whole exchange
        takes longer than `timeout_s`; HTTPStatus for a status other than 2xx; TraceError
        for a reply over `max_bytes` or not JSON; OSError or http.client.HTTPException for
        a failed connection or a malformed reply."""
        parts = urllib.parse.urlsplit(url)
        kind = http.client.HTTPSConnection if parts.scheme == "https" else \
            http.client.HTTPConnection
        conn = kind(parts.hostname, parts.port, timeout=timeout_s)
        expired = threading.Event()
        timer = threading.Timer(timeout_s, lambda: (expired.set(), _shut(conn)))
        timer.daemon = True
        with self._lock:
            if self.closed.is_set():
                raise TraceError(f"{url}: stopped")
            self._open.add(conn)
        timer.start()
        try:
            conn.request("POST", parts.path or "/", body=json.dumps(body).encode(),
                         headers={"Content-Type": "application/json"})
            reply = conn.getresponse()
            data = _read(reply, url, max_bytes)
        except (OSError, http.client.HTTPException):
            if expired.is_set():
                raise Expired(f"no complete reply within {timeout_s:g} s") from None
            raise
        finally:
            timer.cancel()
            with self._lock:
                self._open.discard(conn)
            conn.close()
        if not 200 <= reply.status < 300:
            raise HTTPStatus(reply.status, data[:200].decode(errors="replace").strip())
        return loads_json(data, f"{url}: the reply")


def _read(reply: http.client.HTTPResponse, url: str, max_bytes: int) -> bytes:
    """The body of `reply`, a TraceError as soon as it passes `max_bytes`."""
    length = reply.getheader("Content-Length")
    if length is not None and length.strip().isdigit() and int(length) > max_bytes:
        raise TraceError(f"{url}: a reply of {int(length)} bytes; the routing of this "
                         f"request needs at most {max_bytes}")
    chunks, size = [], 0
    while chunk := reply.read(CHUNK):
        size += len(chunk)
        if size > max_bytes:
            raise TraceError(f"{url}: a reply of more than {max_bytes} bytes; the routing of "
                             "this request needs fewer")
        chunks.append(chunk)
    return b"".join(chunks)


def _shut(conn: http.client.HTTPConnection) -> None:
    """End every read and write on `conn`'s socket (from another thread), if it has one."""
    sock = conn.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

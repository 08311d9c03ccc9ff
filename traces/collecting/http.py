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
from traces.formats.jsontext import loads_json

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
        self._open: set[socket.socket] = set()
        self.closed = threading.Event()

    def close_all(self) -> None:
        self.closed.set()
        with self._lock:
            for sock in self._open:
                _shut(sock)

    def post_json(self, url: str, body: dict, timeout_s: float, max_bytes: int) -> object:
        """POST `body` as JSON to `url`; the JSON reply. Expired when the whole exchange
        takes longer than `timeout_s`; HTTPStatus for a status other than 2xx; TraceError
        for a reply over `max_bytes` or not JSON; OSError or http.client.HTTPException for
        a failed connection or a malformed reply."""
        parts = urllib.parse.urlsplit(url)
        kind = http.client.HTTPSConnection if parts.scheme == "https" else \
            http.client.HTTPConnection
        if self.closed.is_set():
            raise TraceError(f"{url}: stopped")
        conn = kind(parts.hostname, parts.port, timeout=timeout_s)
        conn.connect()  # bounded by timeout_s; its socket outlives conn.sock (see _exchange)
        sock, expired = conn.sock, threading.Event()
        timer = threading.Timer(timeout_s, lambda: (expired.set(), _shut(sock)))
        timer.daemon = True
        with self._lock:
            self._open.add(sock)
        if self.closed.is_set():  # close_all ran between the check above and now
            _shut(sock)
        timer.start()
        try:
            reply, data = _exchange(conn, parts.path or "/", body, url, max_bytes)
        except (OSError, http.client.HTTPException):
            if expired.is_set():
                raise Expired(f"no complete reply within {timeout_s:g} s") from None
            raise
        finally:
            timer.cancel()
            with self._lock:
                self._open.discard(sock)
            conn.close()
            sock.close()
        if not 200 <= reply.status < 300:
            raise HTTPStatus(reply.status, data[:200].decode(errors="replace").strip())
        return loads_json(data, f"{url}: the reply")


def _exchange(conn: http.client.HTTPConnection, path: str, body: dict, url: str,
              max_bytes: int) -> tuple[http.client.HTTPResponse, bytes]:
    """Send the request on `conn` and read the whole reply. (A reply that closes the
    connection takes its socket over: conn.sock is None by then, hence the socket kept.)"""
    conn.request("POST", path, body=json.dumps(body).encode(),
                 headers={"Content-Type": "application/json"})
    reply = conn.getresponse()
    try:
        return reply, _read(reply, url, max_bytes)
    finally:
        reply.close()


def _read(reply: http.client.HTTPResponse, url: str, max_bytes: int) -> bytes:
    """The body of `reply`, a TraceError as soon as it passes `max_bytes`; IncompleteRead
    when it ends short of its Content-Length."""
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
    if reply.length:  # the connection ended before the Content-Length it announced
        raise http.client.IncompleteRead(b"".join(chunks), reply.length)
    return b"".join(chunks)


def _shut(sock: socket.socket) -> None:
    """End every read and write on `sock` (from another thread: a blocked read returns)."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass

"""A warm `placer` for tests that run shell lines as a user types them (the README's blocks).

One server process imports placer's command line and the heavy packages its commands load
(torch, transformers' qwen3_moe, numba, pyarrow) once; each `placer` command of the shell
lines is then a fork of it that runs `placer.cli.main()` exactly as `python -m placer` does:
the same argv, working directory, environment and standard streams (the client's file
descriptors, passed over a Unix socket), its exit status returned. What those tests check
is each command's behaviour; this spares them Python importing torch and transformers again
for every command (5-10 s each on a 2-core machine).

    python warm_placer.py serve SOCKET OWNER  # imports, then serves until killed or until
                                              # the process OWNER is gone
    python -S warm_placer.py call SOCKET ARGS...   # one command (stdlib only: starts fast)

Commands are served one at a time (the shell runs them one after another; a pipeline of
two placer commands would wait on each other, and the README's blocks have none). The
`warm_placer` fixture starts the server per test session and gives the shell function.
"""

from __future__ import annotations

import importlib
import json
import os
import socket
import struct
import sys

HEADER = struct.Struct("!I")


def read_exact(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("warm_placer: the client went away")
        data += chunk
    return data


def child(request: dict, fds: list[int]) -> int:
    """In the fork: become the client's `python -m placer ARGS` and run it."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    sys.argv = ["placer", *request["argv"]]
    code = 0
    try:
        from placer.cli import main

        main()
    except SystemExit as exc:
        if isinstance(exc.code, str):
            sys.stderr.write(exc.code + "\n")
            code = 1
        else:
            code = exc.code or 0
    except BaseException:  # what the interpreter would print, and its status
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def serve(path: str, owner: int) -> None:
    import numba  # noqa: F401
    import pyarrow.dataset  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401
    import transformers.models.qwen3_moe.modeling_qwen3_moe  # noqa: F401

    import placer.commands.app  # noqa: F401
    from placer.commands.index import COMMANDS

    for name in COMMANDS:  # the command line imports a command's module on first use
        importlib.import_module(f"placer.commands.{name}")

    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path + ".tmp")
    server.listen(8)
    server.settimeout(5.0)
    os.rename(path + ".tmp", path)  # ready once it exists
    while True:
        try:
            conn, _ = server.accept()
        except TimeoutError:
            if not os.path.exists(f"/proc/{owner}"):
                return
            continue
        conn.settimeout(None)
        with conn:
            head, fds, _, _ = socket.recv_fds(conn, HEADER.size, 3)
            head += read_exact(conn, HEADER.size - len(head))
            request = json.loads(read_exact(conn, HEADER.unpack(head)[0]))
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                server.close()
                conn.close()
                os._exit(child(request, fds))
            for fd in fds:
                os.close(fd)
            _, status = os.waitpid(pid, 0)
            conn.sendall(HEADER.pack(os.waitstatus_to_exitcode(status) & 0xFF))


def call(path: str, argv: list[str]) -> int:
    body = json.dumps({"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(path)
        socket.send_fds(conn, [HEADER.pack(len(body))], [0, 1, 2])
        conn.sendall(body)
        return HEADER.unpack(read_exact(conn, HEADER.size))[0]


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2], int(sys.argv[3]))
    else:
        sys.exit(call(sys.argv[2], sys.argv[3:]))

"""`placer serve`'s word on SIGTERM counts the requests in flight once the event loop's step
is done: the signal handler runs between two bytecodes of that step, which can be a reply's
last write before its cycle is marked complete (its client already has the reply)."""

from __future__ import annotations

import asyncio
import signal
from dataclasses import dataclass, field

import uvicorn

from placer.serve.server import draining_server


@dataclass(eq=False)
class Cycle:
    response_complete: bool = False


@dataclass(eq=False)
class Connection:
    cycle: Cycle = field(default_factory=Cycle)


def said_on_sigterm(complete_later: bool) -> list[str]:
    """What the server announces when SIGTERM lands while one connection's response is
    written but not yet marked complete, and (complete_later) the same step then marks it."""
    said: list[str] = []
    server = draining_server(uvicorn.Config(app=None), said.append)
    connection = Connection()
    server.server_state.connections.add(connection)

    async def one_step() -> None:
        server.handle_exit(signal.SIGTERM, None)  # as if between the write and the mark
        if complete_later:
            connection.cycle.response_complete = True
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    asyncio.run(one_step())
    return said


def test_a_reply_completed_in_the_signals_step_is_not_in_flight():
    assert said_on_sigterm(complete_later=True) == [
        "placer serve: SIGTERM: no request in flight, stopping"]


def test_a_reply_still_streaming_is_in_flight():
    said = said_on_sigterm(complete_later=False)
    assert len(said) == 1 and said[0].startswith("placer serve: SIGTERM: finishing 1 request "
                                                 "in flight (at most")

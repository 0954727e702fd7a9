"""CPU cost of the ingress's router link per round trip, without the rest of the server.

    python -m conveyor.deploy.benchmarks.router_link

A real ``RouterLink`` on a uvloop event loop talks to a ZeroMQ ROUTER in a thread
that answers every request at once. The figure is the event-loop thread's CPU time
per request/response pair (``time.thread_time``), which a busy machine disturbs
far less than throughput. It isolates the link's own cost: encode, send, poll,
receive, decode, resolve the waiting future.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time

import uvloop
import zmq

from conveyor.ingress.router_link import RouterLink
from conveyor.proto import messages as m

EP = f"ipc:///tmp/linkbench-{os.getpid()}.sock"


def echo() -> None:
    s: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.ROUTER)
    s.bind(EP)
    while True:
        ident, frame = s.recv_multipart(copy=False)
        msg = m.ingress_decoder.decode(frame.buffer)
        if isinstance(msg, m.InferRequest):
            s.send_multipart([ident, m.encode(m.InferResponse(msg.id, "x", "1", []))])
        elif isinstance(msg, m.ControlRequest):
            s.send_multipart([ident, m.encode(m.ControlReply(msg.id, 1))])


async def main() -> None:
    threading.Thread(target=echo, daemon=True).start()
    link = RouterLink(EP)
    await link.start()

    async def client(n: int) -> None:
        for _ in range(n):
            await link.infer(m.InferRequest(link.next_id(), "x", "", [], []))

    await client(200)
    for conc in (1, 8):
        n = 4000 // conc
        t, c = time.perf_counter(), time.thread_time()
        await asyncio.gather(*(client(n) for _ in range(conc)))
        t, c = time.perf_counter() - t, time.thread_time() - c
        print(f"c{conc}: {n*conc/t:.0f} rt/s, {c/(n*conc)*1e6:.1f} us CPU per round trip (event-loop thread)")
    await link.close()
    os.unlink(EP.removeprefix("ipc://"))


if __name__ == "__main__":
    uvloop.run(main())

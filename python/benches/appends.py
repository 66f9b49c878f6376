"""The package's appends per second against raw grpcio stub calls to the same sidecar.

Both sides send the same requests (the ownership's token and a fresh request id on every
append, one record of 64 bytes) over one channel each, to one `leasehold serve` over one etcd:
so the ratio is what the package's own work costs (its request ids, its retry loop, its
types), not the sidecar's. Rounds alternate between the two sides, so that a noisy machine
slows both alike, and each side's median round is reported. Two shapes:

- sequential: one caller appending to one session;
- concurrent: 64 asyncio callers, each appending to a session of its own, all owned by one
  client.

    python python/benches/appends.py [--rounds N] [--appends N]

etcd and the sidecar come from `leasehold.testing` (`$LEASEHOLD_ETCD_BIN` or `etcd` on PATH,
`leasehold` on PATH or `$LEASEHOLD_BIN`). Prints one line per shape:

    appends sequential: package 812/s, raw stubs 845/s: 0.96x (median of 7 rounds of 200)
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from typing import AsyncIterator, Awaitable, Callable

import grpc.aio

import leasehold
from leasehold.testing import Etcd, Sidecar
from leasehold.v1 import leasehold_pb2 as pb
from leasehold.v1 import leasehold_pb2_grpc as rpc

PAYLOAD = b"x" * 64
CALLERS = 64


class Raw:
    """A session owned with the raw stubs: an Attach stream, its epoch and token."""

    def __init__(self, stub: rpc.LeaseholdAsyncStub, session: str) -> None:
        self.stub = stub
        self.session = session
        self.requests: asyncio.Queue[pb.AttachRequest] = asyncio.Queue()
        self.epoch = 0
        self.token = b""

    async def acquire(self) -> None:
        async def outgoing() -> AsyncIterator[pb.AttachRequest]:
            while True:
                yield await self.requests.get()

        self.call = self.stub.Attach(outgoing())
        await self.requests.put(pb.AttachRequest(acquire=pb.Acquire(session=self.session)))
        answer = await self.call.read()
        assert isinstance(answer, pb.AttachResponse), answer
        acquired = answer.acquired
        self.epoch, self.token = acquired.epoch, acquired.token

    async def append(self) -> None:
        await self.stub.Append(
            pb.AppendRequest(
                session=self.session,
                epoch=self.epoch,
                payloads=[PAYLOAD],
                request_id=uuid.uuid4().hex,
                token=self.token,
            )
        )


async def timed(appends: int, append: Callable[[], Awaitable[object]]) -> float:
    started = time.perf_counter()
    for _ in range(appends):
        await append()
    return time.perf_counter() - started


async def concurrently(appends: int, callers: list[Callable[[], Awaitable[object]]]) -> float:
    started = time.perf_counter()
    await asyncio.gather(*(timed(appends, caller) for caller in callers))
    return time.perf_counter() - started


async def bench(address: str, rounds: int, appends: int) -> None:
    channel = grpc.aio.insecure_channel(address)
    stub = rpc.LeaseholdStub(channel)
    async with leasehold.connect(address) as client:
        # One session each for the sequential shape, 64 each for the concurrent one.
        mine = [await client.acquire(uuid.uuid4()) for _ in range(CALLERS + 1)]
        raws = [Raw(stub, str(uuid.uuid4())) for _ in range(CALLERS + 1)]
        for stubbed in raws:
            await stubbed.acquire()

        def package_append(own: leasehold.Own) -> Callable[[], Awaitable[object]]:
            return lambda: own.append(PAYLOAD)

        Timed = Callable[[], Awaitable[float]]
        shapes: dict[str, tuple[Timed, Timed, int]] = {
            "sequential": (
                lambda: timed(appends, package_append(mine[0])),
                lambda: timed(appends, raws[0].append),
                appends,
            ),
            "concurrent": (
                lambda: concurrently(appends // 8, [package_append(o) for o in mine[1:]]),
                lambda: concurrently(appends // 8, [r.append for r in raws[1:]]),
                (appends // 8) * CALLERS,
            ),
        }
        for name, (package, raw, per_round) in shapes.items():
            await raw()  # warm both paths
            await package()
            spent: dict[str, list[float]] = {"package": [], "raw": []}
            for _ in range(rounds):
                spent["raw"].append(await raw())
                spent["package"].append(await package())
            rate = {side: per_round / statistics.median(times) for side, times in spent.items()}
            print(
                f"appends {name}: package {rate['package']:.0f}/s, raw stubs {rate['raw']:.0f}/s:"
                f" {rate['package'] / rate['raw']:.2f}x (median of {rounds} rounds of {per_round})",
                flush=True,
            )
    await channel.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--appends", type=int, default=200, help="per round and caller shape")
    args = parser.parse_args()
    with Etcd.start() as etcd, Sidecar(etcd) as sidecar:
        asyncio.run(bench(sidecar.address, args.rounds, args.appends))


if __name__ == "__main__":
    main()

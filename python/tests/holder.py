"""A client process for the race test: stands by on SESSION, and once it owns it appends N
events, printing a JSON line for each step; then waits to be killed."""

from __future__ import annotations

import asyncio
import json
import math
import sys

import leasehold


def say(**line: object) -> None:
    print(json.dumps(line), flush=True)


async def main(address: str, session: str, appends: int) -> None:
    async with leasehold.connect(address) as client:
        async with client.own(session, wait=math.inf) as own:
            say(event="acquired", epoch=own.epoch, tip=own.tip_seq)
            for i in range(appends):
                appended = await own.append(f"{own.epoch}:{i}".encode())
                say(event="appended", seq=appended.last_seq)
            say(event="done")
            await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))

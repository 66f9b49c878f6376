"""An agent runtime's worker on leasehold, in asyncio.

The worker owns sessions (agents) handed to it, replays each one's journal to rebuild its
state, then runs its steps, appending each step to the journal before acting on it. When an
ownership is lost (another worker took the session over, the sidecar went away), that agent's
task is cancelled at once: it never runs a step past the loss. On SIGTERM every agent stops
between two steps and its session is released, for another worker to take over.

    leasehold --endpoints http://127.0.0.1:2379 serve --listen 127.0.0.1:50051 &
    python examples/python/agent_runtime.py 127.0.0.1:50051 SESSION-UUID [SESSION-UUID ...]
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys

import leasehold


async def run_agent(client: leasehold.Client, session: str, stopping: asyncio.Event) -> None:
    """One agent: own its session, rebuild its state from the journal, run its steps."""
    try:
        async with client.own(session, wait=60.0) as own:
            state = {"steps": 0}
            async for record in client.replay(session):
                assert record.event is not None
                state = json.loads(record.event)
            print(f"{session}: owned at epoch {own.epoch}, resuming after step {state['steps']}")
            while not stopping.is_set() and state["steps"] < 20:
                state = {"steps": state["steps"] + 1}
                # The step is in the journal before it is acted on: a worker that takes the
                # session over resumes after it, and a stale worker's append is refused.
                await own.append(json.dumps(state).encode())
                await asyncio.sleep(0.1)  # the step's work
            print(f"{session}: stopped after step {state['steps']}; released")
    except leasehold.LeaseLost as lost:
        print(f"{session}: lost ({lost.loss}); another worker resumes it")
    except leasehold.OwnershipEnded as ended:
        # An append refused because the ownership had ended (fenced, or unknown to a sidecar
        # that restarted): the same rule, stop.
        print(f"{session}: ownership ended ({ended.reason.lower()}); another worker resumes it")
    except leasehold.Held as held:
        print(f"{session}: held by {held.holder_node or 'another worker'}; not ours")


async def main(address: str, sessions: list[str]) -> None:
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stopping.set)
    loop.add_signal_handler(signal.SIGINT, stopping.set)
    async with leasehold.connect(address) as client:
        await asyncio.gather(*(run_agent(client, s, stopping) for s in sessions))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2:]))

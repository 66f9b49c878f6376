"""Ownership through the package, against a real sidecar over a real etcd: two processes race,
the holder dies, a frozen client's block is cancelled, a stale epoch is refused."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from typing import IO, Any, Callable

import pytest

import leasehold
from leasehold.testing import FaultProxy, Sidecar

from support import wait_until, within

HOLDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "holder.py")


class Lines:
    """A process's JSON lines, read on a thread."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.lines: list[dict[str, Any]] = []
        stdout: IO[str] | None = process.stdout
        assert stdout is not None

        def read() -> None:
            for line in stdout:
                self.lines.append(json.loads(line))

        threading.Thread(target=read, daemon=True).start()

    def seen(self, event: str) -> list[dict[str, Any]]:
        return [line for line in self.lines if line.get("event") == event]


def test_two_processes_race_the_holder_dies_and_the_other_owns_it_at_a_higher_epoch(
    leasehold_sidecar: Sidecar, leasehold_client: leasehold.SyncClient
) -> None:
    session = str(uuid.uuid4())

    def start() -> subprocess.Popen[str]:
        command = [sys.executable, HOLDER, leasehold_sidecar.address, session, "3"]
        return subprocess.Popen(command, stdout=subprocess.PIPE, text=True)

    processes = [start(), start()]
    lines = [Lines(p) for p in processes]
    try:
        wait_until("one of them owns it and appends", lambda: any(l.seen("done") for l in lines), 30)
        holder = next(i for i, l in enumerate(lines) if l.seen("done"))
        other = 1 - holder
        time.sleep(0.5)
        assert not lines[other].seen("acquired"), "one owner at a time"
        first = lines[holder].seen("acquired")[0]["epoch"]
        last_seq = lines[holder].seen("appended")[-1]["seq"]

        processes[holder].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        wait_until("the other owns it", lambda: bool(lines[other].seen("done")), 10)
        took = time.monotonic() - killed
        second = lines[other].seen("acquired")[0]["epoch"]
        assert second > first, (first, second)
        assert took < 5, f"the stream's end released it at once, not after a TTL: {took:.1f} s"

        # The journal: the dead owner's events, then the new owner's fence right after them.
        records = list(leasehold_client.replay(session, records=True))
        fence = next(r for r in records if r.fence is not None and r.fence.epoch == second)
        assert fence.seq == last_seq + 1
        assert fence.fence is not None and fence.fence.previous_seq == last_seq
        assert fence.fence.previous_epoch == first
        events = [r.event for r in records if r.event is not None]
        assert events == [f"{first}:{i}".encode() for i in range(3)] + [
            f"{second}:{i}".encode() for i in range(3)
        ]
    finally:
        for process in processes:
            process.kill()
            process.wait()


def test_a_frozen_clients_block_is_cancelled_and_raises_lease_lost(
    leasehold_fault: FaultProxy, leasehold_sidecar: Sidecar
) -> None:
    session = str(uuid.uuid4())
    progress: list[str] = []

    async def main() -> None:
        async with leasehold.connect(leasehold_fault.address) as client:
            with pytest.raises(leasehold.LeaseLost) as lost:
                async with client.own(session) as own:
                    await own.append(b"before the freeze")
                    progress.append("appended")
                    leasehold_fault.freeze()
                    # Work that would run on for ever: the loss must cancel it.
                    await asyncio.sleep(3600)
                    progress.append("ran on past the loss")
            assert not own.is_valid()
            assert lost.value.loss == "stream_ended", lost.value
            progress.append("lost")

    # The sidecar ends the ownership within its keepalive (1 s ping, 1 s to answer); the client
    # finds its connection dead within its own keepalive (10 s ping, 5 s to answer).
    async def bounded() -> None:
        await within("the loss", main(), 30)

    asyncio.run(bounded())
    assert progress == ["appended", "lost"], progress
    # The sidecar had released it: someone else owns it now, while the client is still frozen.
    with leasehold.connect_sync(leasehold_sidecar.address) as other:
        with other.own(session) as own:
            assert own.epoch > 0


def test_a_frozen_blocking_client_sees_lost_and_its_writes_raise(
    leasehold_fault: FaultProxy, leasehold_sidecar: Sidecar
) -> None:
    session = str(uuid.uuid4())
    with leasehold.connect_sync(leasehold_fault.address) as client:
        with pytest.raises(leasehold.LeaseLost):
            with client.own(session) as own:
                own.append(b"before the freeze")
                leasehold_fault.freeze()
                # Meanwhile the sidecar gives the session up, and another client takes it.
                with leasehold.connect_sync(leasehold_sidecar.address) as other:
                    wait_until("another owns it", lambda: _takes(other, session), 10)
                assert own.lost.wait(30), "the blocking client learns of the loss"
                assert own.loss == "stream_ended"
                with pytest.raises(leasehold.LeaseLost):
                    own.append(b"after the loss")
        leasehold_fault.heal()
    records = [r.event for r in leasehold.connect_sync(leasehold_sidecar.address).replay(session)]
    assert b"after the loss" not in records


def _takes(client: leasehold.SyncClient, session: str) -> bool:
    try:
        own = client.acquire(session)
    except leasehold.Held:
        return False
    own.release()
    return True


@pytest.mark.parametrize("blocking", [False, True], ids=["asyncio", "blocking"])
def test_a_stale_owner_is_refused_after_its_sidecar_was_paused_past_its_ttl(
    leasehold_sidecars: Callable[..., Sidecar], blocking: bool
) -> None:
    """A sidecar frozen past its TTL (a long GC pause) comes back: its client's append under
    the old epoch is refused, with the exception for it, and is not in the journal."""
    first = leasehold_sidecars(ttl=2)
    second = leasehold_sidecars(ttl=2)
    session = str(uuid.uuid4())

    def stale_append(own: Any) -> BaseException:
        first.pause()
        try:
            with leasehold.connect_sync(second.address) as other:
                wait_until("the other sidecar's client owns it", lambda: _owns_and_writes(other, session), 15)
        finally:
            first.resume()
        try:
            result = own.append(b"stale")
        except leasehold.LeaseholdError as error:
            return error
        raise AssertionError(f"a stale append was accepted: {result}")

    if blocking:
        with leasehold.connect_sync(first.address) as client:
            own = client.acquire(session)
            refused = stale_append(own)
    else:
        refused = asyncio.run(_stale_async(first.address, session, stale_append))
    assert isinstance(refused, (leasehold.Fenced, leasehold.LeaseLost)), repr(refused)
    assert not refused.retryable
    with leasehold.connect_sync(second.address) as reader:
        events = [r.event for r in reader.replay(session)]
    assert b"stale" not in events and b"current" in events, events


async def _stale_async(
    address: str, session: str, stale_append: Callable[[Any], BaseException]
) -> BaseException:
    """``stale_append`` of an asyncio ownership, run on a worker thread (it blocks on the
    sidecars) while this loop serves the ownership."""
    async with leasehold.connect(address) as client:
        own = await client.acquire(session)
        loop = asyncio.get_running_loop()

        class Blocking:
            def append(self, payload: bytes) -> leasehold.Appended:
                return asyncio.run_coroutine_threadsafe(own.append(payload), loop).result()

        return await asyncio.to_thread(stale_append, Blocking())


def _owns_and_writes(client: leasehold.SyncClient, session: str) -> bool:
    try:
        own = client.acquire(session)
    except leasehold.Held:
        return False
    own.append(b"current")
    return True

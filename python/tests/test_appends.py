"""Appends through the package: retried under their request id until the journal answers, so
each commits once; and the calls around them (replay, trim, validate, owner, delete)."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import pytest

import leasehold
from leasehold.testing import FaultProxy, Sidecar

from support import within


def test_an_append_whose_answer_was_lost_is_retried_across_a_sidecar_restart_and_lands_once(
    leasehold_fault: FaultProxy, leasehold_sidecar: Sidecar
) -> None:
    """The append commits, its answer is dropped, the sidecar is killed and started again: the
    client's retry, under the same request id, is answered from the journal (the first call's
    sequence numbers), and the record is in the journal once. The ownership ended with the
    sidecar, so the block then raises LeaseLost."""
    session = str(uuid.uuid4())
    seen: list[leasehold.Appended] = []

    async def main() -> None:
        async with leasehold.connect(leasehold_fault.address) as client:
            with pytest.raises(leasehold.LeaseLost):
                async with client.own(session) as own:
                    seen.append(await own.append(b"before"))
                    leasehold_fault.drop_replies()
                    # While the next append waits for its (dropped) answer: the sidecar dies,
                    # comes back on the same address, and the proxy passes answers again.
                    restart = threading.Timer(1.0, restart_and_heal)
                    restart.start()
                    seen.append(await own.append(b"once"))
                    # The block ends here, before the loss's cancel reached it: the cancel is
                    # taken at its end, and never lands on an await after it.
            restart.join()
            await asyncio.sleep(0.1)

    def restart_and_heal() -> None:
        leasehold_sidecar.restart()
        leasehold_fault.heal()

    asyncio.run(main())
    before, once = seen
    assert once.first_seq == before.last_seq + 1, (before, once)
    with leasehold.connect_sync(leasehold_sidecar.address) as reader:
        events = [r.event for r in reader.replay(session)]
    assert events == [b"before", b"once"], events


def test_a_blocking_append_whose_answer_was_lost_is_retried_and_lands_once(
    leasehold_fault: FaultProxy, leasehold_sidecar: Sidecar
) -> None:
    session = str(uuid.uuid4())
    with leasehold.connect_sync(leasehold_fault.address) as client:
        own = client.acquire(session)
        before = own.append(b"before", request_id="before")
        assert own.append(b"before", request_id="before") == before, "answered from the journal"
        leasehold_fault.drop_replies()
        # A second on, the proxy closes the connections that lost answers: the append is sent
        # again, under the same request id, on a new connection. The ownership's stream was on
        # the closed connection too: that ends it.
        threading.Timer(1.0, leasehold_fault.heal).start()
        appended = own.append(b"once")
        assert appended.first_seq == appended.last_seq == before.last_seq + 1
        assert own.lost.wait(5) and own.loss == "stream_ended"
    with leasehold.connect_sync(leasehold_sidecar.address) as reader:
        events = [r.event for r in reader.replay(session)]
    assert events == [b"before", b"once"], events


def test_the_calls_around_an_ownership(leasehold_sidecar: Sidecar) -> None:
    session = uuid.uuid4()

    async def main() -> None:
        async with leasehold.connect(leasehold_sidecar.address) as client:
            assert await client.owner(session) is None
            changes = client.watch_owners()
            first = await within("the watch's snapshot", changes.__anext__())
            assert first.kind in ("owner", "snapshot"), first
            async with client.own(session) as own:
                appended = await own.append(b"a", "b", bytearray(b"c"))
                assert appended.last_seq == appended.first_seq + 2
                assert await client.validate(session, own.epoch)
                assert not await client.validate(session, own.epoch - 1)
                owner = await client.owner(session)
                assert owner is not None and owner.epoch == own.epoch and owner.host_alive
                while True:
                    change = await within("the acquisition in the watch", changes.__anext__())
                    if change.kind == "acquired":
                        assert change.owner is not None and change.owner.session == str(session)
                        break
                trimmed = await own.trim(before=appended.last_seq)
                assert trimmed.base == appended.last_seq and trimmed.removed >= 2
                with pytest.raises(leasehold.Owned):
                    await client.delete(session)
                with pytest.raises(leasehold.Empty):
                    await own.append()
            await changes.aclose()
            records = [r async for r in client.replay(session, records=True)]
            assert [r.event for r in records] == [b"c"]
            assert not own.is_valid() and await own.wait_lost() == "released"
            with pytest.raises(leasehold.LeaseLost):
                await own.append(b"after the release")
            assert await client.delete(session) > 0
            assert [r async for r in client.replay(session)] == []

    asyncio.run(main())


def test_a_follower_sees_appends_as_they_commit(leasehold_sidecar: Sidecar) -> None:
    session = uuid.uuid4()

    async def main() -> None:
        async with leasehold.connect(leasehold_sidecar.address) as client:
            async with client.own(session) as own:
                followed: list[bytes] = []

                async def follow() -> None:
                    async for record in client.replay(session, follow=True):
                        if record.event is not None:
                            followed.append(record.event)
                        if len(followed) == 3:
                            return

                follower = asyncio.ensure_future(follow())
                for i in range(3):
                    await own.append(f"step {i}".encode())
                await within("the follower", follower)
                assert followed == [b"step 0", b"step 1", b"step 2"]

    asyncio.run(main())


def test_held_names_the_holder_and_a_wait_that_runs_out_says_so(
    leasehold_sidecar: Sidecar, leasehold_client: leasehold.SyncClient
) -> None:
    session = str(uuid.uuid4())
    with leasehold_client.own(session) as own:
        with leasehold.connect_sync(leasehold_sidecar.address) as other:
            with pytest.raises(leasehold.Held) as held:
                other.acquire(session)
            assert held.value.holder_epoch == own.epoch and held.value.retryable
            assert held.value.holder_node == leasehold_sidecar.node
            started = time.monotonic()
            with pytest.raises(leasehold.Held):
                other.acquire(session, wait=0.5)
            assert 0.4 < time.monotonic() - started < 5
        with pytest.raises(leasehold.LeaseholdError) as twice:
            leasehold_client.acquire(session)
        assert twice.value.reason == "ALREADY_OWNING"


def test_bad_input_is_refused_with_a_typed_error_before_anything_is_sent(
    leasehold_client: leasehold.SyncClient,
) -> None:
    with pytest.raises(leasehold.InvalidRequest):
        leasehold_client.acquire("not-a-uuid")
    with pytest.raises(leasehold.InvalidRequest):
        leasehold_client.acquire(str(uuid.uuid4()), wait=-1)
    with pytest.raises(leasehold.InvalidRequest):
        list(leasehold_client.replay("nope"))


def test_a_standby_takes_the_session_when_its_holder_lets_go(leasehold_sidecar: Sidecar) -> None:
    session = uuid.uuid4()

    async def main() -> None:
        async with leasehold.connect(leasehold_sidecar.address) as a, leasehold.connect(
            leasehold_sidecar.address
        ) as b:
            async with a.own(session) as first:
                standby = asyncio.ensure_future(b.acquire(session, wait=30.0))
                await asyncio.sleep(0.3)
                assert not standby.done()
            second = await within("the standby", standby)
            assert second.epoch > first.epoch
            await second.release()
            await second.release()  # idempotent

    asyncio.run(main())


def test_an_append_whose_retries_run_out_after_it_may_have_applied_is_outcome_unknown(
    leasehold_fault: FaultProxy, leasehold_sidecar: Sidecar
) -> None:
    """Its answers dropped until the retries run out: OutcomeUnknown (never Unavailable, which
    says nothing changed), naming the request id; the journal holds it once. The loss that
    came meanwhile (the client found the stream's connection dead) still cancels the block,
    though its body caught the error."""
    session = str(uuid.uuid4())
    # Longer than the client takes to find its connection dead (a ping unanswered for 5 s):
    # the loss comes while the append is still being retried.
    quick = leasehold.RetryPolicy(timeout=9.0, attempt_timeout=0.5)
    caught: list[leasehold.LeaseholdError] = []

    async def main() -> None:
        async with leasehold.connect(leasehold_fault.address, retry=quick) as client:
            with pytest.raises(leasehold.LeaseLost):
                async with client.own(session) as own:
                    await own.append(b"before")
                    leasehold_fault.drop_replies()
                    try:
                        await own.append(b"maybe")
                    except leasehold.LeaseholdError as error:
                        caught.append(error)
                    await asyncio.sleep(3600)  # the loss cancels this
        leasehold_fault.heal()

    asyncio.run(within("the test", main(), 30))
    (unknown,) = caught
    assert isinstance(unknown, leasehold.OutcomeUnknown), repr(unknown)
    assert unknown.request_id, unknown
    with leasehold.connect_sync(leasehold_sidecar.address) as reader:
        events = [r.event for r in reader.replay(session)]
    assert events == [b"before", b"maybe"], events


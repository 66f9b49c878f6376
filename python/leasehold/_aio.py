"""The asyncio client: :func:`connect`, :class:`Client` and :class:`Own`."""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import TYPE_CHECKING, Any, AsyncGenerator, AsyncIterator, Optional

import grpc
import grpc.aio

from . import _common
from ._common import RetryPolicy, SessionId, Tls
from ._errors import (
    Held,
    LeaseholdError,
    LeaseLost,
    OwnershipEnded,
    Unavailable,
    from_rpc_error,
)
from ._types import Appended, Owner, OwnerChange, Payload, Record, Trimmed
from .v1 import leasehold_pb2 as pb
from .v1 import leasehold_pb2_grpc as rpc

__all__ = ["connect", "Client", "Own"]

if TYPE_CHECKING:
    _Unary = grpc.aio.UnaryUnaryMultiCallable[Any, Any]

#: How long leaving an ``own`` block waits for the sidecar to confirm the release.
RELEASE_TIMEOUT = 10.0


def connect(
    address: str,
    *,
    tls: Optional[Tls] = None,
    retry: RetryPolicy = RetryPolicy(),
) -> Client:
    """A client of the sidecar at ``address`` (``host:port`` or ``unix:/path``); ``tls`` for a
    sidecar that serves TLS. Use it as ``async with leasehold.connect(...) as client``; the
    connection is made on the first call."""
    return Client(address, tls=tls, retry=retry)


class Client:
    """A client of ``leasehold serve``. Ownerships of one client share one ``Attach`` stream;
    every other call is a unary or server-streaming call on the same channel."""

    def __init__(
        self, address: str, *, tls: Optional[Tls] = None, retry: RetryPolicy = RetryPolicy()
    ) -> None:
        target = _common.target(address)
        options = _common.channel_options(target)
        self._channel = (
            grpc.aio.secure_channel(target, tls.credentials(), options=options)
            if tls is not None
            else grpc.aio.insecure_channel(target, options=options)
        )
        self._stub = rpc.LeaseholdStub(self._channel)
        self._retry = retry
        self._attachment: Optional[_Attachment] = None
        self.address = address

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Ends every ownership of this client (its stream ends: the sidecar releases them) and
        closes the channel."""
        if self._attachment is not None:
            await self._attachment.close()
        await self._channel.close()

    def own(self, session: SessionId, *, wait: Optional[float] = None) -> _Owning:
        """Owns ``session`` for an ``async with`` block: ``async with client.own(s) as own``.

        ``wait``: ``None`` tries once (:class:`Held` if someone else owns it); seconds to stand
        by for it (``math.inf``: until it is free). When the ownership is lost, the block's
        body is cancelled and the ``async with`` raises :class:`LeaseLost`: work never runs on
        past a loss. Leaving the block releases the session."""
        return _Owning(self, _common.session_id(session), wait)

    async def acquire(self, session: SessionId, *, wait: Optional[float] = None) -> Own:
        """Owns ``session`` until :meth:`Own.release`, without a block: nothing is cancelled on
        a loss; watch :attr:`Own.lost`, and :meth:`Own.append` raises :class:`LeaseLost`."""
        return await self._attach().acquire(_common.session_id(session), wait)

    def _attach(self) -> _Attachment:
        if self._attachment is None or self._attachment.ended is not None:
            self._attachment = _Attachment(self)
        return self._attachment

    async def replay(
        self,
        session: SessionId,
        *,
        from_seq: int = 0,
        records: bool = False,
        follow: bool = False,
    ) -> AsyncGenerator[Record, None]:
        """A session's journal from ``from_seq`` (its base if 0) at one etcd revision: events,
        and with ``records`` the owners' fences too; with ``follow``, then what is appended
        later, until the caller stops iterating."""
        request = pb.ReplayRequest(
            session=_common.session_id(session), from_seq=from_seq, records=records, follow=follow
        )
        call = self._stub.Replay(request)
        try:
            async for message in call:
                yield Record._from(message)
        except grpc.aio.AioRpcError as error:
            raise from_rpc_error(error) from None
        finally:
            call.cancel()

    async def validate(self, session: SessionId, epoch: int) -> bool:
        """Whether ``epoch`` is ``session``'s current owner's, from a linearizable read in etcd."""
        request = pb.ValidateRequest(session=_common.session_id(session), epoch=epoch)
        response = await self._unary(self._stub.Validate, request)
        return bool(response.current)

    async def owner(self, session: SessionId) -> Optional[Owner]:
        """``session``'s owner as the sidecar's owner directory knows it; ``None`` if nobody
        owns it."""
        request = pb.OwnerRequest(session=_common.session_id(session))
        response = await self._unary(self._stub.Owner, request)
        return Owner._from(response.owner) if response.HasField("owner") else None

    async def watch_owners(self) -> AsyncGenerator[OwnerChange, None]:
        """Every owner now, a ``snapshot`` change, then every change of ownership, until the
        caller stops iterating."""
        call = self._stub.WatchOwners(pb.WatchOwnersRequest())
        try:
            async for message in call:
                yield OwnerChange._from(message)
        except grpc.aio.AioRpcError as error:
            raise from_rpc_error(error) from None
        finally:
            call.cancel()

    async def delete(self, session: SessionId) -> int:
        """Deletes the journal of a finished session that nobody owns (:class:`Owned` if
        someone does); the number of keys deleted, 0 if there was no journal."""
        request = pb.DeleteRequest(session=_common.session_id(session))
        response = await self._unary(self._stub.Delete, request)
        return int(response.keys)

    async def _unary(self, method: _Unary, request: object) -> Any:
        """A read-only or idempotent call, sent again as the retry policy says."""
        return await self._retrying(method, request, request_id=None)

    async def _retrying(self, method: _Unary, request: object, request_id: Optional[str]) -> Any:
        """``method(request)``, sent again (the same request) as the retry policy says; each
        attempt within the time left. ``request_id``: an append's, which the error names."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            return await method(request, timeout=self._retry.attempt_timeout)
        except grpc.aio.AioRpcError as failure:
            last = failure
        # Failed once: again, as the retry policy says (the first attempt costs nothing more).
        retry = _common.Retry(self._retry, started, request_id)
        while True:
            await asyncio.sleep(retry.after(last, loop.time()))
            try:
                return await method(request, timeout=retry.timeout)
            except grpc.aio.AioRpcError as failure:
                last = failure


class _Owning:
    """``client.own(...)``: an ``async with`` that owns a session for its block."""

    def __init__(self, client: Client, session: str, wait: Optional[float]) -> None:
        self._client = client
        self._session = session
        self._wait = wait
        self._own: Optional[Own] = None

    async def __aenter__(self) -> Own:
        own = await self._client._attach().acquire(self._session, self._wait)
        own._enter(asyncio.current_task())
        self._own = own
        return own

    async def __aexit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> Optional[bool]:
        own = self._own
        assert own is not None
        if own._cancelled and exc_type is not asyncio.CancelledError:
            # The loss's cancel never reached the body (it ended, or raised, first): take it
            # here, so that it does not land on the caller's next await.
            try:
                await asyncio.sleep(0)
            except asyncio.CancelledError:
                pass
        cancelled_by_loss = own._exit(exc)
        if own.loss is None:
            await own.release()
            return None
        if exc_type is asyncio.CancelledError:
            if cancelled_by_loss:
                raise own._lost_error() from None
            return None  # cancelled by someone else too: that goes on
        if exc is not None:
            return None  # the body's own exception (a LeaseLost of an append, say)
        raise own._lost_error()


class Own(_common.Ownership):
    """One ownership of a session: its epoch, its journal's tip when it was fenced, and its
    writes. Everything written through it carries the ownership's token, which never leaves it."""

    def __init__(
        self, attachment: _Attachment, session: str, acquired: pb.Acquired
    ) -> None:
        super().__init__(session, acquired)
        self._attachment = attachment
        #: Set when the ownership ends (lost or released).
        self.lost = asyncio.Event()
        self._task: Optional[asyncio.Task[object]] = None
        self._in_flight = 0
        self._cancelled = False

    def is_valid(self) -> bool:
        """Whether the ownership still holds, as far as this client knows."""
        return not self.lost.is_set()

    async def append(self, *payloads: Payload, request_id: Optional[str] = None) -> Appended:
        """Appends ``payloads`` (bytes, or str as UTF-8) to the journal, all or none.

        The request id (one is made when not given) makes the append exactly-once: it is sent
        again under the same id after ``UNAVAILABLE`` or no answer, and the sidecar answers a
        repeat from the journal. Raises :class:`LeaseLost` once the ownership is lost,
        :class:`Fenced`/:class:`NotHolder` if etcd or the sidecar refuse it, and
        :class:`Unavailable`/:class:`OutcomeUnknown` only when the retries ran out (or the
        sidecar says it cannot know)."""
        request = self._append_request(payloads, request_id)
        client = self._attachment.client
        # An append of the block's own task defers the loss's cancel until it is answered, so
        # that its outcome is told; one of another task does not hold the block up.
        in_block = self._task is not None and asyncio.current_task() is self._task
        self._in_flight += in_block
        try:
            response = await client._retrying(client._stub.Append, request, request.request_id)
            return Appended._from(response)
        except OwnershipEnded as error:
            self._lose(self._loss_of(error))
            raise
        finally:
            self._in_flight -= in_block
            if self._in_flight == 0:
                self._cancel_if_lost()

    async def trim(self, *, before: int) -> Trimmed:
        """Removes the journal's records before ``before`` (the last record is always kept)."""
        request = self._trim_request(before)
        client = self._attachment.client
        try:
            response = await client._retrying(client._stub.Trim, request, None)
        except OwnershipEnded as error:
            self._lose(self._loss_of(error))
            raise
        return Trimmed(int(response.base), int(response.removed))

    async def release(self) -> None:
        """Releases the session (idempotent): others may own it at once."""
        if self._released or self.loss is not None:
            return
        self._released = True
        self.lost.set()
        await self._attachment.release(self.session)

    async def wait_lost(self) -> str:
        """Waits until the ownership ends; why (``released`` if it was released)."""
        await self.lost.wait()
        return self.loss or "released"

    # --- the attachment's and the block's side

    def _lose(self, reason: str) -> None:
        if self.loss is not None or self._released:
            return
        self.loss = reason
        self.lost.set()
        self._attachment.forget(self.session, self)
        if self._in_flight == 0:
            self._cancel_if_lost()

    def _cancel_message(self) -> str:
        return f"leasehold: lost {self.session} at epoch {self.epoch}"

    def _cancel_if_lost(self) -> None:
        if self.loss is not None and self._task is not None and not self._cancelled:
            self._cancelled = True
            self._task.cancel(msg=self._cancel_message())

    def _enter(self, task: Optional[asyncio.Task[object]]) -> None:
        self._task = task
        self._cancel_if_lost()

    def _exit(self, exc: Optional[BaseException]) -> bool:
        """Leaves the block, which ended with ``exc``; whether it was cancelled for the loss
        alone (that cancel is taken back; one from elsewhere goes on)."""
        task, self._task = self._task, None
        if not self._cancelled or task is None:
            return False
        uncancel = getattr(task, "uncancel", None)  # Python 3.11+
        if uncancel is not None:
            return bool(uncancel() == 0)
        # Python 3.10 counts no cancels: the loss's is the one that carries its message.
        return isinstance(exc, asyncio.CancelledError) and exc.args[:1] == (self._cancel_message(),)


class _Attachment:
    """One ``Attach`` stream: the ownerships of a client. Events are routed by session; when
    the stream ends, every ownership on it is lost (the sidecar releases them)."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self._requests: asyncio.Queue[Optional[pb.AttachRequest]] = asyncio.Queue()
        self._acquiring: dict[str, asyncio.Future[pb.AttachResponse]] = {}
        self._releasing: dict[str, asyncio.Future[None]] = {}
        self._owns: dict[str, Own] = {}
        #: Why the stream ended, once it has.
        self.ended: Optional[LeaseholdError] = None
        self._call = client._stub.Attach(self._outgoing())
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def _outgoing(self) -> AsyncIterator[pb.AttachRequest]:
        while True:
            request = await self._requests.get()
            if request is None:
                return
            yield request

    async def acquire(self, session: str, wait: Optional[float]) -> Own:
        if self.ended is not None:
            raise self.ended
        if session in self._acquiring or session in self._owns:
            raise LeaseholdError(
                f"this client owns or is acquiring {session} already", reason="ALREADY_OWNING"
            )
        stand_by, wait_ms = _common.wait_fields(wait)
        # A release of this session still under way (an acquire given up, say): its answer
        # first, so that it is not taken for this acquire's.
        releasing = self._releasing.get(session)
        if releasing is not None:
            await asyncio.wait({releasing}, timeout=RELEASE_TIMEOUT)
        if self.ended is not None:
            raise self.ended
        answer: asyncio.Future[pb.AttachResponse] = asyncio.get_running_loop().create_future()
        self._acquiring[session] = answer
        self._requests.put_nowait(
            pb.AttachRequest(acquire=pb.Acquire(session=session, wait=stand_by, wait_ms=wait_ms))
        )
        try:
            response = await answer
        except asyncio.CancelledError:
            # Stop standing by; an ownership it brings after all is released when it arrives.
            self._acquiring.pop(session, None)
            if self.ended is None:
                gone: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                self._releasing.setdefault(session, gone)
                self._requests.put_nowait(pb.AttachRequest(release=pb.Release(session=session)))
            raise
        event = response.WhichOneof("event")
        if event == "acquired":
            own = Own(self, session, response.acquired)
            self._owns[session] = own
            return own
        if event == "held":
            held = response.held
            raise Held(session, int(held.holder_epoch), held.holder_node)
        raise _common.failed_error(response.failed)

    async def release(self, session: str) -> None:
        self._owns.pop(session, None)
        if self.ended is not None:
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done = self._releasing.setdefault(session, done)
        self._requests.put_nowait(pb.AttachRequest(release=pb.Release(session=session)))
        await asyncio.wait({done}, timeout=RELEASE_TIMEOUT)

    def forget(self, session: str, own: Own) -> None:
        if self._owns.get(session) is own:
            del self._owns[session]

    async def close(self) -> None:
        self._requests.put_nowait(None)
        self._call.cancel()
        await asyncio.wait({self._reader}, timeout=RELEASE_TIMEOUT)

    async def _read(self) -> None:
        ended: LeaseholdError
        try:
            async for response in self._call:
                self._route(response)
            ended = LeaseLost("the sidecar ended the ownership stream", loss="stream_ended")
        except grpc.aio.AioRpcError as error:
            cause = from_rpc_error(error)
            ended = (
                cause
                if not isinstance(cause, Unavailable)
                else LeaseLost(f"the ownership stream broke: {cause}", loss="stream_ended")
            )
        except asyncio.CancelledError:
            ended = LeaseLost("the client was closed", loss="stream_ended")
        finally:
            # The sender ends too (gRPC stops it only on a cancel of our own).
            self._requests.put_nowait(None)
            self._call.cancel()
        self.ended = ended
        failure = ended if not isinstance(ended, LeaseLost) else Unavailable(str(ended))
        for answer in self._acquiring.values():
            if not answer.done():
                answer.set_exception(failure)
        self._acquiring.clear()
        for done in self._releasing.values():
            if not done.done():
                done.set_result(None)
        self._releasing.clear()
        for own in list(self._owns.values()):
            own._lose("stream_ended")
        self._owns.clear()

    def _route(self, response: pb.AttachResponse) -> None:
        event = response.WhichOneof("event")
        if event in ("acquired", "held", "failed"):
            session = getattr(response, event).session
            answer = self._acquiring.pop(session, None)
            if answer is not None and not answer.done():
                answer.set_result(response)
            elif event == "acquired":
                # Nobody waits for it any more (the caller gave up): give it back.
                self._requests.put_nowait(pb.AttachRequest(release=pb.Release(session=session)))
        elif event == "lost":
            own = self._owns.pop(response.lost.session, None)
            if own is not None and own.epoch == response.lost.epoch:
                own._lose(response.lost.reason or "lost")
            elif own is not None:
                self._owns[own.session] = own
        elif event == "released":
            session = response.released.session
            done = self._releasing.pop(session, None)
            if done is not None and not done.done():
                done.set_result(None)
            own = self._owns.pop(session, None)
            if own is not None:
                own._lose("released")



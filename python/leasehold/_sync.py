"""The blocking client: :func:`connect_sync`, :class:`SyncClient` and :class:`SyncOwn`, with
the same names and rules as the asyncio one, for code that runs in threads."""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generator, Optional

import grpc

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

__all__ = ["connect_sync", "SyncClient", "SyncOwn"]

RELEASE_TIMEOUT = 10.0

if TYPE_CHECKING:
    _Unary = grpc.UnaryUnaryMultiCallable[Any, Any]


def connect_sync(
    address: str, *, tls: Optional[Tls] = None, retry: RetryPolicy = RetryPolicy()
) -> SyncClient:
    """A blocking client of the sidecar at ``address``: ``with leasehold.connect_sync(...)``."""
    return SyncClient(address, tls=tls, retry=retry)


class SyncClient:
    """The blocking client of ``leasehold serve``: :class:`leasehold.Client`'s calls, blocking.
    Safe to share between threads."""

    def __init__(
        self, address: str, *, tls: Optional[Tls] = None, retry: RetryPolicy = RetryPolicy()
    ) -> None:
        target = _common.target(address)
        options = _common.channel_options(target)
        self._channel = (
            grpc.secure_channel(target, tls.credentials(), options=options)
            if tls is not None
            else grpc.insecure_channel(target, options=options)
        )
        self._stub = rpc.LeaseholdStub(self._channel)
        self._retry = retry
        self._attachment: Optional[_SyncAttachment] = None
        self._lock = threading.Lock()
        self.address = address

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.close()

    def close(self) -> None:
        """Ends every ownership of this client and closes the channel."""
        with self._lock:
            attachment, self._attachment = self._attachment, None
        if attachment is not None:
            attachment.close()
        self._channel.close()

    def own(self, session: SessionId, *, wait: Optional[float] = None) -> SyncOwn:
        """Owns ``session`` for a ``with`` block (see :meth:`leasehold.Client.own`). A thread
        cannot be cancelled: watch :attr:`SyncOwn.lost` (a ``threading.Event``); every write
        raises :class:`LeaseLost` after a loss, and so does leaving the block."""
        return self.acquire(session, wait=wait)

    def acquire(self, session: SessionId, *, wait: Optional[float] = None) -> SyncOwn:
        """Owns ``session`` until :meth:`SyncOwn.release`."""
        return self._attach().acquire(_common.session_id(session), wait)

    def _attach(self) -> _SyncAttachment:
        with self._lock:
            if self._attachment is None or self._attachment.ended is not None:
                self._attachment = _SyncAttachment(self)
            return self._attachment

    def replay(
        self,
        session: SessionId,
        *,
        from_seq: int = 0,
        records: bool = False,
        follow: bool = False,
    ) -> Generator[Record, None, None]:
        """A session's journal (see :meth:`leasehold.Client.replay`)."""
        request = pb.ReplayRequest(
            session=_common.session_id(session), from_seq=from_seq, records=records, follow=follow
        )
        call = self._stub.Replay(request)
        try:
            for message in call:
                yield Record._from(message)
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None
        finally:
            call.cancel()

    def validate(self, session: SessionId, epoch: int) -> bool:
        """Whether ``epoch`` is ``session``'s current owner's."""
        request = pb.ValidateRequest(session=_common.session_id(session), epoch=epoch)
        return bool(self._retrying(self._stub.Validate, request, None).current)

    def owner(self, session: SessionId) -> Optional[Owner]:
        """``session``'s owner; ``None`` if nobody owns it."""
        response = self._retrying(
            self._stub.Owner, pb.OwnerRequest(session=_common.session_id(session)), None
        )
        return Owner._from(response.owner) if response.HasField("owner") else None

    def watch_owners(self) -> Generator[OwnerChange, None, None]:
        """Every owner now, a ``snapshot`` change, then every change (see the asyncio client)."""
        call = self._stub.WatchOwners(pb.WatchOwnersRequest())
        try:
            for message in call:
                yield OwnerChange._from(message)
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None
        finally:
            call.cancel()

    def delete(self, session: SessionId) -> int:
        """Deletes a finished session's journal; the number of keys deleted."""
        request = pb.DeleteRequest(session=_common.session_id(session))
        return int(self._retrying(self._stub.Delete, request, None).keys)

    def _retrying(self, method: _Unary, request: object, request_id: Optional[str]) -> Any:
        started = time.monotonic()
        try:
            return method(request, timeout=self._retry.attempt_timeout)
        except grpc.RpcError as failure:
            last = failure
        retry = _common.Retry(self._retry, started, request_id)
        while True:
            time.sleep(retry.after(last, time.monotonic()))
            try:
                return method(request, timeout=retry.timeout)
            except grpc.RpcError as failure:
                last = failure


class SyncOwn(_common.Ownership):
    """One ownership of a session (see :class:`leasehold.Own`); :attr:`lost` is a
    ``threading.Event``."""

    def __init__(self, attachment: _SyncAttachment, session: str, acquired: pb.Acquired) -> None:
        super().__init__(session, acquired)
        self._attachment = attachment
        #: Set when the ownership ends (lost or released).
        self.lost = threading.Event()

    def __enter__(self) -> SyncOwn:
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        if self.loss is None:
            self.release()
        elif exc is None:
            raise self._lost_error()

    def is_valid(self) -> bool:
        """Whether the ownership still holds, as far as this client knows."""
        return not self.lost.is_set()

    def wait_lost(self, timeout: Optional[float] = None) -> Optional[str]:
        """Waits until the ownership ends (at most ``timeout`` s); why (``released`` if it was
        released), or ``None`` if it still holds."""
        if not self.lost.wait(timeout):
            return None
        return self.loss or "released"

    def append(self, *payloads: Payload, request_id: Optional[str] = None) -> Appended:
        """Appends ``payloads`` to the journal, exactly once (see :meth:`leasehold.Own.append`)."""
        request = self._append_request(payloads, request_id)
        client = self._attachment.client
        try:
            response = client._retrying(client._stub.Append, request, request.request_id)
        except OwnershipEnded as error:
            self._lose(self._loss_of(error))
            raise
        return Appended._from(response)

    def trim(self, *, before: int) -> Trimmed:
        """Removes the journal's records before ``before``."""
        request = self._trim_request(before)
        client = self._attachment.client
        try:
            response = client._retrying(client._stub.Trim, request, None)
        except OwnershipEnded as error:
            self._lose(self._loss_of(error))
            raise
        return Trimmed(int(response.base), int(response.removed))

    def release(self) -> None:
        """Releases the session (idempotent)."""
        if self._released or self.loss is not None:
            return
        self._released = True
        self.lost.set()
        self._attachment.release(self.session)

    def _lose(self, reason: str) -> None:
        if self.loss is not None or self._released:
            return
        self.loss = reason
        self.lost.set()
        self._attachment.forget(self.session, self)


class _SyncAttachment:
    """One ``Attach`` stream, read by a thread of its own (see the asyncio client's)."""

    def __init__(self, client: SyncClient) -> None:
        self.client = client
        self._requests: queue.Queue[Optional[pb.AttachRequest]] = queue.Queue()
        self._lock = threading.Lock()
        self._acquiring: dict[str, Future[pb.AttachResponse]] = {}
        self._releasing: dict[str, Future[None]] = {}
        self._owns: dict[str, SyncOwn] = {}
        self.ended: Optional[LeaseholdError] = None
        self._call = client._stub.Attach(iter(self._requests.get, None))
        self._reader = threading.Thread(
            target=self._read, name="leasehold-attach", daemon=True
        )
        self._reader.start()

    def acquire(self, session: str, wait: Optional[float]) -> SyncOwn:
        stand_by, wait_ms = _common.wait_fields(wait)
        answer: Future[pb.AttachResponse] = Future()
        with self._lock:
            releasing = self._releasing.get(session)
        if releasing is not None:
            # A release of this session still under way: its answer first (see the asyncio
            # client's).
            try:
                releasing.result(timeout=RELEASE_TIMEOUT)
            except FutureTimeout:
                pass
        with self._lock:
            if self.ended is not None:
                raise self.ended
            if session in self._acquiring or session in self._owns:
                raise LeaseholdError(
                    f"this client owns or is acquiring {session} already",
                    reason="ALREADY_OWNING",
                )
            self._acquiring[session] = answer
        self._requests.put(
            pb.AttachRequest(acquire=pb.Acquire(session=session, wait=stand_by, wait_ms=wait_ms))
        )
        try:
            response = answer.result()
        except BaseException:
            # Interrupted (or the stream ended): stop standing by; an ownership it brings after
            # all is released when it arrives.
            with self._lock:
                self._acquiring.pop(session, None)
                ended = self.ended is not None
                if not ended:
                    self._releasing.setdefault(session, Future())
            if not ended:
                self._requests.put(pb.AttachRequest(release=pb.Release(session=session)))
            raise
        event = response.WhichOneof("event")
        if event == "acquired":
            own = SyncOwn(self, session, response.acquired)
            with self._lock:
                self._owns[session] = own
            return own
        if event == "held":
            raise Held(session, int(response.held.holder_epoch), response.held.holder_node)
        raise _common.failed_error(response.failed)

    def release(self, session: str) -> None:
        with self._lock:
            self._owns.pop(session, None)
            if self.ended is not None:
                return
            done = self._releasing.setdefault(session, Future())
        self._requests.put(pb.AttachRequest(release=pb.Release(session=session)))
        try:
            done.result(timeout=RELEASE_TIMEOUT)
        except FutureTimeout:
            pass

    def forget(self, session: str, own: SyncOwn) -> None:
        with self._lock:
            if self._owns.get(session) is own:
                del self._owns[session]

    def close(self) -> None:
        self._requests.put(None)
        self._call.cancel()
        self._reader.join(timeout=5)

    def _read(self) -> None:
        ended: LeaseholdError
        try:
            for response in self._call:
                self._route(response)
            ended = LeaseLost("the sidecar ended the ownership stream", loss="stream_ended")
        except grpc.RpcError as error:
            cause = from_rpc_error(error)
            ended = (
                cause
                if not isinstance(cause, Unavailable)
                else LeaseLost(f"the ownership stream broke: {cause}", loss="stream_ended")
            )
        finally:
            # The sender ends too (gRPC stops it only on a cancel of our own).
            self._requests.put(None)
        with self._lock:
            self.ended = ended
            acquiring, self._acquiring = self._acquiring, {}
            releasing, self._releasing = self._releasing, {}
            owns, self._owns = self._owns, {}
        failure = ended if not isinstance(ended, LeaseLost) else Unavailable(str(ended))
        for answer in acquiring.values():
            if not answer.done():
                answer.set_exception(failure)
        for done in releasing.values():
            if not done.done():
                done.set_result(None)
        for own in owns.values():
            own._lose("stream_ended")

    def _route(self, response: pb.AttachResponse) -> None:
        event = response.WhichOneof("event")
        if event in ("acquired", "held", "failed"):
            session = getattr(response, event).session
            with self._lock:
                answer = self._acquiring.pop(session, None)
            if answer is not None:
                answer.set_result(response)
            elif event == "acquired":
                self._requests.put(pb.AttachRequest(release=pb.Release(session=session)))
        elif event == "lost":
            with self._lock:
                own = self._owns.get(response.lost.session)
            if own is not None and own.epoch == response.lost.epoch:
                own._lose(response.lost.reason or "lost")
        elif event == "released":
            session = response.released.session
            with self._lock:
                done = self._releasing.pop(session, None)
                own = self._owns.get(session)
            if done is not None and not done.done():
                done.set_result(None)
            if own is not None:
                own._lose("released")

"""What the asyncio and the blocking clients share: addresses, TLS, retries, request fields."""

from __future__ import annotations

import math
import random
import uuid
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence, Union

import grpc

from ._errors import (
    REASONS,
    Empty,
    InvalidRequest,
    LeaseholdError,
    LeaseLost,
    OutcomeUnknown,
    OwnershipEnded,
    Unavailable,
    error_info,
    from_rpc_error,
)
from ._types import Payload, payload_bytes
from .v1 import leasehold_pb2 as pb

SessionId = Union[str, uuid.UUID]


@dataclass(frozen=True)
class Tls:
    """TLS towards the sidecar (``leasehold serve --listen-cert/--listen-key``): the CA that
    signed its certificate (``None``: the system's roots), and a client certificate and key,
    for a sidecar that asks for one (``--listen-client-ca``). PEM bytes."""

    root_certificates: Optional[bytes] = None
    certificate_chain: Optional[bytes] = None
    private_key: Optional[bytes] = None

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.root_certificates,
            private_key=self.private_key,
            certificate_chain=self.certificate_chain,
        )


@dataclass(frozen=True)
class RetryPolicy:
    """How an append (or a read) is sent again after ``UNAVAILABLE`` or no answer in time,
    always under its first request id: for up to ``timeout`` seconds in all, each attempt
    within ``attempt_timeout``, pausing ``initial`` seconds (doubling to ``maximum``, with
    jitter, and never less than the sidecar's ``RetryInfo`` asks) between attempts."""

    timeout: float = 30.0
    attempt_timeout: float = 10.0
    initial: float = 0.05
    maximum: float = 2.0

    def pauses(self, *, seed: Optional[int] = None) -> Iterator[float]:
        """The pauses between attempts: growing, jittered in [p, 1.5 p), bounded."""
        rng = random.Random(seed)
        pause = self.initial
        while True:
            yield pause * (1 + rng.random() / 2)
            pause = min(pause * 2, self.maximum)


#: gRPC channel options. HTTP/2 pings: every 10 s while nothing is received, and any ping
#: (gRPC's flow-control probes too) unanswered for 5 s closes the connection, so that a client
#: learns within some 15 s that a connection stopped answering (and the ownerships on it ended:
#: the sidecar ends them sooner, at its `--client-keepalive`). Messages as large as the sidecar
#: takes.
CHANNEL_OPTIONS: Sequence[tuple[str, int]] = (
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.http2.min_time_between_pings_ms", 1_000),
    ("grpc.http2.ping_timeout_ms", 5_000),
    ("grpc.max_receive_message_length", 16 * 1024 * 1024),
    ("grpc.max_send_message_length", 16 * 1024 * 1024),
)


def channel_options(target: str) -> list[tuple[str, object]]:
    """The channel options for ``target``. gRPC's C core sends a Unix socket's path as the
    ``:authority``, which the sidecar's HTTP/2 server refuses as malformed: such a channel
    names ``localhost`` instead."""
    options: list[tuple[str, object]] = list(CHANNEL_OPTIONS)
    if target.startswith("unix:"):
        options.append(("grpc.default_authority", "localhost"))
    return options


def target(address: str) -> str:
    """A gRPC target from an address: ``host:port``, ``unix:/path``, ``http://host:port``."""
    for scheme in ("http://", "https://"):
        if address.startswith(scheme):
            return address[len(scheme) :].rstrip("/")
    return address


def session_id(session: SessionId) -> str:
    """A session's id as the sidecar takes it; :class:`InvalidRequest` if it is no UUID."""
    if isinstance(session, uuid.UUID):
        return str(session)
    try:
        return str(uuid.UUID(session))
    except (ValueError, TypeError, AttributeError):
        raise InvalidRequest(f"session {session!r} is not a UUID", reason="INVALID_SESSION") from None


def wait_fields(wait: Optional[float]) -> tuple[bool, int]:
    """``Acquire.wait`` and ``wait_ms`` for a wait in seconds: ``None`` tries once; ``math.inf``
    waits until the session is free."""
    if wait is None:
        return False, 0
    if wait < 0 or math.isnan(wait):
        raise InvalidRequest(f"wait {wait} is not a duration", reason="INVALID_WAIT")
    if math.isinf(wait):
        return True, 0
    return True, max(1, min(int(wait * 1000), 2**32 - 1))


def new_request_id() -> str:
    """A fresh request id: 32 hex digits, random."""
    return uuid.uuid4().hex


def attempt_error(failure: grpc.RpcError) -> LeaseholdError:
    """A failed attempt's error. No answer within the attempt's timeout is :class:`Unavailable`
    (the next attempt, under the same request id, learns what it came to)."""
    error = from_rpc_error(failure)
    if error.code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return Unavailable(error.message or "no answer in time", code=error.code)
    return error


def retried(error: LeaseholdError) -> bool:
    """Whether a call that failed with ``error`` is sent again (the same request, an append
    under the same request id): when the sidecar or etcd was unavailable, or the sidecar does
    not know an append's outcome yet (not when the journal lost the evidence for good:
    metadata ``gone``)."""
    if isinstance(error, OutcomeUnknown):
        return "gone" not in error.metadata
    return isinstance(error, Unavailable)


def unclear(error: LeaseholdError) -> bool:
    """Whether an attempt that failed with ``error`` may have applied: no answer, a broken
    connection, or an outcome the sidecar does not know yet. (etcd's refusal, with reason
    ``ETCD_UNAVAILABLE``, applied nothing.)"""
    if isinstance(error, OutcomeUnknown):
        return True
    return isinstance(error, Unavailable) and error.reason != "ETCD_UNAVAILABLE"


class Retry:
    """A call's attempts after its first failed, under ``policy`` (both clients' loops): the
    pause before each, its timeout, and the error raised when none follows."""

    def __init__(self, policy: RetryPolicy, started: float, request_id: Optional[str]) -> None:
        self._policy = policy
        self._give_up = started + policy.timeout
        self._request_id = request_id
        self._pauses = policy.pauses()
        self._attempts = 1
        self._unclear = False
        #: The next attempt's timeout: the policy's, within the time left.
        self.timeout = policy.attempt_timeout

    def after(self, failure: grpc.RpcError, now: float) -> float:
        """The pause before the next attempt, after one that failed with ``failure`` at
        ``now``; raises the call's final error when there is none (see :func:`final`)."""
        error = attempt_error(failure)
        self._unclear = self._unclear or unclear(error)
        _, _, asked = error_info(failure)
        pause = max(next(self._pauses), asked or 0.0)
        left = self._give_up - now - pause
        if not retried(error) or left <= 0:
            raise final(error, self._request_id, self._attempts, self._unclear) from None
        self._attempts += 1
        self.timeout = min(self._policy.attempt_timeout, left)
        return pause


def final(
    error: LeaseholdError, request: Optional[str], attempts: int, maybe_applied: bool
) -> LeaseholdError:
    """What a call raises when it is not sent again: ``error``, or, once its retries ran out,
    :class:`OutcomeUnknown` for an append some attempt of which may have applied (appending
    again under ``request`` answers whether it did, and never appends twice) and
    :class:`Unavailable` for anything else."""
    if retried(error):
        kind = OutcomeUnknown if request is not None and maybe_applied else Unavailable
        note = f" (retries ran out after {attempts} attempts"
        if request is not None:
            note += (
                f" under request id {request}; appending again with that id answers whether"
                " it committed, and never appends twice"
            )
        error = kind(error.message + note + ")", reason=error.reason, metadata=error.metadata, code=error.code)
    error.request_id = request
    return error


def failed_error(failed: pb.Failed) -> LeaseholdError:
    """The exception for an acquisition answered ``Failed``: retryable ones are
    :class:`Unavailable` (etcd failed, or the sidecar's node lease is not valid; a journal lost
    while it was being fenced) unless their reason has a retryable class of its own."""
    kind = REASONS.get(failed.reason, Unavailable)
    if failed.retryable and not kind.retryable:
        kind = Unavailable
    return kind(failed.message, reason=failed.reason, metadata={"session": failed.session})


class Ownership:
    """What an ownership of either client holds and checks: its epoch, its journal's tip when
    it was fenced, its token (which never leaves it), and how it ended."""

    def __init__(self, session: str, acquired: pb.Acquired) -> None:
        #: The session.
        self.session = session
        #: The epoch: the owner key's create revision in etcd; it increases across owners.
        self.epoch = int(acquired.epoch)
        #: The journal's last sequence number when this ownership fenced it.
        self.tip_seq = int(acquired.tip_seq)
        self._token = bytes(acquired.token)
        #: Why it was lost (``None`` while it holds, or once released).
        self.loss: Optional[str] = None
        self._released = False

    def __repr__(self) -> str:
        ended = self.loss is not None or self._released
        state = f"lost ({self.loss})" if self.loss else "released" if ended else "holding"
        return f"{type(self).__name__}(session={self.session!r}, epoch={self.epoch}, {state})"

    def _holding(self) -> None:
        """Raises :class:`LeaseLost` once the ownership has ended."""
        if self.loss is not None or self._released:
            raise self._lost_error()

    def _append_request(
        self, payloads: tuple[Payload, ...], request_id: Optional[str]
    ) -> pb.AppendRequest:
        """The append of ``payloads`` under this ownership (a fresh request id if none)."""
        self._holding()
        if not payloads:
            raise Empty("an append needs at least one record", reason="EMPTY")
        return pb.AppendRequest(
            session=self.session,
            epoch=self.epoch,
            payloads=[payload_bytes(p) for p in payloads],
            request_id=request_id or new_request_id(),
            token=self._token,
        )

    def _trim_request(self, before: int) -> pb.TrimRequest:
        self._holding()
        return pb.TrimRequest(
            session=self.session, epoch=self.epoch, token=self._token, before=before
        )

    @staticmethod
    def _loss_of(error: OwnershipEnded) -> str:
        """The loss a write refused as ``error`` tells of."""
        return error.metadata.get("loss") or error.reason.lower() or "fenced"

    def _lost_error(self) -> LeaseLost:
        return LeaseLost(
            f"session {self.session} at epoch {self.epoch} is no longer owned",
            loss=self.loss or "released",
            metadata={"session": self.session, "epoch": str(self.epoch)},
        )

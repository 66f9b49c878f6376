"""leasehold's exceptions: one per reason the sidecar gives, all under :class:`LeaseholdError`.

The sidecar answers a refused call with a gRPC status whose ``google.rpc.ErrorInfo`` (domain
``leasehold``) names the reason; :func:`from_rpc_error` turns that into the exception of this
module for it. Each class says whether retrying helps (:attr:`LeaseholdError.retryable`).

The one rule: after :class:`LeaseLost`, :class:`Fenced`, :class:`NotOwner` or
:class:`NotHolder` for a session, stop acting on it; own it again and replay its journal.
"""

from __future__ import annotations

from typing import ClassVar, Mapping, Optional

import grpc
import grpc.aio

__all__ = [
    "LeaseholdError",
    "OwnershipEnded",
    "Held",
    "Fenced",
    "LeaseLost",
    "NotOwner",
    "NotHolder",
    "OutcomeUnknown",
    "Unavailable",
    "InvalidRequest",
    "TooLarge",
    "TooManyRecords",
    "Empty",
    "SequenceExhausted",
    "PermissionDenied",
    "BeyondTip",
    "Owned",
    "Undecodable",
    "Compacted",
    "ResourceExhausted",
    "Internal",
    "REASONS",
    "from_rpc_error",
]


class LeaseholdError(Exception):
    """Anything leasehold refused or could not do.

    ``reason`` is the sidecar's ``ErrorInfo`` reason (or a reason of this package's own, for
    what it decides locally), ``metadata`` the ``ErrorInfo`` metadata (``session``, ``epoch``,
    ``owner_epoch``, ``loss``, where known), ``code`` the gRPC status code, if there was one.
    """

    #: Whether the same call may succeed if made again later.
    retryable: ClassVar[bool] = False

    def __init__(
        self,
        message: str,
        *,
        reason: str = "",
        metadata: Optional[Mapping[str, str]] = None,
        code: Optional[grpc.StatusCode] = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason
        self.metadata: dict[str, str] = dict(metadata or {})
        self.code = code
        #: For an append: the request id it was sent under (append again with it to learn
        #: whether it committed).
        self.request_id: Optional[str] = None

    def __str__(self) -> str:
        return f"{self.reason}: {self.message}" if self.reason else self.message


class OwnershipEnded(LeaseholdError):
    """The ownership a call was made under is over: another owner may act on the session now.

    Never retry: own the session again and replay its journal.
    """


class Held(LeaseholdError):
    """Someone else owns the session (a try, or a wait that ran out). Retrying later may succeed.

    ``holder_epoch`` and ``holder_node`` name the owner.
    """

    retryable = True

    def __init__(self, session: str, holder_epoch: int, holder_node: str) -> None:
        super().__init__(
            f"session {session} is held at epoch {holder_epoch}"
            + (f" by {holder_node}" if holder_node else ""),
            reason="HELD",
            metadata={"session": session},
        )
        self.session = session
        self.holder_epoch = holder_epoch
        self.holder_node = holder_node


class Fenced(OwnershipEnded):
    """The epoch is not the session's current one: a newer owner fenced it. Never retry."""


class LeaseLost(OwnershipEnded):
    """The ownership was lost; ``loss`` says why (``released``, ``revoked``, ``overtaken``,
    ``expired``, ``keepalive_failed``, ``store_closed``, ``permission_denied``,
    ``journal_broken``, or this package's ``stream_ended``: the ownership's stream to the
    sidecar broke, which ends it). Never retry: own the session again."""

    def __init__(
        self,
        message: str,
        *,
        loss: str = "",
        reason: str = "LEASE_LOST",
        metadata: Optional[Mapping[str, str]] = None,
        code: Optional[grpc.StatusCode] = None,
    ) -> None:
        metadata = dict(metadata or {})
        loss = loss or metadata.get("loss", "")
        super().__init__(message, reason=reason, metadata=metadata, code=code)
        self.loss = loss

    def __str__(self) -> str:
        return f"lease lost ({self.loss}): {self.message}" if self.loss else super().__str__()


class NotOwner(OwnershipEnded):
    """This sidecar does not own the session at that epoch. Never retry."""


class NotHolder(OwnershipEnded):
    """The call did not carry the live ownership's token: only the holder writes. Never retry."""


class OutcomeUnknown(LeaseholdError):
    """An append may or may not have committed.

    The client sends it again under the same request id before raising this. Raised, either
    the sidecar says the journal lost the evidence for good (metadata ``gone``: ``trimmed`` or
    ``no_fence``: replay the journal to see what is in it), or the retries ran out after an
    attempt that may have applied: appending again under ``request_id`` answers whether it
    committed, and never appends twice.
    """


class Unavailable(LeaseholdError):
    """The sidecar or etcd could not serve the call, and the call changed nothing (an append
    that may have applied raises :class:`OutcomeUnknown` instead). Retrying later is safe."""

    retryable = True


class InvalidRequest(LeaseholdError):
    """The request is malformed (a session that is not a UUID, a request id past the bound).
    Retrying the same request never helps."""


class TooLarge(InvalidRequest):
    """The records encode past one etcd request. Split them."""


class TooManyRecords(InvalidRequest):
    """More records than one etcd transaction carries. Split them."""


class Empty(InvalidRequest):
    """An append with no records."""


class SequenceExhausted(OwnershipEnded):
    """The journal has no sequence numbers left. Never retry."""


class PermissionDenied(LeaseholdError):
    """etcd denies the sidecar's user the namespace. Retrying does not help until an operator
    grants it."""


class BeyondTip(LeaseholdError):
    """A trim past the journal's last record. Never retry as is."""


class Owned(LeaseholdError):
    """A delete of a journal whose session is owned: release it first. Retrying later may
    succeed."""

    retryable = True


class Undecodable(LeaseholdError):
    """A record of the journal does not decode (written by something that is not leasehold)."""


class Compacted(LeaseholdError):
    """A replay's snapshot was compacted while it was read: replay again."""

    retryable = True


class ResourceExhausted(LeaseholdError):
    """Past one of the sidecar's bounds (streams, sessions, replays, watches, bytes in flight,
    request ids); the call changed nothing. Retrying later may succeed."""

    retryable = True


class Internal(LeaseholdError):
    """A failure leasehold does not expect: a bug. Report it."""


#: Every reason the sidecar gives, and the exception for it.
REASONS: dict[str, type[LeaseholdError]] = {
    "FENCED": Fenced,
    "LEASE_LOST": LeaseLost,
    "NOT_OWNER": NotOwner,
    "NOT_HOLDER": NotHolder,
    "OUTCOME_UNKNOWN": OutcomeUnknown,
    "ETCD_UNAVAILABLE": Unavailable,
    "TOO_LARGE": TooLarge,
    "TOO_MANY_RECORDS": TooManyRecords,
    "EMPTY": Empty,
    "SEQUENCE_EXHAUSTED": SequenceExhausted,
    "PERMISSION_DENIED": PermissionDenied,
    "BEYOND_TIP": BeyondTip,
    "OWNED": Owned,
    "UNDECODABLE": Undecodable,
    "COMPACTED": Compacted,
    "TOO_MANY_STREAMS": ResourceExhausted,
    "TOO_MANY_SESSIONS": ResourceExhausted,
    "TOO_MANY_REPLAYS": ResourceExhausted,
    "TOO_MANY_WATCHES": ResourceExhausted,
    "TOO_MANY_BYTES_IN_FLIGHT": ResourceExhausted,
    "REQUEST_IDS_EXHAUSTED": ResourceExhausted,
    "INTERNAL": Internal,
}

# What a status without leasehold's ErrorInfo (a transport failure, a malformed request)
# comes to, by its code. A stream reset or an unknown failure on the way (a plaintext client of
# a TLS listener, a proxy in between) did not come from the sidecar's service: unavailable.
_BY_CODE: dict[grpc.StatusCode, type[LeaseholdError]] = {
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.UNKNOWN: Unavailable,
    grpc.StatusCode.INTERNAL: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: Unavailable,
    grpc.StatusCode.CANCELLED: Unavailable,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidRequest,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.OUT_OF_RANGE: BeyondTip,
    grpc.StatusCode.DATA_LOSS: Undecodable,
}


def _parts(
    error: grpc.RpcError,
) -> tuple[Optional[grpc.StatusCode], str, list[tuple[str, str | bytes]]]:
    """A failed call's code, details and trailing metadata, from the blocking or asyncio API."""
    if isinstance(error, (grpc.aio.AioRpcError, grpc.Call)):
        trailers = error.trailing_metadata() or ()
        return error.code(), error.details() or str(error), [(k, v) for k, v in trailers]
    return None, str(error), []


def error_info(error: grpc.RpcError) -> tuple[str, dict[str, str], Optional[float]]:
    """The ``ErrorInfo`` reason and metadata of a failed call (``""`` and ``{}`` without one),
    and the delay its ``RetryInfo`` asks for, in seconds (``None`` without one)."""
    # googleapis-common-protos ships no type information.
    from google.rpc import error_details_pb2, status_pb2  # type: ignore[import-untyped]

    reason, metadata, delay = "", {}, None
    _, _, trailers = _parts(error)
    for key, value in trailers:
        if key != "grpc-status-details-bin" or not isinstance(value, bytes):
            continue
        status = status_pb2.Status.FromString(value)
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                if info.domain == "leasehold":
                    reason, metadata = info.reason, dict(info.metadata)
            elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                retry = error_details_pb2.RetryInfo()
                detail.Unpack(retry)
                delay = retry.retry_delay.seconds + retry.retry_delay.nanos / 1e9
    return reason, metadata, delay


def from_rpc_error(error: grpc.RpcError) -> LeaseholdError:
    """The exception of this package for a call the sidecar refused (or that never reached it)."""
    reason, metadata, _ = error_info(error)
    code, details, _ = _parts(error)
    kind = REASONS.get(reason)
    if kind is None:
        kind = _BY_CODE.get(code, Internal) if code is not None else Internal
    if kind is LeaseLost:
        return LeaseLost(details, metadata=metadata, code=code)
    return kind(details, reason=reason, metadata=metadata, code=code)

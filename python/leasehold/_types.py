"""The values the clients return: plain, frozen dataclasses, independent of the wire format."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional, Union

from .v1 import leasehold_pb2 as pb

__all__ = [
    "Appended",
    "Trimmed",
    "Fence",
    "Record",
    "Owner",
    "Host",
    "OwnerChange",
]


@dataclass(frozen=True, slots=True)
class Appended:
    """An append that committed: its records' sequence numbers and the etcd revision."""

    first_seq: int
    last_seq: int
    revision: int

    @staticmethod
    def _from(response: pb.AppendResponse) -> Appended:
        return Appended(int(response.first_seq), int(response.last_seq), int(response.revision))


@dataclass(frozen=True)
class Trimmed:
    """A trim's result: the journal's first kept sequence number, and how many records went."""

    base: int
    removed: int


@dataclass(frozen=True)
class Fence:
    """The record an owner appends when it opens the journal, after the tip it saw."""

    epoch: int
    previous_seq: int
    previous_epoch: int


@dataclass(frozen=True)
class Record:
    """A journal record: an event's payload, or (with ``records=True``) an owner's fence."""

    seq: int
    epoch: int
    event: Optional[bytes] = None
    fence: Optional[Fence] = None

    @staticmethod
    def _from(message: pb.ReplayResponse) -> Record:
        if message.WhichOneof("kind") == "fence":
            fence = message.fence
            return Record(
                seq=message.seq,
                epoch=message.epoch,
                fence=Fence(fence.epoch, fence.previous_seq, fence.previous_epoch),
            )
        return Record(seq=message.seq, epoch=message.epoch, event=message.event)


@dataclass(frozen=True)
class Owner:
    """A session's owner, as the sidecar's owner directory knows it."""

    session: str
    epoch: int
    #: The owner's node name ("" for an owner key leasehold did not write).
    node: str
    #: The owner's store instance (one per process).
    store: str
    #: The address the owner advertises ("" if none).
    advertise: str
    metadata: bytes
    #: False once the owner's host is gone: its sessions are about to be released.
    host_alive: bool
    #: The owner key's mod revision.
    revision: int

    @staticmethod
    def _from(info: pb.OwnerInfo) -> Owner:
        return Owner(
            session=info.session,
            epoch=info.epoch,
            node=info.node,
            store=info.store,
            advertise=info.advertise,
            metadata=info.metadata,
            host_alive=info.host_alive,
            revision=info.revision,
        )


@dataclass(frozen=True)
class Host:
    """A live session host."""

    store: str
    node: str
    advertise: str
    metadata: bytes


ChangeKind = Literal[
    "owner", "snapshot", "acquired", "released", "moved", "host_joined", "host_gone", "missed"
]


@dataclass(frozen=True)
class OwnerChange:
    """One message of :meth:`watch_owners`. ``kind`` says which fields are set:

    - ``owner``: an owner at the start (the snapshot), in ``owner``;
    - ``snapshot``: the snapshot is complete, as of ``revision``; changes follow;
    - ``acquired``: a session got an owner (``owner``);
    - ``released``: its owner let go (``owner``, ``revision``);
    - ``moved``: its owner changed without the directory seeing it free (``previous``, ``owner``);
    - ``host_joined``, ``host_gone``: a host (``host``, ``revision``; ``sessions`` it still
      owned when it went);
    - ``missed``: the stream fell behind by ``missed`` changes: ask :meth:`owner`, or watch again.
    """

    kind: ChangeKind
    owner: Optional[Owner] = None
    previous: Optional[Owner] = None
    host: Optional[Host] = None
    revision: int = 0
    sessions: int = 0
    missed: int = 0

    @staticmethod
    def _from(message: pb.OwnerChange) -> OwnerChange:
        kind = message.WhichOneof("change")
        if kind == "owner":
            return OwnerChange("owner", owner=Owner._from(message.owner))
        if kind == "snapshot":
            return OwnerChange("snapshot", revision=message.snapshot)
        if kind == "acquired":
            return OwnerChange("acquired", owner=Owner._from(message.acquired))
        if kind == "released":
            released = message.released
            return OwnerChange(
                "released", owner=Owner._from(released.owner), revision=released.revision
            )
        if kind == "moved":
            moved = message.moved
            return OwnerChange(
                "moved", previous=Owner._from(getattr(moved, "from")), owner=Owner._from(moved.to)
            )
        if kind in ("host_joined", "host_gone"):
            change = message.host_joined if kind == "host_joined" else message.host_gone
            host = Host(
                change.host.store, change.host.node, change.host.advertise, change.host.metadata
            )
            return OwnerChange(kind, host=host, revision=change.revision, sessions=change.sessions)
        return OwnerChange("missed", missed=message.missed)


Payload = Union[bytes, bytearray, memoryview, str]


def payload_bytes(payload: Payload) -> bytes:
    """A record's payload as bytes: ``str`` is UTF-8 encoded."""
    if isinstance(payload, str):
        return payload.encode()
    return bytes(payload)

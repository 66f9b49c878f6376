"""leasehold for Python: own a session among many processes, and append to its fenced journal.

A client of ``leasehold serve`` (the sidecar, installed with this package as the
``leasehold`` command)::

    import leasehold

    async with leasehold.connect("127.0.0.1:50051") as client:
        async with client.own(session, wait=30.0) as own:
            appended = await own.append(b"step 1", b"step 2")

:func:`connect` gives the asyncio client, :func:`connect_sync` the blocking one, with the same
names. Every failure is a :class:`LeaseholdError`; see ``leasehold._errors`` for each one and
whether retrying helps. ``leasehold.testing`` starts etcd and a sidecar for tests.
"""

from ._aio import Client, Own, connect
from ._common import RetryPolicy, Tls
from ._errors import (
    BeyondTip,
    Compacted,
    Empty,
    Fenced,
    Held,
    Internal,
    InvalidRequest,
    LeaseholdError,
    LeaseLost,
    NotHolder,
    NotOwner,
    OutcomeUnknown,
    Owned,
    OwnershipEnded,
    PermissionDenied,
    ResourceExhausted,
    SequenceExhausted,
    TooLarge,
    TooManyRecords,
    Unavailable,
    Undecodable,
)
from ._sync import SyncClient, SyncOwn, connect_sync
from ._types import Appended, Fence, Host, Owner, OwnerChange, Record, Trimmed

__version__ = "0.1.0"

__all__ = [
    "connect",
    "connect_sync",
    "Client",
    "Own",
    "SyncClient",
    "SyncOwn",
    "RetryPolicy",
    "Tls",
    "Appended",
    "Trimmed",
    "Record",
    "Fence",
    "Owner",
    "Host",
    "OwnerChange",
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
]

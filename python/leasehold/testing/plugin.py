"""leasehold's pytest plugin (loaded with the package): fixtures of real parts.

- ``leasehold_etcd`` (per session): a throwaway etcd (:class:`leasehold.testing.Etcd`);
- ``leasehold_sidecar``: a ``leasehold serve`` over it, in a namespace of the test's own;
- ``leasehold_sidecars``: a factory of more sidecars over the same etcd and namespace (two
  sidecars of one namespace are two nodes of one deployment);
- ``leasehold_client``: a blocking client of ``leasehold_sidecar`` (an asyncio test makes its
  own: ``async with leasehold.connect(leasehold_sidecar.address) as client``);
- ``leasehold_fault``: a :class:`~leasehold.testing.FaultProxy` in front of
  ``leasehold_sidecar``: connect a client to ``leasehold_fault.address``, then ``freeze()``
  or ``cut()`` it to watch its ownerships end.

A part that cannot start fails the test with :class:`~leasehold.testing.SetupError`, saying
what is missing: it is never skipped.
"""

from __future__ import annotations

from typing import Callable, Iterator

import pytest

from .. import SyncClient, connect_sync
from . import Etcd, FaultProxy, Sidecar


@pytest.fixture(scope="session")
def leasehold_etcd() -> Iterator[Etcd]:
    """A throwaway etcd for the test session."""
    etcd = Etcd.start()
    try:
        yield etcd
    finally:
        etcd.stop()


@pytest.fixture
def leasehold_sidecars(leasehold_etcd: Etcd) -> Iterator[Callable[..., Sidecar]]:
    """Starts sidecars over ``leasehold_etcd``, all in one namespace of this test's own; each
    call takes :class:`~leasehold.testing.Sidecar`'s options and returns a running one."""
    started: list[Sidecar] = []
    namespace: list[str] = []

    def start(**options: object) -> Sidecar:
        if namespace:
            options.setdefault("namespace", namespace[0])
        sidecar = Sidecar(leasehold_etcd, **options)  # type: ignore[arg-type]
        namespace[:] = [sidecar.namespace]
        started.append(sidecar)
        return sidecar

    try:
        yield start
    finally:
        for sidecar in started:
            sidecar.close()


@pytest.fixture
def leasehold_sidecar(leasehold_sidecars: Callable[..., Sidecar]) -> Sidecar:
    """A ``leasehold serve`` over ``leasehold_etcd``, in a namespace of this test's own."""
    return leasehold_sidecars()


@pytest.fixture
def leasehold_client(leasehold_sidecar: Sidecar) -> Iterator[SyncClient]:
    """A blocking client of ``leasehold_sidecar``."""
    with connect_sync(leasehold_sidecar.address) as client:
        yield client


@pytest.fixture
def leasehold_fault(leasehold_sidecar: Sidecar) -> Iterator[FaultProxy]:
    """A fault proxy in front of ``leasehold_sidecar``."""
    with FaultProxy(leasehold_sidecar.address) as proxy:
        yield proxy

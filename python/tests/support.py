"""Helpers of the package's tests, which run against real parts: etcd and ``leasehold serve``,
from the plugin's fixtures (``leasehold.testing.plugin``, loaded with the package)."""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable, TypeVar

T = TypeVar("T")


def wait_until(what: str, check: Callable[[], bool], timeout: float = 10.0) -> None:
    """Polls ``check`` until it holds; fails the test with ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(0.05)


async def within(what: str, awaitable: Awaitable[T], timeout: float = 10.0) -> T:
    """``awaitable``'s result; fails the test with ``what`` after ``timeout`` s."""
    try:
        return await asyncio.wait_for(awaitable, timeout)
    except asyncio.TimeoutError:
        raise AssertionError(f"{what}: not within {timeout} s") from None

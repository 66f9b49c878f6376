"""A TCP proxy with faults, between a client and a sidecar, on a thread of its own (so that it
serves asyncio and blocking tests alike)."""

from __future__ import annotations

import asyncio
import enum
import threading
from typing import Optional


class _Mode(enum.Enum):
    PASS = "pass"
    FREEZE = "freeze"
    DROP_REPLIES = "drop_replies"


class FaultProxy:
    """Forwards 127.0.0.1:``port`` to ``upstream`` (``host:port``, TCP). ``address`` is where
    the client connects instead of the sidecar.

    - :meth:`freeze`: every byte is held, both ways, until :meth:`heal`: to the sidecar the
      client stops answering (its keepalive pings too), as a frozen process would;
    - :meth:`drop_replies`: requests go through, answers are dropped (a call that committed
      looks lost to the client);
    - :meth:`cut`: every open connection is closed; new ones are let through;
    - :meth:`heal`: back to passing bytes (held ones go on; connections that dropped replies
      are closed, since their streams lost bytes).
    """

    #: Where clients connect: ``127.0.0.1:port``.
    address: str

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self._mode = _Mode.PASS
        self._changed: Optional[asyncio.Event] = None
        self._connections: set[asyncio.Task[None]] = set()
        self._tainted: set[asyncio.Task[None]] = set()
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()
        self._server: Optional[asyncio.AbstractServer] = None
        self._thread = threading.Thread(
            target=self._run, args=(ready,), name="leasehold-fault-proxy", daemon=True
        )
        self._thread.start()
        ready.wait()
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        self.address = f"127.0.0.1:{port}"

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)

        async def start() -> None:
            self._changed = asyncio.Event()
            self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)

        self._loop.run_until_complete(start())
        ready.set()
        self._loop.run_forever()

    def _set(self, mode: _Mode, cut: bool = False) -> None:
        def apply() -> None:
            if self._mode == _Mode.DROP_REPLIES and mode != _Mode.DROP_REPLIES:
                for task in list(self._tainted):
                    task.cancel()
            self._mode = mode
            if cut:
                for task in list(self._connections):
                    task.cancel()
            assert self._changed is not None
            self._changed.set()
            self._changed = asyncio.Event()

        done = threading.Event()

        def apply_and_tell() -> None:
            apply()
            done.set()

        self._loop.call_soon_threadsafe(apply_and_tell)
        done.wait()

    def freeze(self) -> None:
        """Holds every byte, both ways, until :meth:`heal`."""
        self._set(_Mode.FREEZE)

    def drop_replies(self) -> None:
        """Drops every answer from the sidecar until :meth:`heal`."""
        self._set(_Mode.DROP_REPLIES)

    def cut(self) -> None:
        """Closes every open connection (the mode stays)."""
        self._set(self._mode, cut=True)

    def heal(self) -> None:
        """Passes bytes again."""
        self._set(_Mode.PASS)

    def close(self) -> None:
        """Closes every connection and stops the proxy."""
        self._set(self._mode, cut=True)

        async def stop() -> None:
            assert self._server is not None
            self._server.close()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self._loop.close()

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        host, port = self.upstream.rsplit(":", 1)
        try:
            server_reader, server_writer = await asyncio.open_connection(host, int(port))
        except OSError:
            client_writer.close()
            self._connections.discard(task)
            return
        pumps = {
            asyncio.ensure_future(self._pump(client_reader, server_writer, reply=False, task=task)),
            asyncio.ensure_future(self._pump(server_reader, client_writer, reply=True, task=task)),
        }
        try:
            # Whichever way closes first closes the connection.
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            pass
        finally:
            for pump in pumps:
                pump.cancel()
            self._connections.discard(task)
            self._tainted.discard(task)
            for writer in (client_writer, server_writer):
                writer.close()

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        reply: bool,
        task: asyncio.Task[None],
    ) -> None:
        while True:
            await self._until_flowing()
            data = await reader.read(65536)
            if not data:
                # One side closed: close the other, and end the connection.
                raise OSError("closed")
            await self._until_flowing()
            if reply and self._mode == _Mode.DROP_REPLIES:
                self._tainted.add(task)
                continue
            writer.write(data)
            await writer.drain()

    async def _until_flowing(self) -> None:
        while self._mode == _Mode.FREEZE:
            assert self._changed is not None
            await self._changed.wait()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

"""A TCP proxy in a thread, to make the database unreachable and back while the dashboard runs.

The target is a TCP host and port, or a unix-socket directory and port (the embedded PostgreSQL listens only
on ``<dir>/.s.PGSQL.<port>``): clients always reach the proxy over TCP."""

from __future__ import annotations

import asyncio
import contextlib
import threading

from tests.web.support import free_port


class Proxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            host, port = self.target
            if host.startswith("/"):
                up_reader, up_writer = await asyncio.open_unix_connection(f"{host}/.s.PGSQL.{port}")
            else:
                up_reader, up_writer = await asyncio.open_connection(host, port)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for w in list(self._writers):
            with contextlib.suppress(Exception):
                w.transport.abort()
        self._writers.clear()

    def up(self) -> None:
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(5)

    def down(self) -> None:
        """Refuses new connections and cuts the open ones: the database is gone, as far as clients see."""
        asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(5)

    def close(self) -> None:
        self.down()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)

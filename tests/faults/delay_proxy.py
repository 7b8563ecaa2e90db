"""A TCP proxy that adds latency, for the slow-Redis fault test: clients connect to it, it connects to Redis.

Every chunk read from either side is written to the other side ``delay_s`` seconds after it arrived, in
order (a queue per direction, so the delay is added once per chunk and never accumulates behind earlier
chunks): a command's round trip gains ``2 * delay_s``. ``delay_s`` can be changed at any time and applies to
chunks that arrive afterwards, like a network path that becomes slow and then recovers.

It runs its own event loop in a thread, so the test's own loop (busy generating load, or blocked in a
synchronous Redis call) never adds latency of its own::

    with DelayProxy(redis_port) as slow:
        url = slow.url          # give this to the proxies
        slow.delay_s = 0.5      # every round trip now takes a second longer
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

from tests.servers import free_port

__all__ = ["DelayProxy"]


class DelayProxy:
    def __init__(self, target_port: int, *, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self.delay_s = 0.0
        self.connections = 0
        """Client connections accepted so far."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._ready = threading.Event()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    # -- lifecycle ------------------------------------------------------------------------------------------
    def start(self) -> DelayProxy:
        self._thread = threading.Thread(target=self._run, name="delay-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the delay proxy did not start")
        return self

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        self._server = loop.run_until_complete(asyncio.start_server(self._accept, "127.0.0.1", self.port))
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.close()

    def stop(self) -> None:
        loop = self._loop
        if loop is None or self._thread is None:
            return

        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            loop.stop()

        asyncio.run_coroutine_threadsafe(shutdown(), loop)
        self._thread.join(timeout=10)
        self._loop = self._thread = None

    def __enter__(self) -> DelayProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- forwarding -----------------------------------------------------------------------------------------
    async def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)  # type: ignore[arg-type]
        self.connections += 1
        try:
            try:
                upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)
            except OSError:
                client_writer.close()
                return
            await asyncio.gather(
                self._pipe(client_reader, upstream_writer),
                self._pipe(upstream_reader, client_writer),
                return_exceptions=True,
            )
        finally:
            self._tasks.discard(task)  # type: ignore[arg-type]

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes | None]] = asyncio.Queue()

        async def deliver() -> None:
            try:
                while True:
                    due, data = await queue.get()
                    wait = due - loop.time()
                    if wait > 0:
                        await asyncio.sleep(wait)
                    if data is None:
                        break
                    writer.write(data)
                    await writer.drain()
            finally:
                with contextlib.suppress(Exception):
                    writer.close()

        delivering = asyncio.create_task(deliver())
        try:
            while data := await reader.read(65536):
                queue.put_nowait((loop.time() + self.delay_s, data))
        except (ConnectionError, OSError):
            pass
        finally:
            queue.put_nowait((loop.time(), None))  # the other side sees the close once what came before is out
            with contextlib.suppress(Exception):
                await delivering

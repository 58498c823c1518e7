"""The blocking client: the asyncio client driven from a private event-loop thread."""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

from producer.client import AsyncFleetClient
from producer.stream import RequestStream
from shared.protocol import Failure, Request, Result, Token


class SyncRequestStream:
    """``for token in stream`` then ``stream.result()``; see :class:`RequestStream`."""

    def __init__(self, client: "FleetClient", stream: RequestStream) -> None:
        self._client = client
        self._stream = stream
        self.request_id = stream.request_id

    def __iter__(self) -> Iterator[Token]:
        tokens = self._stream.__aiter__()
        while True:
            try:
                yield self._client._call(tokens.__anext__())
            except StopAsyncIteration:
                return

    def result(self, timeout: float | None = None) -> Result:
        return self._client._call(self._stream.result(timeout))

    @property
    def text(self) -> str:
        return self._stream.text


class FleetClient:
    """Same methods as :class:`AsyncFleetClient`, blocking. Use as a context manager."""

    def __init__(self, redis_url: str | None = None, **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fleet-client",
                                        daemon=True)
        self._thread.start()
        self._async = self._call(self._make(redis_url, options))

    async def _make(self, redis_url: str | None, options: dict) -> AsyncFleetClient:
        return AsyncFleetClient(redis_url, **options)

    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def __enter__(self) -> "FleetClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._call(self._async.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def submit(self, request: Request | None = None, **fields: Any) -> SyncRequestStream:
        return SyncRequestStream(self, self._call(self._async.submit(request, **fields)))

    def watch(self, request_id: str, tenant: str | None = None) -> SyncRequestStream:
        return SyncRequestStream(self, self._call(self._async.watch(request_id, tenant)))

    def generate(self, request: Request | None = None, *, timeout: float | None = None,
                 **fields: Any) -> Result:
        return self._call(self._async.generate(request, timeout=timeout, **fields))

    def cancel(self, request_id: str, tenant: str | None = None) -> None:
        self._call(self._async.cancel(request_id, tenant))

    def get_result(self, request_id: str, tenant: str | None = None) -> Result | Failure | None:
        return self._call(self._async.get_result(request_id, tenant))

    def get_progress(self, request_id: str, tenant: str | None = None) -> list[Token]:
        return self._call(self._async.get_progress(request_id, tenant))

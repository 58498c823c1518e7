"""One call's life: admit, submit, answer (whole or as server-sent events), clean up.

A client that goes away -- mid-stream, or while waiting for a whole answer -- cancels its
request in the fleet, so its KV blocks are freed within an engine step.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import msgspec
from redis.exceptions import RedisClusterException, RedisError
from starlette.requests import Request as HttpRequest

from producer.client import AsyncFleetClient
from producer.errors import RequestFailed
from producer.gateway.admission import Admission
from producer.gateway.errors import GatewayError, from_failure, unavailable
from producer.gateway.redact import redact
from producer.gateway.render import Renderer
from producer.stream import RequestStream
from shared.protocol import Token

logger = logging.getLogger(__name__)
_encode = msgspec.json.encode


class ClientGone(Exception):
    """The HTTP client disconnected before its answer was complete."""


def sse(obj: Any) -> bytes:
    return b"data: " + _encode(obj) + b"\n\n"


async def _disconnected(request: HttpRequest) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def until_disconnect(request: HttpRequest, work: Awaitable, timeout_s: float) -> Any:
    """Await ``work``; raise :class:`ClientGone` if the client leaves first, 504 on timeout."""
    task = asyncio.ensure_future(asyncio.wait_for(work, timeout_s))
    watch = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()
    if not task.done() or task.cancelled():
        raise ClientGone()
    try:
        return task.result()
    except asyncio.TimeoutError:
        raise GatewayError(504, f"no answer within {timeout_s:.0f} s", type="server_error",
                           code="timeout") from None


async def _next_token(it: AsyncIterator[Token]) -> Token | None:
    try:
        return await anext(it)
    except StopAsyncIteration:
        return None


class Call:
    """One admitted request: its fleet stream, tenant, quota slot, and how it ends."""

    def __init__(self, *, client: AsyncFleetClient, admission: Admission, stream: RequestStream,
                 tenant: str, renderer: Renderer, timeout_s: float,
                 background: set[asyncio.Task]) -> None:
        self.client = client
        self.admission = admission
        self.stream = stream
        self.tenant = tenant
        self.renderer = renderer
        self.timeout_s = timeout_s
        self._background = background

    @property
    def request_id(self) -> str:
        return self.stream.request_id

    def abandon(self) -> None:
        """The client left (or timed out): cancel in the fleet and free the quota slot, then
        wait out the terminal event, which closes the subscription -- in the background."""
        logger.info("client left; cancelling %s/%s", self.tenant, self.request_id)
        task = asyncio.get_running_loop().create_task(self._abandon())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _abandon(self) -> None:
        try:
            try:
                await self.client.cancel(self.request_id, self.tenant)
            finally:
                await self.release()  # the client is gone; its request ends within a step
            # The terminal event closes the stream's subscription.
            await self.stream.result(timeout=self.timeout_s)
        except (RequestFailed, asyncio.TimeoutError):
            pass
        except Exception:  # noqa: BLE001 -- a background clean-up must not die loudly
            logger.exception("cleaning up %s failed", self.request_id)

    async def release(self) -> None:
        await self.admission.release(self.tenant, self.request_id)

    @contextlib.asynccontextmanager
    async def _until_answered(self) -> AsyncIterator[None]:
        """A fleet failure becomes its HTTP error; anything else (the client gone, a
        timeout) cancels the request in the fleet."""
        try:
            yield
        except RequestFailed as exc:
            await self.release()
            raise from_failure(exc.failure) from None
        except BaseException:
            self.abandon()
            raise

    async def whole(self, request: HttpRequest) -> dict[str, Any]:
        """The complete (non-streaming) response body."""
        async def collect() -> tuple[list[Token], Any]:
            tokens = [t async for t in self.stream]
            return tokens, await self.stream.result()

        async with self._until_answered():
            tokens, result = await until_disconnect(request, collect(), self.timeout_s)
        await self.release()
        return self.renderer.response(result, tokens)

    async def first(self, request: HttpRequest) -> tuple[AsyncIterator[Token], Token | None]:
        """Wait for the first token before any header is sent, so a request the fleet
        refuses still gets a proper HTTP error status."""
        it = aiter(self.stream)
        async with self._until_answered():
            token = await until_disconnect(request, _next_token(it), self.timeout_s)
            if token is None:
                await self.stream.result()
        return it, token

    async def _chunks(self, it: AsyncIterator[Token], first: Token | None,
                      include_usage: bool) -> AsyncIterator[bytes]:
        token = first
        while token is not None:
            chunk = self.renderer.token_chunk(token)
            if chunk is not None:
                yield sse(chunk)
            token = await _next_token(it)
        result = await self.stream.result()
        yield sse(self.renderer.final_chunk(result))
        if include_usage:
            yield sse(self.renderer.usage_chunk(result))

    async def events(self, it: AsyncIterator[Token], first: Token | None,
                     include_usage: bool) -> AsyncIterator[bytes]:
        """The SSE body. Cancelled by Starlette when the client disconnects."""
        done = False
        try:
            opening = self.renderer.first_chunk()
            if opening is not None:
                yield sse(opening)
            try:
                async for chunk in self._chunks(it, first, include_usage):
                    yield chunk
                done = True
            except RequestFailed as exc:
                yield sse(from_failure(exc.failure).body())
                done = True
            except (RedisError, RedisClusterException) as exc:
                # Headers are sent: the error can only be the stream's last event. Not done:
                # the request is cancelled in the fleet (if Redis lets us).
                logger.warning("redis failed mid-stream of %s: %s", self.request_id,
                               redact(str(exc)))
                yield sse(unavailable(1).body())
            yield b"data: [DONE]\n\n"
        finally:
            if done:
                await self.release()
            else:
                self.abandon()

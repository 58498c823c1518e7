"""The gateway's background batch runner: takes every unfinished batch of the tenants it
serves (under a lease in Redis, so one gateway replica runs a batch at a time), submits
its lines on the fleet's ``batch`` lane with a bounded window, and records each answer
once. After a restart (or another replica's death, once its lease expires) a batch is
resumed from its set of answered lines; a line that was in flight is submitted again under
the same request id (``b-<batch>-<digest of custom_id>``), which the fleet generates once.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import uuid

from producer.gateway import openai_batch
from producer.gateway.batch_store import FILE_TTL_S, OPEN, Store
from producer.gateway.errors import GatewayError, invalid
from producer.gateway.state import Gateway
from shared import keys
from shared.tasks import cancel_and_wait

logger = logging.getLogger(__name__)
LEASE_S = 15.0
POLL_S = 1.0
WINDOW = 32  # lines of one batch in flight


class BatchRunner:
    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        self.owner = uuid.uuid4().hex
        self.options = dataclasses.replace(gw.options, lane="batch")
        self.tasks: dict[tuple[str, str], asyncio.Task] = {}
        self._wake = asyncio.Event()
        self._main: asyncio.Task | None = None
        self._store: Store | None = None
        self._stopping = False

    def start(self) -> "BatchRunner":
        self._main = asyncio.get_running_loop().create_task(self._loop())
        return self

    def wake(self) -> None:
        self._wake.set()

    async def stop(self) -> None:
        """Stop running (requests in flight go on in the fleet); leases are given back so
        the next gateway resumes at once."""
        self._stopping = True  # the scan loop ends on it even if a cancellation is lost
        await cancel_and_wait([self._main, *self.tasks.values()], logger)

    async def store(self) -> Store:
        if self._store is None:
            self._store = Store(await self.gw.redis())
        return self._store

    async def _loop(self) -> None:
        said, said_at = "", 0.0
        while not self._stopping:
            try:
                await self._scan()
            except Exception as exc:  # noqa: BLE001 -- Redis away: try again next round
                text = f"batch runner: {type(exc).__name__}: {exc}"
                if text != said or time.monotonic() - said_at > 60:  # once a minute at most
                    logger.warning("%s", text)
                    said, said_at = text, time.monotonic()
            try:
                await asyncio.wait_for(self._wake.wait(), POLL_S)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()

    async def _scan(self) -> None:
        store = await self.store()
        for tenant in sorted(set(self.gw.options.api_keys.values()) or {keys.DEFAULT_TENANT}):
            for batch_id in await store.active(tenant):
                key = (tenant, batch_id)
                if key in self.tasks or not await store.lease(tenant, batch_id, self.owner,
                                                              LEASE_S):
                    continue
                task = asyncio.get_running_loop().create_task(self._run(tenant, batch_id))
                self.tasks[key] = task
                task.add_done_callback(lambda _, k=key: self.tasks.pop(k, None))

    async def _run(self, tenant: str, batch_id: str) -> None:
        store = await self.store()
        job = asyncio.current_task()
        ended = False  # the renewal ends on it even if its cancellation is lost

        async def renew() -> None:
            while not ended and not self._stopping:
                await asyncio.sleep(LEASE_S / 3)
                if not await store.lease(tenant, batch_id, self.owner, LEASE_S):
                    logger.warning("lost the lease of batch %s", batch_id)
                    job.cancel()
                    return

        renewing = asyncio.get_running_loop().create_task(renew())
        try:
            await BatchJob(self, store, tenant, batch_id).run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 -- resumed at the next scan
            logger.warning("batch %s stopped: %s: %s", batch_id, type(exc).__name__, exc)
        finally:
            ended = True
            renewing.cancel()
            try:
                await asyncio.shield(store.release(tenant, batch_id, self.owner))
            except Exception:  # noqa: BLE001 -- the lease expires by itself
                pass


class BatchJob:
    """One run over one batch's input, from where it stands."""

    def __init__(self, runner: BatchRunner, store: Store, tenant: str, batch_id: str) -> None:
        self.runner, self.store, self.tenant, self.batch_id = runner, store, tenant, batch_id
        self.gw = runner.gw
        self.inflight: dict[int, tuple] = {}  # line number -> (client, request id)
        self.stop: str | None = None
        self._checked = 0.0

    async def run(self) -> None:
        state = await self.store.batch(self.tenant, self.batch_id)
        if state is None:  # expired or removed
            await self.store.redis.srem(keys.active_batches_key(self.tenant), self.batch_id)
            return
        self.fixed = fixed = json.loads(state["fixed"])
        status = state["status"]
        if status == "validating":
            if await self.store.file(self.tenant, fixed["input_file_id"]) is None:
                errors = {"object": "list", "data": [{"code": "file_not_found", "line": None,
                          "param": "input_file_id", "message": "the input file is gone"}]}
                await self.store.redis.hset(keys.batch_key(self.tenant, self.batch_id),
                                            "errors", json.dumps(errors))
                await self._publish(await self._finalize("failed"))
                return
            total = await self.store.line_count(self.tenant, fixed["input_file_id"])
            moved, found = await self.store.move(self.tenant, self.batch_id, "in_progress",
                                                 ("validating",), total=total)
            status = "in_progress" if moved else found
        if status in ("in_progress", "cancelling"):
            if status == "cancelling":
                self.stop = "cancelled"
            await self._submit_all(await self.store.done(self.tenant, self.batch_id))
            if self.stop == "expired":
                await self._expire_rest()
            await self._publish(await self._finalize(self.stop or "completed"))
        elif status == "finalizing":  # a runner stopped between finalizing and the end
            await self._publish(state.get("ending") or "completed")
        else:  # over (or gone): nothing left to run
            await self.store.redis.srem(keys.active_batches_key(self.tenant), self.batch_id)

    async def _stopping(self) -> str | None:
        now = time.monotonic()
        if self.stop is None and now - self._checked > 0.5:
            self._checked = now
            state = await self.store.batch(self.tenant, self.batch_id)
            if state is not None and state["status"] == "cancelling":
                self.stop = "cancelled"
            elif time.time() > self.fixed["expires_at"]:
                self.stop = "expired"
            if self.stop is not None:
                for client, request_id in list(self.inflight.values()):
                    await client.cancel(request_id, self.tenant)
        return self.stop

    async def _submit_all(self, done: set[int]) -> None:
        tasks: set[asyncio.Task] = set()
        try:
            number = 0
            async for chunk in self.store.lines(self.tenant, self.fixed["input_file_id"]):
                for text in chunk:
                    number += 1
                    if number in done:
                        continue
                    while len(tasks) >= WINDOW and not await self._stopping():
                        await self._wait(tasks)
                    if await self._stopping():
                        break
                    tasks.add(asyncio.create_task(self._line(number, text)))
                if self.stop:
                    break
            while tasks:
                await self._wait(tasks)
                await self._stopping()
        finally:  # a line still running could record after the batch ended: wait it out
            await cancel_and_wait(tasks, logger)

    @staticmethod
    async def _wait(tasks: set[asyncio.Task]) -> None:
        """Until a line ends (at most half a second); a line that raised (Redis lost) raises."""
        finished, _ = await asyncio.wait(tasks, timeout=0.5, return_when=asyncio.FIRST_COMPLETED)
        tasks -= finished
        for task in finished:
            if task.exception() is not None:
                raise task.exception()

    async def _line(self, number: int, text: bytes) -> None:
        custom_id = f"line-{number}"
        try:
            try:
                obj = json.loads(text)
                custom_id = openai_batch.custom_id_of(obj) or custom_id
                line = openai_batch.parse(obj, self.runner.options)
                if line.url != self.fixed["endpoint"]:
                    raise invalid(f"this batch's lines go to {self.fixed['endpoint']}",
                                  param="url", code="invalid_url")
                client = await self.gw.connected(
                    self.gw.client(self.gw.namespace(line.model), self.tenant))
                request_id = f"b-{self.batch_id[6:]}-{openai_batch.digest(custom_id, size=16)}"
                self.inflight[number] = (client, request_id)
                out = await openai_batch.run_line(client, line, request_id, self.gw.names)
            except ValueError as exc:
                out = openai_batch.refused_line(custom_id, invalid(f"not JSON: {exc}"))
            except GatewayError as exc:
                out = openai_batch.refused_line(custom_id, exc)
        finally:
            self.inflight.pop(number, None)
        await self.store.record(self.tenant, self.fixed, number, openai_batch.dumps(out),
                                openai_batch.is_success(out))

    async def _expire_rest(self) -> None:
        done = await self.store.done(self.tenant, self.batch_id)
        number = 0
        async for chunk in self.store.lines(self.tenant, self.fixed["input_file_id"]):
            for text in chunk:
                number += 1
                if number not in done:
                    try:
                        custom_id = openai_batch.custom_id_of(json.loads(text)) or f"line-{number}"
                    except ValueError:
                        custom_id = f"line-{number}"
                    out = openai_batch.error_line(custom_id, "batch_expired",
                                                  "the batch expired before this line ran")
                    await self.store.record(self.tenant, self.fixed, number,
                                            openai_batch.dumps(out), False)

    async def _finalize(self, ending: str) -> str:
        """Move the batch to ``finalizing`` (no line is recorded after that) and return how
        it ends: ``cancelled`` if a cancel got in first, else ``ending``."""
        moved, found = await self.store.move(self.tenant, self.batch_id, "finalizing",
                                             OPEN, ending=ending)
        if not moved and found == "cancelling":
            ending = "cancelled"
            moved, found = await self.store.move(self.tenant, self.batch_id, "finalizing",
                                                 ("cancelling",), ending=ending)
        if not moved and found != "finalizing":
            raise RuntimeError(f"batch {self.batch_id} is {found or 'gone'}, not running")
        return ending

    async def _publish(self, status: str) -> None:
        """End the finalizing batch as ``status``, publishing its non-empty files (counts and
        lines are frozen from finalizing on)."""
        state = await self.store.batch(self.tenant, self.batch_id)
        now = int(time.time())
        files = []
        for kind, count, size in (("output", "completed", "output_bytes"),
                                  ("error", "failed", "error_bytes")):
            if int(state.get(count, 0)):
                files.append({"id": self.fixed[f"{kind}_file_id"], "object": "file",
                              "bytes": int(state.get(size, 0)), "created_at": now,
                              "filename": f"{self.batch_id}_{kind}.jsonl",
                              "purpose": "batch_output", "status": "processed",
                              "expires_at": now + FILE_TTL_S, "status_details": None})
        await self.store.finish(self.tenant, self.batch_id, status, files)

"""Cancellation that holds, and stopping asyncio tasks boundedly.

A task can outlive its cancellation: a library may swallow the ``CancelledError`` (redis-py
8.0-8.2 do, in an asyncio pipeline's ``execute``: README, "Dependencies beyond the core"),
and a loop around such a call then runs on. :func:`keep_cancellation` raises it again
where the library returned instead; and every shutdown goes through
:func:`cancel_and_wait`, which cancels, waits at most ``timeout_s``, and names each task
still running in the log, with where it is, so a process never waits on one forever.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Iterable
from io import StringIO
from typing import TypeVar

T = TypeVar("T")
STOP_S = 5.0  # how long a shutdown waits for cancelled tasks before it leaves them


async def keep_cancellation(awaitable: Awaitable[T]) -> T:
    """``await awaitable``, raising ``CancelledError`` if this task was cancelled meanwhile
    and the awaitable returned anyway (Python 3.11+: ``Task.cancelling()``; on 3.10, a
    plain await)."""
    task = asyncio.current_task()
    counted = task is not None and hasattr(task, "cancelling")
    before = task.cancelling() if counted else 0
    result = await awaitable
    if counted and task.cancelling() > before:
        raise asyncio.CancelledError()
    return result


async def cancel_and_wait(tasks: Iterable[asyncio.Task], logger: logging.Logger,
                          timeout_s: float = STOP_S) -> set[asyncio.Task]:
    """Cancel ``tasks``; return those not ended within ``timeout_s`` (each logged)."""
    tasks = [t for t in tasks if t is not None]
    for task in tasks:
        task.cancel()
    if not tasks:
        return set()
    _, stuck = await asyncio.wait(tasks, timeout=timeout_s)
    for task in stuck:
        where = StringIO()
        task.print_stack(limit=8, file=where)
        logger.error("task %s did not end within %.0f s of its cancellation; leaving it:\n%s",
                     task.get_name(), timeout_s, where.getvalue())
    for task in tasks:  # read every ended task's exception, so asyncio does not log it again
        if task.done() and not task.cancelled():
            task.exception()
    return stuck

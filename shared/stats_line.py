"""The periodic stats line every long-running command logs (worker, gateway, exporter).

:class:`PeriodicStats` is a daemon thread that, every ``interval_s`` (0: never), asks
:meth:`PeriodicStats.measure` for the figures of the interval just ended (read from the
component's own metrics registry, so the request path does no extra work) and logs them as
one info line: a readable message, the figures as structured fields (JSON keys). An idle
interval is logged once; the following idle ones are not, until work returns.
"""
from __future__ import annotations

import logging
import threading
import time


class PeriodicStats:
    """Subclasses implement :meth:`measure`; ``thread_name`` names the thread."""

    thread_name = "stats-log"

    def __init__(self, logger: logging.Logger, interval_s: float = 10.0,
                 clock=time.monotonic) -> None:
        self.logger, self.interval_s, self.clock = logger, interval_s, clock
        self._stop = threading.Event()
        self._last_at = clock()
        self._was_idle = False

    def measure(self, seconds: float) -> tuple[dict, str, bool]:
        """(fields, message, idle) of the last ``seconds``."""
        raise NotImplementedError

    def tick(self) -> dict | None:
        """Log one line now (the fields logged, or None when it stayed idle)."""
        at = self.clock()
        fields, message, idle = self.measure(at - self._last_at)
        self._last_at = at
        if idle and self._was_idle:
            return None
        self._was_idle = idle
        self.logger.info(message, extra={**fields, "_fields_in_msg": True})
        return fields

    def start(self):
        if self.interval_s > 0:
            threading.Thread(target=self._run, name=self.thread_name, daemon=True).start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - a stats line must never end the process
                self.logger.exception("stats line failed")

    def stop(self) -> None:
        self._stop.set()


def per_s(count: float, seconds: float) -> float:
    """``count`` over ``seconds``, rounded to a tenth."""
    return round(count / max(seconds, 1e-9), 1)


def pct(x: float | None) -> str:
    """A ratio as a percentage (``n/a`` for None)."""
    return "n/a" if x is None else f"{100 * x:.1f}%"

"""``fleet batch`` progress: lines done out of the file's (earlier runs' lines included), %,
rates and an ETA; redrawn in place on a terminal, a plain line every few seconds otherwise
(a log file, CI)."""
from __future__ import annotations

import sys
import time
from typing import TextIO


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


class Progress:
    def __init__(self, total: int, already: int, *, quiet: bool = False, every_s: float = 10.0,
                 stream: TextIO | None = None) -> None:
        self.total, self.already = total, already
        self.quiet = quiet
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.every_s = 0.5 if self.tty else every_s
        self.done = self.tokens = self.failed = 0
        self.t0 = time.perf_counter()
        self._last = self.t0

    @property
    def written(self) -> int:
        """Output lines, this run's and earlier runs'."""
        return self.already + self.done

    def add(self, tokens: int, failed: bool) -> None:
        self.done += 1
        self.tokens += tokens
        self.failed += int(failed)
        now = time.perf_counter()
        if now - self._last >= self.every_s or self.written >= self.total:
            self._last = now
            self.show()

    def line(self) -> str:
        dt = max(time.perf_counter() - self.t0, 1e-9)
        rate = self.done / dt
        pct = 100.0 * self.written / self.total if self.total else 100.0
        left = max(self.total - self.written, 0)
        eta = _duration(left / rate) if rate > 0 else ("0m00s" if not left else "?")
        return (f"{self.written}/{self.total} lines ({pct:.1f}%)  {rate:.2f} req/s  "
                f"{self.tokens / dt:.1f} tok/s  {self.failed} failed  ETA {eta}")

    def show(self) -> None:
        if self.quiet:
            return
        if self.tty:
            self.stream.write("\r" + self.line() + " ")
        else:
            self.stream.write(self.line() + "\n")
        self.stream.flush()

    def end(self) -> None:
        if not self.quiet and self.tty:
            self.stream.write("\n")
            self.stream.flush()

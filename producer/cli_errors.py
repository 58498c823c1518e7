"""How producer commands end on an error they expect: one line on stderr, an exit code."""
from __future__ import annotations

import sys

from redis.exceptions import RedisClusterException, RedisError

from producer.gateway.redact import redact

REDIS_ERRORS = (RedisError, RedisClusterException)
EXIT_FILE, EXIT_REDIS = 2, 3


def redis_failed(command: str, url: str, exc: BaseException) -> int:
    """``fleet COMMAND: Redis at URL (password hidden): Error: message``; returns 3."""
    sys.stderr.write(f"fleet {command}: Redis at {redact(url)}: {type(exc).__name__}: "
                     f"{redact(str(exc))}\n")
    return EXIT_REDIS

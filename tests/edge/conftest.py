"""Fixtures: a real redis-server per test, real worker processes (see fleet_harness)."""
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from fleet_harness import r, redis_server, tiny_model, workers  # noqa: E402,F401

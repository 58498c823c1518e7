"""Fixtures of the operations tests: real redis-servers (plain, with the project's ACL file),
real worker processes with their metrics port, and a scraper."""
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from fleet_harness import r, redis_server, tiny_model, workers  # noqa: E402,F401

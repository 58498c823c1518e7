"""Fixtures of the conformance suite: the TypeScript client built once (skipped with a clear
message where Node/npm are missing or the install fails), a real redis-server with one real
worker per module, and a recorder of every message published there (validated against
docs/protocol.schema.json at the end of the module)."""
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from fleet_harness import r, redis_server, tiny_model, workers  # noqa: F401

from tests.conformance.harness import clients, fleet, node_client, recorder  # noqa: F401

"""Fixtures of the operations tests: real redis-servers (plain, with the project's ACL file),
real worker processes with their metrics port, and a scraper."""
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from fleet_harness import r, redis_server, tiny_model, workers  # noqa: E402,F401

import pytest  # noqa: E402
import redis  # noqa: E402
from fleet_harness import WorkerFactory  # noqa: E402
from ops_harness import AclRedisServer, make_tls_cert, render_acl  # noqa: E402

from shared import keys, tenants  # noqa: E402
from shared.tenants import TenantConfig  # noqa: E402

TENANTS = {"default": TenantConfig(name="default", lanes=list(keys.LANES)),
           "acme": TenantConfig(name="acme", lanes=["high", "default"]),  # as users.acl has them
           "globex": TenantConfig(name="globex", lanes=["default", "batch"])}


@pytest.fixture
def acl_server(tmp_path):
    """The project's ACL file, over TLS only (rediss://) where openssl can make a cert;
    the tenants of users.acl registered."""
    acl = tmp_path / "users.acl"
    server = AclRedisServer(acl, render_acl(acl), make_tls_cert(tmp_path)).start()
    admin = redis.Redis.from_url(server.url_for("fleet-admin"))
    admin.hset(keys.tenants_key(), mapping={n: tenants.encode(c) for n, c in TENANTS.items()})
    yield server
    server.stop()


@pytest.fixture
def acl_workers(acl_server, tiny_model, tmp_path):  # noqa: F811 - the fixture imported above
    factory = WorkerFactory(acl_server, tiny_model, tmp_path)
    yield factory
    factory.cleanup()

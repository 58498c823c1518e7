"""Helpers of the operations tests: HTTP probes, a Prometheus-text scraper, and a
redis-server that runs the project's ACL file (ops/redis/users.acl, rendered)."""
from __future__ import annotations

import hashlib
import secrets
import shutil
import socket
import ssl
import string
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families
from redis.exceptions import NoPermissionError, ResponseError
from redis_server import REPO, RedisServer

ACL_TEMPLATE = REPO / "ops" / "redis" / "users.acl"
ACL_USERS = {  # user -> the template's password variable
    "fleet-admin": "FLEET_ADMIN_PASSWORD", "fleet-worker": "FLEET_WORKER_PASSWORD",
    "fleet-producer": "FLEET_PRODUCER_PASSWORD", "fleet-gateway": "FLEET_GATEWAY_PASSWORD",
    "fleet-exporter": "FLEET_EXPORTER_PASSWORD",
    "fleet-keda": "FLEET_KEDA_PASSWORD", "tenant-acme": "FLEET_TENANT_ACME_PASSWORD",
    "tenant-globex": "FLEET_TENANT_GLOBEX_PASSWORD",
}


def http_get(url: str, timeout: float = 5.0) -> tuple[int | None, str]:
    """(status, body); status None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return None, str(exc)


def parse_metrics(text: str) -> dict[tuple[str, tuple], float]:
    """Samples as {(sample name, sorted label items): value}."""
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples: dict, name: str, **labels) -> float:
    """Sum of the samples named ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, lbl), v in samples.items() if n == name and want <= set(lbl))


def render_acl(path: Path) -> dict[str, str]:
    """Write the ACL template with fresh random passwords; return user -> password."""
    passwords = {user: secrets.token_hex(12) for user in ACL_USERS}
    mapping = {f"{var}_SHA256": hashlib.sha256(passwords[user].encode()).hexdigest()
               for user, var in ACL_USERS.items()}
    path.write_text(string.Template(ACL_TEMPLATE.read_text()).substitute(mapping))
    return passwords


def make_tls_cert(directory: Path) -> Path | None:
    """A self-signed certificate for 127.0.0.1 (cert.pem, key.pem); None without openssl."""
    if shutil.which("openssl") is None:
        return None
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(directory / "key.pem"), "-out", str(directory / "cert.pem"),
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    return directory / "cert.pem"


class AclRedisServer(RedisServer):
    """A redis-server that loads a rendered users.acl, TLS-only when given a certificate.
    ``url`` is the worker's (so the worker harness runs workers as ``fleet-worker``);
    ``url_for(user)`` any user's (``rediss://...?ssl_ca_certs=...`` with TLS)."""

    def __init__(self, acl_path: Path, passwords: dict[str, str], cert: Path | None = None,
                 conf: Path | None = None):
        super().__init__()
        self.acl_path, self.passwords, self.cert, self.conf = acl_path, passwords, cert, conf

    def url_for(self, user: str) -> str:
        if self.cert is None:
            return f"redis://{user}:{self.passwords[user]}@127.0.0.1:{self.port}/0"
        return (f"rediss://{user}:{self.passwords[user]}@127.0.0.1:{self.port}/0"
                f"?ssl_ca_certs={self.cert}")

    @property
    def url(self) -> str:
        return self.url_for("fleet-worker")

    def start(self) -> "AclRedisServer":
        self.proc = subprocess.Popen(
            [self.binary, *self._config(), *self._listen(), "--bind", "127.0.0.1",
             "--dir", self.dir, "--aclfile", str(self.acl_path), "--loglevel", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 10
        while not _answers(self.port, tls=self.cert is not None):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                err = self.proc.stderr.read().decode() if self.proc.poll() is not None else ""
                raise RuntimeError(f"redis-server with {self.acl_path} did not start: {err}")
            time.sleep(0.02)
        return self

    def _config(self) -> list[str]:
        """ops/redis/redis.conf (paths overridden here) or a throwaway, unpersisted server."""
        return [str(self.conf)] if self.conf else ["--save", "", "--appendonly", "no"]

    def _listen(self) -> list[str]:
        if self.cert is None:
            return ["--port", str(self.port)]
        key = self.cert.with_name("key.pem")
        return ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file", str(self.cert),
                "--tls-key-file", str(key), "--tls-ca-cert-file", str(self.cert),
                "--tls-auth-clients", "no"]


def _answers(port: int, *, tls: bool = False) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as raw:
            if tls:
                context = ssl.create_default_context()
                context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
                with context.wrap_socket(raw) as s:
                    s.sendall(b"PING\r\n")
                    return s.recv(16).startswith((b"+PONG", b"-NOAUTH"))
            raw.sendall(b"PING\r\n")
            return raw.recv(16).startswith((b"+PONG", b"-NOAUTH"))
    except OSError:
        return False


def _client(server: AclRedisServer, user: str) -> redis.Redis:
    return redis.Redis.from_url(server.url_for(user))


def _denied(call) -> None:
    with pytest.raises((NoPermissionError, ResponseError)) as info:
        call()
    assert "NOPERM" in str(info.value) or "permission" in str(info.value).lower()

"""The two clients behind one interface, and the fixtures of the conformance suite.

A :class:`Run` is one request as a client saw it: the payload it sent, every token event it
took (after its seq rule), then its terminal event (or its own error). The Python client
runs in a thread of its own; the TypeScript client is its CLI (``fleet-ts stream --json``)
in a subprocess, one JSON line per message.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

import jsonschema
import pytest
import redis
from fleet_harness import WorkerFactory
from redis_server import RedisServer

from shared import codec, keys
from shared.schema import protocol_schema
from shared.tenants import TenantConfig, acl_user
from shared.tenants import encode as encode_tenant

REPO = Path(__file__).resolve().parents[2]
TS_DIR = REPO / "producer" / "typescript"
RECORD_ENV = "FLEET_RECORD_TRAFFIC"  # a path: write what a module recorded there (JSON lines)
POLL_S = 1.0


class Run:
    def __init__(self, client: str) -> None:
        self.client = client
        self.request: dict | None = None
        self.events: list[dict] = []
        self.final: dict | None = None
        self._cv = threading.Condition()

    def add(self, kind: str, value) -> None:
        with self._cv:
            if kind == "request":
                self.request = value
            elif kind == "token":
                self.events.append(value)
            else:
                self.final = {kind: value}
            self._cv.notify_all()

    def tokens(self) -> list[int]:
        with self._cv:
            return [t for e in self.events for t in e["token_ids"]]

    def wait_tokens(self, n: int, timeout: float = 60) -> None:
        with self._cv:
            if not self._cv.wait_for(lambda: self.final is not None or
                                     sum(len(e["token_ids"]) for e in self.events) >= n, timeout):
                raise AssertionError(f"{self.client}: fewer than {n} tokens in {timeout} s")

    def wait(self, timeout: float = 60) -> dict:
        with self._cv:
            if not self._cv.wait_for(lambda: self.final is not None, timeout):
                raise AssertionError(f"{self.client}: no terminal event in {timeout} s "
                                     f"({len(self.events)} token events)")
            return self.final

    def result(self, timeout: float = 60) -> dict:
        final = self.wait(timeout)
        assert "result" in final, f"{self.client}: {final}"
        return final["result"]

    def messages(self) -> list[dict]:
        """What this run sent and received, as protocol messages."""
        return ([self.request] if self.request else []) + self.events + \
            [v for k, v in (self.final or {}).items() if k in ("result", "failure")]


def _plain(event) -> dict:
    return json.loads(codec.encode(event))


class PythonClient:
    name = "python"

    def __init__(self, url: str, tenant: str = "default") -> None:
        self.url, self.tenant = url, tenant

    def stream(self, fields: dict, *, cancel_after: int | None = None) -> Run:
        return self._start(Run(self.name), fields, None, cancel_after)

    def watch(self, request_id: str) -> Run:
        return self._start(Run(self.name), None, request_id, None)

    def _start(self, run: Run, fields, watch_id, cancel_after) -> Run:
        threading.Thread(target=lambda: asyncio.run(self._run(run, fields, watch_id, cancel_after)),
                         daemon=True).start()
        return run

    async def _run(self, run: Run, fields, watch_id, cancel_after) -> None:
        from producer import AsyncFleetClient, RequestFailed
        try:
            async with AsyncFleetClient(self.url, tenant=self.tenant, poll_s=POLL_S) as fleet:
                if watch_id is not None:
                    stream = await fleet.watch(watch_id)
                else:
                    request = fleet.make_request(**fields)
                    run.add("request", _plain(request))
                    stream = await fleet.submit(request)
                cancelled = False
                async for token in stream:
                    run.add("token", _plain(token))
                    if cancel_after is not None and not cancelled and len(run.tokens()) >= cancel_after:
                        cancelled = True
                        await fleet.cancel(stream.request_id)
                try:
                    run.add("result", _plain(await stream.result()))
                except RequestFailed as exc:
                    run.add("failure", _plain(exc.failure))
        except Exception as exc:  # noqa: BLE001 - the test reads it from the run
            run.add("error", {"error": type(exc).__name__, "code": getattr(exc, "code", None),
                              "message": str(exc)})


class NodeTool:
    """The built TypeScript package: its CLI and its test scripts."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.cli = str(TS_DIR / "dist" / "src" / "cli.js")

    def run_json(self, script: str, *args: str, timeout: float = 60):
        proc = subprocess.run([self.node, str(TS_DIR / "dist" / script), *args],
                              check=False, capture_output=True, text=True, timeout=timeout)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)


class TypeScriptClient:
    name = "typescript"

    def __init__(self, tool: NodeTool, url: str, tenant: str = "default") -> None:
        self.tool, self.url, self.tenant = tool, url, tenant
        self.procs: list[subprocess.Popen] = []

    def stream(self, fields: dict, *, cancel_after: int | None = None) -> Run:
        extra = [] if cancel_after is None else ["--cancel-after", str(cancel_after)]
        return self._start(["stream", "--request", json.dumps(fields), *extra])

    def watch(self, request_id: str) -> Run:
        return self._start(["watch", request_id])

    def _start(self, args: list[str]) -> Run:
        run = Run(self.name)
        proc = subprocess.Popen([self.tool.node, self.tool.cli, *args, "--json", "--url", self.url,
                                 "--tenant", self.tenant, "--poll-ms", str(int(POLL_S * 1000))],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.procs.append(proc)

        def read() -> None:
            for line in proc.stdout:
                message = json.loads(line)
                ((kind, value),) = message.items() if "error" not in message else (("error", message),)
                run.add(kind, value)
            proc.wait()
            if run.final is None:
                run.add("error", {"error": f"exit {proc.returncode}", "code": None,
                                  "message": proc.stderr.read()})
        threading.Thread(target=read, daemon=True).start()
        return run

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)


# --- fixtures -------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def node_client() -> NodeTool:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("TypeScript client not tested: node and npm are not on PATH "
                    "(install Node.js >= 18 with npm; producer/typescript/build.sh builds it)")
    proc = subprocess.run(["bash", str(TS_DIR / "build.sh")], check=False, capture_output=True,
                          text=True, timeout=600)
    if proc.returncode in (3, 4):  # no node/npm, or `npm ci` failed (no registry)
        pytest.skip(f"TypeScript client not tested: {proc.stderr.strip()[-500:]}")
    assert proc.returncode == 0, f"producer/typescript/build.sh failed:\n{proc.stdout}\n{proc.stderr}"
    return NodeTool(node)


@pytest.fixture(params=["python", "typescript"])
def clients(request):
    """A factory ``make(url, tenant=...)`` of one client kind (each test runs with both)."""
    made: list = []

    def make(url: str, tenant: str = "default"):
        if request.param == "python":
            return PythonClient(url, tenant)
        client = TypeScriptClient(request.getfixturevalue("node_client"), url, tenant)
        made.append(client)
        return client
    make.kind = request.param
    yield make
    for client in made:
        client.close()


class Recorder:
    """Every message published under ``fleet:req:*`` and on the control channel (raw, as the
    worker wrote it), plus what the clients sent and took."""

    def __init__(self, url: str | None) -> None:
        self.messages: list[dict] = []
        self._lock = threading.Lock()
        self._pubsub = None
        if url is not None:
            self._client = redis.Redis.from_url(url)
            self._pubsub = self._client.pubsub(ignore_subscribe_messages=True)
            self._pubsub.psubscribe("fleet:req:*", "fleet:*:control")
            threading.Thread(target=self._listen, daemon=True).start()

    def _listen(self) -> None:
        while True:
            try:
                message = self._pubsub.get_message(timeout=0.2)
            except (redis.ConnectionError, ValueError, AttributeError):
                return
            if message is not None and message["type"] == "pmessage":
                self.add([json.loads(message["data"])])

    def add(self, messages: list[dict]) -> None:
        with self._lock:
            self.messages.extend(messages)

    def close(self) -> None:
        if self._pubsub is not None:
            self._pubsub.close()
            self._client.close()


def schema_check(messages: list[dict], tool: NodeTool | None, tmp: Path) -> None:
    """Every message is valid against docs/protocol.schema.json, for jsonschema (Python)
    and, where the TypeScript package is built, for Ajv (JavaScript)."""
    schema = json.loads((REPO / "docs" / "protocol.schema.json").read_text())
    assert schema == protocol_schema()
    validator = jsonschema.Draft202012Validator(schema)
    bad = [(m, e.message) for m in messages for e in list(validator.iter_errors(m))[:1]]
    assert not bad, bad[:5]
    if tool is not None:
        (tmp / "requests.json").write_text("[]")
        (tmp / "messages.json").write_text(json.dumps(messages))
        out = tool.run_json("test/corpus_check.js", str(REPO / "docs" / "protocol.schema.json"),
                            str(tmp / "requests.json"), str(tmp / "messages.json"))
        ajv_bad = [(m, e) for m, e in zip(messages, out["messages"]) if e is not None]
        assert not ajv_bad, ajv_bad[:5]


def maybe_node(request) -> NodeTool | None:
    try:
        return request.getfixturevalue("node_client")
    except pytest.skip.Exception:
        return None


ACME = TenantConfig(name="acme", lanes=["high", "default"])
ACME_PASSWORD = "acme-secret"


def acl_setuser_args(rule: str) -> list[str]:
    """``ACL SETUSER`` arguments of a rendered ACL file line (selectors stay one argument)."""
    parts = re.findall(r"\([^)]*\)|\S+", rule)
    assert parts[0] == "user"
    return parts[1:]


class Fleet:
    def __init__(self, url: str, server, factory: WorkerFactory, recorder: Recorder) -> None:
        self.url, self.server, self.factory, self.recorder = url, server, factory, recorder
        self.r = redis.Redis.from_url(url)

    def tenant_url(self, name: str = "acme", password: str = ACME_PASSWORD) -> str:
        return self.url.replace("redis://", f"redis://tenant-{name}:{password}@")


@pytest.fixture(scope="module")
def fleet(tiny_model, tmp_path_factory):
    """One redis-server with the tenants ``default`` and ``acme`` (and acme's ACL user), one
    worker that coalesces each request's tokens for 25 ms (so events carry several tokens:
    the seq rule's general case), and a recorder."""
    server = RedisServer().start()
    tmp = tmp_path_factory.mktemp("conformance")
    setup = redis.Redis.from_url(server.url)
    setup.hset(keys.tenants_key(), mapping={
        "default": encode_tenant(TenantConfig(name="default", lanes=["high", "default", "batch"])),
        "acme": encode_tenant(ACME)})
    digest = hashlib.sha256(ACME_PASSWORD.encode()).hexdigest()
    setup.execute_command("ACL", "SETUSER", *acl_setuser_args(acl_user(ACME, digest)))
    setup.close()
    factory = WorkerFactory(server, tiny_model, tmp)
    recorder = Recorder(server.url)
    try:
        factory.start(stream_interval_ms=25)
        yield Fleet(server.url, server, factory, recorder)
    finally:
        factory.cleanup()
        recorder.close()
        server.stop()
    record(recorder.messages)


def record(messages: list[dict]) -> None:
    """Append ``messages`` (each distinct one once, at most 12 token events a request) to the
    file named by $FLEET_RECORD_TRAFFIC: how tests/shared/recorded_traffic.jsonl is made."""
    path = os.environ.get(RECORD_ENV)
    if not path:
        return
    seen, tokens, lines = set(), {}, []
    for m in messages:
        line = json.dumps(m, sort_keys=True)
        if line in seen:
            continue
        if m.get("type") == "token":
            tokens[m["request_id"]] = tokens.get(m["request_id"], 0) + 1
            if tokens[m["request_id"]] > 12:
                continue
        seen.add(line)
        lines.append(line + "\n")
    with open(path, "a") as f:
        f.writelines(lines)


@pytest.fixture(scope="module")
def recorder(fleet) -> Recorder:
    return fleet.recorder


def wait_until(predicate, timeout: float = 30, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
    return value

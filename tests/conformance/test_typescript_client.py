"""The TypeScript client without a worker: its own unit tests (node:test), its names and
limits against the Python ones, its request check and Ajv against the worker's decoder on
the boundary corpus of tests/shared/test_schema.py."""
from __future__ import annotations

import json
import subprocess

from shared import keys, limits
from shared.schema import protocol_schema
from tests.conformance.harness import REPO, TS_DIR
from tests.shared.schema_check import decoder_accepts
from tests.shared.test_schema import request_corpus

# Where the worker of this version is more lenient than the protocol (docs/protocol.md,
# "Known gaps"): the TypeScript client and Ajv refuse these, the worker still takes them.
KNOWN_GAPS: set[str] = set()  # none left (seed bounded, no trailing newline in names)


def test_the_typescript_unit_tests_pass(node_client):
    proc = subprocess.run([node_client.node, "--test", str(TS_DIR / "dist/test/stream.test.js"),
                           str(TS_DIR / "dist/test/validate.test.js"),
                           str(TS_DIR / "dist/test/choices.test.js")],
                          check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]


def test_names_and_limits_are_the_python_ones(node_client):
    out = json.loads(subprocess.run([node_client.node, node_client.cli, "constants"], check=True,
                                    capture_output=True, text=True, timeout=60).stdout)
    for name, value in out["limits"].items():
        if hasattr(limits, name):
            assert getattr(limits, name) == value, name
    assert out["limits"]["MAX_SAFE_INTEGER"] == 2**53 - 1
    assert tuple(out["lanes"]) == keys.LANES
    assert out["keys"] == {
        "stream": keys.stream_key("m", "acme", "high"), "legacy_stream": keys.legacy_stream_key("m", "batch"),
        "tenants": keys.tenants_key(), "dead": keys.dead_letter_key("m"),
        "control": keys.control_channel("m"), "workers": keys.workers_key("m"),
        "worker": keys.worker_key("m", "w1"), "state": keys.state_key("acme", "q-1"),
        "progress": keys.progress_key("acme", "q-1"), "cancel": keys.cancel_key("acme", "q-1"),
        "channel": keys.channel("acme", "q-1")}


def test_the_client_field_table_is_the_schema(node_client):
    fields = json.loads(subprocess.run([node_client.node, node_client.cli, "constants"], check=True,
                                       capture_output=True, text=True, timeout=60).stdout)["fields"]
    props = protocol_schema()["$defs"]["Request"]["properties"]
    assert set(fields) == set(props)
    for name, spec in fields.items():
        schema = next(b for b in props[name].get("anyOf", [props[name]]) if b.get("type") != "null")
        if spec["kind"] in ("int", "num"):
            assert spec["min"] == schema.get("minimum", schema.get("exclusiveMinimum")), name
            assert spec["max"] == schema["maximum"], name
            assert bool(spec.get("exclusiveMin")) == ("exclusiveMinimum" in schema), name
        elif spec["kind"] == "str":
            assert spec.get("pattern") == schema.get("pattern"), name
            if "maxLength" in schema:
                assert spec["maxLength"] == schema["maxLength"], name
        elif spec["kind"] in ("list", "chat"):
            assert spec["maxItems"] == schema["maxItems"], name
        elif spec["kind"] == "enum":
            assert sorted(spec["values"]) == sorted(schema["enum"]), name


def test_ajv_and_the_client_accept_what_the_worker_decodes(node_client, tmp_path):
    corpus = request_corpus()
    (tmp_path / "requests.json").write_text(json.dumps([payload for _, payload in corpus]))
    (tmp_path / "messages.json").write_text("[]")
    out = node_client.run_json("test/corpus_check.js", str(REPO / "docs" / "protocol.schema.json"),
                               str(tmp_path / "requests.json"), str(tmp_path / "messages.json"))
    disagree = []
    for (label, payload), verdict in zip(corpus, out["requests"]):
        worker = decoder_accepts(payload)
        if (verdict["ajv"], verdict["client"]) != (worker, worker) and label not in KNOWN_GAPS:
            disagree.append((label, worker, verdict))
    assert len(out["requests"]) == len(corpus) > 300
    assert not disagree, disagree

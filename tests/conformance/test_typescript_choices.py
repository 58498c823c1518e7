"""The TypeScript client with ``n`` > 1 and ``id_conflict``, against a real worker on a real
redis-server: its request digest is byte for byte shared/digest.py's (on a corpus), n=3
streamed equals the stored result per choice, a seed repeats every choice, a reused id with
another request is a typed ``IdConflictError``, and a worker killed mid-stream with n=2
still gives every choice's tokens exactly once."""
from __future__ import annotations

import json
import random
import signal
import subprocess

from shared import codec, keys
from shared.digest import request_digest
from tests.conformance.harness import TS_DIR, TypeScriptClient, wait_until
from tests.shared.schema_check import decoder_accepts
from tests.shared.test_schema import request_corpus

PROMPT = [1, 504, 3058, 314, 4649, 30, 9876, 42] * 3
SAMPLED = {"prompt_token_ids": PROMPT, "temperature": 1.0, "ignore_eos": True, "seed": 11}

EXTRA = [  # what the boundary corpus does not mix: floats of every form, structs, Unicode, keys
    {"request_id": "f", "prompt": "x", "temperature": 1, "top_p": 0.5, "min_p": 1e-7, "repetition_penalty": 1.1,
     "presence_penalty": -2, "frequency_penalty": 0.30000000000000004, "seed": 2**53 - 1, "n": 16},
    {"request_id": "f2", "prompt": "x", "temperature": 0.00001, "min_p": 0.000015, "top_p": 1e-300},
    {"request_id": "m", "messages": [{"content": "h\u00e9\u2028\x00\x1f\x7f\U0001F600\"\\/", "role": "user"}],
     "stop": ["\n\n", "\t"], "stop_token_ids": [0, 2], "logprobs": 3, "speculative": False, "ignore_eos": True},
    {"request_id": "s", "prompt": "x", "structured": {"schema": {"type": "object", "b": 1.0, "1": [1e21, 2.5e-9, -0.0],
                                                                  "a": {"z": None, "y": True, "2": "t"}},
                                                       "type": "json_schema"}},
    {"request_id": "g", "prompt_token_ids": [0, 49151], "structured": {"type": "choice", "choices": ["a", "b"]},
     "tenant": "acme", "priority": "batch", "deadline": 4e9, "metadata": {"k": "v"}, "submitted_at": 1.5e9},
    {"request_id": "r", "prompt": "", "max_tokens": 1, "min_tokens": 1, "top_k": 2**31 - 1,
     "structured": {"type": "regex", "pattern": "[a-z]+"}},
]


def _random_requests(count: int, seed: int = 5) -> list[dict]:
    """Requests with random values of every kind: floats of any magnitude, Unicode, choices."""
    rng = random.Random(seed)
    text = lambda: "".join(chr(rng.choice([rng.randrange(32, 127), rng.randrange(0, 0x2100),
                                              rng.randrange(0x1F300, 0x1F700)])) for _ in range(rng.randrange(8)))
    tiny = lambda hi: rng.choice([rng.uniform(0, hi), hi * 10.0 ** -rng.randrange(1, 300), float(rng.randrange(int(hi) + 1))])
    out = []
    for i in range(count):
        r = {"request_id": f"rnd-{i}", rng.choice(["prompt", "messages", "prompt_token_ids"]): None}
        form = next(iter(k for k in r if k != "request_id"))
        r[form] = {"prompt": text, "messages": lambda: [{"role": "user", "content": text()}],
                   "prompt_token_ids": lambda: [rng.randrange(49152) for _ in range(3)]}[form]()
        for name, value in [("temperature", lambda: tiny(100.0)), ("top_p", lambda: max(tiny(1.0), 1e-9)),
                            ("min_p", lambda: tiny(1.0)), ("presence_penalty", lambda: rng.uniform(-2, 2)),
                            ("repetition_penalty", lambda: max(tiny(100.0), 0.01)), ("n", lambda: rng.randrange(1, 17)),
                            ("seed", lambda: rng.randrange(2**53)), ("max_tokens", lambda: rng.randrange(16, 100)),
                            ("stop", lambda: [text() or "x"]), ("logprobs", lambda: rng.randrange(5)),
                            ("metadata", lambda: {text(): text()}), ("submitted_at", lambda: rng.uniform(0, 2e9))]:
            if rng.random() < 0.5:
                r[name] = value()
        out.append(r)
    return out


def _ts(node_client, script: str, *args: str, timeout: float = 120) -> dict:
    proc = subprocess.run([node_client.node, str(TS_DIR / "dist" / "test" / script), *args],
                          check=False, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_the_digest_is_byte_identical_to_python(node_client, tmp_path):
    corpus = [p for _, p in request_corpus() if decoder_accepts(p)] + EXTRA + _random_requests(300)
    assert all(decoder_accepts(p) for p in corpus[-300:])
    (tmp_path / "requests.json").write_text(json.dumps(corpus))
    out = _ts(node_client, "digest_check.js", str(tmp_path / "requests.json"))
    assert len(out["digests"]) == len(corpus) > 200
    wrong = []
    for payload, canonical, digest in zip(out["payloads"], out["canonical"], out["digests"]):
        request = codec.decode_request(payload.encode())  # what a worker decodes from the client
        canon = codec.encode(type(request)(**{**{f: getattr(request, f) for f in request.__struct_fields__},
                                              "tenant": None, "priority": "default", "deadline": None,
                                              "submitted_at": None, "metadata": {}}))
        if (canonical.encode(), digest) != (canon, request_digest(request)):
            wrong.append((payload, canonical, canon.decode()))
    assert not wrong, wrong[:3]


def _by_choice(events: list[dict]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for e in events:
        index = e.get("index", 0)
        assert e["seq"] == len(out.get(index, [])), f"seq rule broken in choice {index}: {e}"
        out.setdefault(index, []).extend(e["token_ids"])
    return out


def test_three_choices_stream_their_stored_result_and_a_seed_repeats(fleet, node_client):
    ts = TypeScriptClient(node_client, fleet.url)
    try:
        runs = [ts.stream({**SAMPLED, "n": 3, "max_tokens": 30, "request_id": rid}) for rid in ("ts-three", "ts-three-again")]
        results = [run.result(90) for run in runs]
    finally:
        ts.close()
    stored = json.loads(fleet.r.hget(keys.state_key("default", "ts-three"), "result"))
    assert results[0] == stored
    choices = [{c["index"]: c["token_ids"] for c in r["choices"]} for r in results]
    assert list(choices[0]) == [0, 1, 2]
    for run, by_index in zip(runs, choices):
        assert _by_choice(run.events) == by_index                      # every choice, once, in order
        assert all(len(ids) == 30 for ids in by_index.values())
    assert len({tuple(ids) for ids in choices[0].values()}) == 3       # differ under sampling
    assert choices[1] == choices[0]                                     # the seed reproduces all n
    assert results[0]["token_ids"] == choices[0][0] and results[0]["usage"]["completion_tokens"] == 90
    fleet.recorder.add([m for run in runs for m in run.messages()])


def test_a_reused_id_with_another_request_is_a_typed_id_conflict(fleet, node_client):
    original = _ts(node_client, "generate_check.js", fleet.url,
                   json.dumps({**SAMPLED, "n": 2, "max_tokens": 8, "request_id": "ts-job"}))
    assert original["result"]["choices"] and original["tokens"] == 16
    conflict = _ts(node_client, "generate_check.js", fleet.url,
                   json.dumps({**SAMPLED, "n": 2, "max_tokens": 9, "request_id": "ts-job"}))
    assert conflict == {**conflict, "tokens": 0, "error": "IdConflictError", "code": "id_conflict",
                        "idConflict": True, "requestFailed": True}
    # A retry of the same request (another deadline, metadata, lane) is no conflict: the stored answer.
    retry = _ts(node_client, "generate_check.js", fleet.url, json.dumps(
        {**SAMPLED, "n": 2, "max_tokens": 8, "request_id": "ts-job", "deadline": 4e9,
         "metadata": {"try": "2"}, "priority": "high"}))
    assert retry["result"] == original["result"]
    # Refused before sending: no worker ever saw the conflicting entry (it would store its failure).
    assert not [f for f in fleet.r.hkeys(keys.state_key("default", "ts-job")) if f.startswith(b"conflict:")]


def test_a_conflicting_entry_queued_before_either_began_fails_typed(fleet, node_client):
    """Both queued before the worker begins either (the check before sending sees no digest):
    the worker stores the second entry's failure under its entry id; the client ends typed."""
    stream = keys.stream_key("default", "default", "default")
    first = {**SAMPLED, "max_tokens": 6, "request_id": "ts-race", "v": 1}
    worker = fleet.factory.procs[0]
    worker.signal(signal.SIGSTOP)
    try:
        fleet.r.xadd(stream, {keys.STREAM_FIELD: json.dumps(first)})
        late = subprocess.Popen([node_client.node, str(TS_DIR / "dist/test/generate_check.js"), fleet.url,
                                 json.dumps({**SAMPLED, "max_tokens": 5, "request_id": "ts-race"})],
                                stdout=subprocess.PIPE, text=True)
        wait_until(lambda: [e for _, e in fleet.r.xrange(stream, count=10_000)
                            if b"ts-race" in e[keys.STREAM_FIELD.encode()]][1:], 30, "both queued")
    finally:
        worker.signal(signal.SIGCONT)
    out = json.loads(late.communicate(timeout=90)[0])
    assert out["error"] == "IdConflictError" and out["code"] == "id_conflict" and out["tokens"] == 0, out
    result = json.loads(wait_until(lambda: fleet.r.hget(keys.state_key("default", "ts-race"), "result"), 60, "the result"))
    assert len(result["token_ids"]) == 6                                # the first entry's answer


def test_a_worker_killed_mid_stream_with_two_choices_gives_every_token_once(fleet, node_client):
    fleet.factory.start(stream_interval_ms=25)  # a second worker to resume on (this test runs last)
    ts = TypeScriptClient(node_client, fleet.url)
    try:
        reference = ts.stream({**SAMPLED, "n": 2, "max_tokens": 300, "request_id": "ts-ref"}).result(120)
        run = ts.stream({**SAMPLED, "n": 2, "max_tokens": 300, "request_id": "ts-victim"})
        run.wait_tokens(40, 90)
        owner = fleet.r.hget(keys.state_key("default", "ts-victim"), "owner").decode().split("#")[0]
        next(w for w in fleet.factory.procs if w.worker_id == owner).signal(signal.SIGKILL)
        result = run.result(120)
    finally:
        ts.close()
    assert result["worker_id"] != owner and result["num_resumes"] >= 1
    want = {c["index"]: c["token_ids"] for c in reference["choices"]}
    assert _by_choice(run.events) == want                        # each choice exactly once, in order
    assert {c["index"]: c["token_ids"] for c in result["choices"]} == want

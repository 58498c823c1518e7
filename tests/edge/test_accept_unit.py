"""accept() in-process, against a fake Redis IO: each entry's fate, whatever its neighbours
do. The subprocess tests (test_edge_*.py) cover the same paths against a real server."""
from __future__ import annotations

import asyncio
import json

import pytest
from redis.exceptions import OutOfMemoryError, ResponseError

from gpu_worker.edge import accept as accept_mod
from gpu_worker.edge.accept import accept
from gpu_worker.edge.inflight import Entry
from gpu_worker.edge.options import WorkerOptions
from shared import codec, errors, keys
from shared.protocol import Token

OPTIONS = WorkerOptions(worker_id="w1", max_deliveries=3)
STREAM = keys.stream_key("default", "default", "default")


class FakeIO:
    """Answers BEGIN from ``begin`` (request id -> reply or exception); records the rest."""

    publish_command = "PUBLISH"

    def __init__(self, begin: dict | None = None, refuse_writes: bool = False) -> None:
        self.begin = begin or {}
        self.refuse_writes = refuse_writes
        self.calls: list[tuple] = []

    async def run(self, calls: list[tuple]) -> list:
        self.calls.extend(calls)
        out = []
        for call in calls:
            if call[:2] == ("script", "begin"):
                request_id = call[2][0].split("/")[1].split("}")[0]
                out.append(self.begin.get(request_id, [b"ok", b"w1#1", b"0", b"1.0", b""]))
            elif self.refuse_writes and call[0] in ("script", "XADD") and call[1] != "ack":
                out.append(OutOfMemoryError("command not allowed when used memory > 'maxmemory'."))
            else:
                out.append(1)
        return out

    def written(self, what: str) -> list[tuple]:
        return [c for c in self.calls if what in c[:2]]


def _entry(payload, n: int = 0, deliveries: int = 1) -> Entry:
    fields = {} if payload is None else {b"data": payload}
    return Entry(stream=STREAM, lane="default", entry_id=f"1-{n}", fields=fields,
                 deliveries=deliveries)


def _valid(request_id: str, **fields) -> bytes:
    return json.dumps({"request_id": request_id, "prompt": "hi", **fields}).encode()


def _accept(io, entries):
    return asyncio.run(accept(io, OPTIONS, entries))


def _dead_codes(io) -> list[str]:
    return [c[c.index("code") + 1] for c in io.written("XADD")]


def test_a_bug_while_decoding_one_entry_ends_that_entry_alone(monkeypatch):
    real = codec.decode_request

    def explode(raw):
        if b"boom" in raw:
            raise RuntimeError("a bug of ours")
        return real(raw)

    monkeypatch.setattr(accept_mod.codec, "decode_request", explode)
    io = FakeIO()
    out = _accept(io, [_entry(_valid("a")), _entry(_valid("boom"), 1), _entry(_valid("c"), 2)])
    assert [inf.request.request_id for inf in out.running] == ["a", "c"]
    assert _dead_codes(io) == [errors.INTERNAL]
    finish = io.written("finish")  # the client of "boom" is told, with a typed failure
    assert len(finish) == 1 and b'"code":"internal"' in finish[0][3][3]
    assert io.written("ack") and out.error is None


def test_the_delivery_count_is_checked_before_the_payload_is_parsed(monkeypatch):
    def never(raw):
        raise AssertionError("a poison entry must not be parsed")

    monkeypatch.setattr(accept_mod.codec, "decode_request", never)
    io = FakeIO()
    out = _accept(io, [_entry(_valid("p"), deliveries=OPTIONS.max_deliveries + 1)])
    assert out.running == [] and _dead_codes(io) == [errors.POISON]
    assert b'"code":"poison"' in io.written("finish")[0][3][3]


def test_deep_and_oversized_entries_are_answered_when_their_id_is_readable():
    deep = b'{"request_id": "deep", "prompt": "x", "metadata": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"
    big = b'{"request_id": "big", "prompt": "' + b"x" * (600 * 1024) + b'"}'
    io = FakeIO()
    out = _accept(io, [_entry(deep), _entry(big, 1), _entry(b"[" * 100_000, 2), _entry(None, 3)])
    assert out.running == []
    assert sorted(_dead_codes(io)) == sorted([errors.TOO_DEEP, errors.TOO_LARGE,
                                              errors.TOO_DEEP, errors.MALFORMED])
    answered = [c[2][0] for c in io.written("finish")]
    assert answered == [keys.state_key("default", "deep"), keys.state_key("default", "big")]


def test_a_server_refusal_hands_entries_back_and_keeps_what_was_begun():
    io = FakeIO(begin={"b": OutOfMemoryError("command not allowed")})
    out = _accept(io, [_entry(_valid("a")), _entry(_valid("b"), 1)])
    assert [inf.request.request_id for inf in out.running] == ["a"]
    assert [e.entry_id for e in out.handback] == ["1-1"]
    assert isinstance(out.error, OutOfMemoryError) and not io.written("ack")


def test_an_ending_the_server_refuses_is_handed_back_not_acked():
    io = FakeIO(refuse_writes=True)
    out = _accept(io, [_entry(b"not json"), _entry(_valid("x", max_tokens=0), 1)])
    assert sorted(e.entry_id for e in out.handback) == ["1-0", "1-1"] and out.error is not None
    assert not io.written("ack")


def test_a_request_whose_keys_a_client_broke_is_dead_lettered():
    io = FakeIO(begin={"wt": ResponseError("WRONGTYPE Operation against a key holding the wrong "
                                           "kind of value")})
    out = _accept(io, [_entry(_valid("wt")), _entry(_valid("fine"), 1)])
    assert [inf.request.request_id for inf in out.running] == ["fine"]
    assert _dead_codes(io) == [errors.INTERNAL] and io.written("ack")


@pytest.mark.parametrize("progress", [[b"garbage"], [b'{"type": "token"}'], [b"[" * 100_000]])
def test_unreadable_stored_progress_fails_that_request_only(progress):
    io = FakeIO(begin={"r": [b"ok", b"w1#2", b"0", b"1.0", b"", *progress]})
    out = _accept(io, [_entry(_valid("r")), _entry(_valid("s"), 1)])
    assert [inf.request.request_id for inf in out.running] == ["s"]
    assert b'"code":"internal"' in io.written("finish")[0][3][3]


def test_stored_progress_resumes_the_sequence():
    events = [codec.encode(Token(request_id="r", seq=0, token_ids=[5, 6], text="ab")),
              codec.encode(Token(request_id="r", seq=2, token_ids=[7], text="c"))]
    io = FakeIO(begin={"r": [b"ok", b"w1#2", b"0", b"1.0", b"2.0", *events]})
    (inf,) = _accept(io, [_entry(_valid("r", max_tokens=10))]).running
    assert inf.prior_token_ids == [5, 6, 7] and inf.prior_text == "abc"
    assert inf.owner == "w1#2" and inf.first_token_at == 2.0

"""The pure parts of the edge: call builders, resume state, lease renewal's reading of its
replies (against a fake Redis IO)."""
from __future__ import annotations

import asyncio

from gpu_worker.edge import calls
from gpu_worker.edge.inflight import Entry, Inflight, resume_state
from gpu_worker.edge.maintenance import renew_leases
from gpu_worker.edge.options import WorkerOptions
from gpu_worker.edge.scripts import RequestKeys
from gpu_worker.edge.state import WorkerState
from shared import codec, keys
from shared.protocol import Request, Token

OPTIONS = WorkerOptions(worker_id="w1", claim_idle_ms=3000)
HIGH, DEFAULT = keys.stream_key("default", "default", "high"), keys.stream_key("default", "default", "default")


def _entry(stream: str, entry_id: str, data: bytes = b"{}") -> Entry:
    return Entry(stream=stream, lane=stream.rsplit(":", 1)[1], entry_id=entry_id,
                 fields={b"data": data})


def _inflight(request_id: str, entry: Entry) -> Inflight:
    return Inflight(request=Request(request_id=request_id, prompt="hi"), entry=entry,
                    owner="w1#1", prior_token_ids=[], prior_text="", first_start=1.0,
                    first_token_at=None)


def test_acks_and_handoffs_are_one_owner_checked_script_per_stream():
    entries = [_entry(HIGH, "1-0"), _entry(DEFAULT, "1-0"), _entry(HIGH, "2-0")]
    assert calls.ack(OPTIONS, entries) == [
        ("script", "ack", [HIGH], [keys.GROUP, "w1", "1-0", "2-0"]),
        ("script", "ack", [DEFAULT], [keys.GROUP, "w1", "1-0"])]
    (first, _) = calls.handoff(OPTIONS, entries)
    assert first[3][:4] == [keys.GROUP, "w1", keys.HANDOFF_CONSUMER, 3001]  # claimable at once


def test_a_dead_letter_keeps_the_head_of_the_payload_and_a_bounded_message():
    call = calls.dead_letter(OPTIONS, _entry(DEFAULT, "1-0", b"x" * 100_000), "malformed", "m" * 5000)
    fields = dict(zip(call[6::2], call[7::2]))
    assert call[:6] == ("XADD", keys.dead_letter_key("default"), "MAXLEN", "~",
                        OPTIONS.dead_letter_maxlen, "*")
    assert len(fields["data"]) == 4096 and len(fields["message"]) == 1000
    assert fields["code"] == "malformed" and fields["entry_id"] == "1-0"
    assert fields["reason"] == "malformed"
    poison = calls.dead_letter(OPTIONS, _entry(DEFAULT, "2-0", b"{}"), "poison", "crashed")
    assert dict(zip(poison[6::2], poison[7::2]))["reason"] == "poison"


def test_publish_and_finish_carry_what_the_scripts_check():
    inf = _inflight("r", _entry(DEFAULT, "1-0"))
    event = Token(request_id="r", seq=3, token_ids=[7, 8], text="ab")
    call = calls.publish(OPTIONS, "PUBLISH", inf, event, None)
    assert call[2] == list(RequestKeys.of("default", "r")) and call[3][5:] == [3, 5]
    assert calls.finish(OPTIONS, "PUBLISH", inf, inf.failure("internal", "x"))[3][4] == ""


def test_resume_state_skips_repeats_and_stops_at_a_gap():
    def ev(seq, ids):
        return codec.encode(Token(request_id="r", seq=seq, token_ids=ids, text=str(ids)))

    assert resume_state([ev(0, [1, 2]), ev(0, [1, 2]), ev(2, [3])]) == ([1, 2, 3], "[1, 2][3]")
    assert resume_state([ev(0, [1]), ev(2, [3])]) == ([1], "[1]")


class FakeIO:
    publish_command = "PUBLISH"

    def __init__(self, replies) -> None:
        self.replies = replies
        self.calls = []

    async def run(self, batch):
        self.calls.extend(batch)
        return [self.replies(call) for call in batch]


class FakeEngine:
    def __init__(self) -> None:
        self.aborted = []

    def abort(self, key, reason):
        self.aborted.append((key, reason))


def test_renewal_reads_each_reply_for_its_own_stream_and_request():
    def replies(call):
        if call[:2] == ("script", "renew"):
            return [b"1-0"] if call[2] == [HIGH] else []  # 1-0 of HIGH was taken over
        return 1 if call[1] == keys.cancel_key("default", "c") else 0

    st = WorkerState(options=OPTIONS, io=FakeIO(replies), engine=FakeEngine())
    for request_id, entry in (("a", _entry(HIGH, "1-0")), ("b", _entry(DEFAULT, "1-0")),
                              ("c", _entry(DEFAULT, "2-0"))):
        inf = _inflight(request_id, entry)
        st.inflight[inf.key] = inf
    asyncio.run(renew_leases(st))
    assert sorted(st.inflight) == ["default/b", "default/c"]  # same id, other stream: kept
    assert st.engine.aborted == [("default/a", "fenced"), ("default/c", "cancelled")]

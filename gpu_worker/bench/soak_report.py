"""The soak's figures, its invariants, and a short human summary.

Client figures are what the client library delivered (the issue's figures: 0 tokens lost,
repeated or reordered); channel figures are the raw pub/sub messages, where the protocol
allows a retried write to publish a copy again, and a listener outage (a Redis restart)
can drop messages, so loss is only counted for requests that lived outside every outage.
"""
from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import asdict

import redis.asyncio as aioredis

from gpu_worker.bench.soak_ledger import ChannelListener, Tally, tally
from gpu_worker.bench.soak_traffic import TRANSIENT, Traffic, ValidRecord
from shared import keys
from shared.failures import is_rejection

_EXAMPLES = 5  # mismatches kept in the report, per kind


def _client_tally(record: ValidRecord, expected: list[int]) -> Tally:
    """Each client stream is tallied on its own (a stream opened again after an outage
    replays from the start, by design); loss counts on the last, the one that ended."""
    out = Tally()
    for view in record.views:
        out.add(tally(view, expected))
    out.lost = tally(record.views[-1], expected).lost if record.views else len(expected)
    return out


def _first_divergence(got: list[int], want: list[int]) -> int:
    return next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))


def valid_figures(traffic: Traffic, listener: ChannelListener,
                  reference: list[list[int]]) -> dict:
    client, channel = Tally(), Tally()
    answered = matching = excused = lost_in_outage = terminal_missing = terminal_repeated = 0
    failed: Counter[str] = Counter()
    mismatches: list[dict] = []
    unanswered: list[dict] = []
    for rec in traffic.valid:
        want = reference[rec.prompt_index][:rec.request.max_tokens]
        res = rec.result
        if res is not None and res.finish_reason == "length" and len(res.token_ids) == len(want):
            answered += 1
            client.add(_client_tally(rec, res.token_ids))
            if res.token_ids == want:
                matching += 1
            elif len(mismatches) < _EXAMPLES:
                mismatches.append({"request_id": rec.request.request_id, "worker": res.worker_id,
                                   "num_resumes": res.num_resumes,
                                   "first_divergence": _first_divergence(res.token_ids, want)})
        else:
            failed["timeout" if rec.timed_out else (rec.failure or "bad_result")] += 1
            if len(unanswered) < _EXAMPLES:
                unanswered.append({"request_id": rec.request.request_id, "failure": rec.failure,
                                   "timed_out": rec.timed_out, "retries": rec.retries,
                                   "tokens_seen": [len(v) for v in rec.views]})
        seen = listener.records.get(rec.request.request_id)
        events = seen.tokens if seen else []
        on_channel = tally(events, res.token_ids if res is not None else want)
        if listener.overlaps_outage(rec.sent_at, rec.done_at or time.time()):
            excused += 1
            lost_in_outage += on_channel.lost
            on_channel.lost = 0
        elif not seen or not seen.terminals:
            terminal_missing += 1
        channel.add(on_channel)
        terminal_repeated += max(len(seen.terminals) - 1, 0) if seen else 0
    return {"sent": len(traffic.valid), "probes": sum(r.probe for r in traffic.valid),
            "answered": answered, "matching_reference": matching, "not_answered": dict(failed),
            "unanswered_examples": unanswered,
            "mismatch_examples": mismatches, "client_retries": sum(r.retries for r in traffic.valid),
            "tokens_delivered": sum(len(r.result.token_ids) for r in traffic.valid if r.result),
            "client": asdict(client),
            "channel": {**asdict(channel), "requests_in_listener_outage": excused,
                        "lost_in_listener_outage": lost_in_outage,
                        "terminal_missing": terminal_missing,
                        "terminal_repeated": terminal_repeated,
                        "undecodable_events": listener.undecodable}}


def invalid_figures(traffic: Traffic, listener: ChannelListener, dead_entry_ids: set[str]) -> dict:
    addressable = [r for r in traffic.invalid if r.codes]
    typed = missing = repeated = 0
    codes: dict[str, Counter] = {}
    for rec in addressable:
        seen = listener.records.get(rec.request_id)
        terminals = seen.terminals if seen else []
        codes.setdefault(rec.kind, Counter())[rec.stored or "none"] += 1
        failed = rec.stored is not None and rec.stored.removeprefix("failure:") in rec.codes
        one_event = len(terminals) == 1 or (not terminals and listener.overlaps_outage(
            rec.sent_at, rec.checked_at or time.time()))
        typed += failed and one_event
        missing += rec.stored is None or rec.stored == "result"
        repeated += max(len(terminals) - 1, 0)
    return {"sent": len(traffic.invalid),
            "sent_by_kind": dict(Counter(r.kind for r in traffic.invalid)),
            "with_readable_id": len(addressable), "failed_typed": typed,
            "failure_missing": missing, "terminal_repeated": repeated,
            "stored_by_kind": {k: dict(v) for k, v in codes.items()},
            "rejected": sum(is_rejection((r.stored or "").removeprefix("failure:") or None)
                            for r in addressable if (r.stored or "").startswith("failure:")),
            "dead_lettered": sum(r.entry_id in dead_entry_ids for r in traffic.invalid)}


async def redis_end_state(url: str, timeout_s: float) -> dict:
    """Wait (bounded) until every lane is drained and nothing is pending; then the figures,
    with the entry ids the dead-letter stream holds."""
    client = aioredis.from_url(url)
    streams = [keys.stream_key("default", "default", lane) for lane in keys.LANES]
    deadline = time.monotonic() + timeout_s
    lengths, pending = [-1], [-1]
    try:
        while True:
            try:
                lengths = [await client.xlen(s) for s in streams]
                pending = [(await client.xpending(s, keys.GROUP))["pending"] for s in streams]
                if (sum(lengths) == 0 and sum(pending) == 0) or time.monotonic() > deadline:
                    break
            except TRANSIENT:
                pass
            await asyncio.sleep(0.25)
        dead: set[str] = set()
        async for entry_id in _dead_entry_ids(client):
            dead.add(entry_id)
        held = [item for s in streams
                for item in await client.xpending_range(s, keys.GROUP, "-", "+", _EXAMPLES)]
        return {"stream_length": sum(lengths), "pending": sum(pending), "dead_entry_ids": dead,
                "pending_examples": [{"entry_id": p["message_id"].decode(),
                                      "consumer": p["consumer"].decode(),
                                      "idle_ms": p["time_since_delivered"],
                                      "deliveries": p["times_delivered"]} for p in held]}
    finally:
        await client.aclose()


async def _dead_entry_ids(client: aioredis.Redis):
    start = "-"
    while True:
        batch = await client.xrange(keys.dead_letter_key("default"), min=start, count=1000)
        for item_id, fields in batch:
            yield fields.get(b"entry_id", b"").decode()
        if len(batch) < 1000:
            return
        start = "(" + batch[-1][0].decode()


def invariants(report: dict) -> dict[str, bool]:
    v, inv, end = report["valid"], report["invalid"], report["end"]
    client = v["client"]
    return {
        "every_valid_request_answered": v["answered"] == v["sent"],
        "every_answer_matches_reference": v["matching_reference"] == v["answered"],
        "no_token_lost_repeated_or_reordered": not (client["lost"] or client["repeated"]
                                                    or client["out_of_order"] or client["differing"]),
        "nothing_lost_or_differing_on_channel": not (v["channel"]["lost"] or v["channel"]["differing"]
                                                     or v["channel"]["terminal_missing"]),
        "no_unexplained_worker_exit": not report["worker_exits_unexplained"],
        "every_addressable_invalid_entry_failed_once": inv["failed_typed"] == inv["with_readable_id"],
        # a client's validation failure (e.g. invalid_token_id) is answered, not dead-lettered
        "every_invalid_entry_dead_lettered_or_rejected":
            inv["dead_lettered"] + inv["rejected"] == inv["sent"],
        "streams_drained_nothing_pending": end["pending"] == 0 and end["stream_length"] == 0,
        "every_fault_recovered": all(f["recovery_s"] is not None for f in report["faults"]),
    }


def summary(report: dict) -> str:
    v, inv, c = report["valid"], report["invalid"], report["valid"]["client"]
    lines = [
        f"soak: {report['duration_s']:.0f}s, {report['workers']} workers, seed {report['seed']}, "
        f"{report['machine']['cpu']} x{report['machine']['cores']}",
        f"valid: {v['sent']} sent, {v['answered']} answered, {v['matching_reference']} match the "
        f"reference, {v['tokens_delivered']} tokens",
        f"invalid: {inv['sent']} sent, {inv['failed_typed']}/{inv['with_readable_id']} typed "
        f"failures, {inv['dead_lettered']} dead-lettered, {inv['rejected']} rejections",
        f"faults: {report['faults_by_kind']}, max recovery {report['max_recovery_s']} s",
        f"tokens: lost {c['lost']}, repeated {c['repeated']}, out of order {c['out_of_order']}, "
        f"differing {c['differing']} (channel: {v['channel']['repeated']} repeated, "
        f"{v['channel']['lost']} lost)",
        f"unexplained worker exits: {len(report['worker_exits_unexplained'])}, pending at end: "
        f"{report['end']['pending']}",
    ]
    broken = [name for name, ok in report["invariants"].items() if not ok]
    lines.append("invariants: " + ("all hold" if not broken else "BROKEN: " + ", ".join(broken)))
    return "\n".join(lines)

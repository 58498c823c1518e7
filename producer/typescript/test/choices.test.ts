/** Choices (n > 1) and id_conflict on a stream fed by hand (no Redis); the digest's float form. */
import assert from "node:assert/strict";
import { test } from "node:test";
import { msgspecFloat, requestDigest } from "../src/digest";
import { IdConflictError, RequestFailed } from "../src/errors";
import { RequestStream, type Stored } from "../src/stream";

const text = (ids: number[]) => ids.map((i) => `<${i}>`).join("");
const tok = (index: number, seq: number, ids: number[]) =>
  Buffer.from(JSON.stringify({ type: "token", request_id: "q", seq, token_ids: ids, text: text(ids), logprobs: null, index }));
const result = (choices: number[][]) => Buffer.from(JSON.stringify({
  type: "result", request_id: "q", finish_reason: "length", stop_reason: null, text: text(choices[0]), token_ids: choices[0],
  usage: { prompt_tokens: 1, completion_tokens: choices.flat().length, cached_tokens: 0 },
  timings: { queued_s: null, ttft_s: null, total_s: 0 }, worker_id: "w", num_resumes: 0,
  choices: choices.map((ids, index) => ({ index, finish_reason: "length", stop_reason: null, text: text(ids), token_ids: ids })),
}));

function make(states: Stored[], digest?: string, pollMs = 30) {
  const checks: ({ entryRef: string } | null)[] = [];
  const stream = new RequestStream("t", "q", {
    stored: async (check) => {
      checks.push(check);
      return states.length > 1 ? states.shift()! : states[0];
    },
    cancel: async () => undefined, release: async () => undefined, pollMs, digest,
  });
  return { stream, checks };
}

async function collect(stream: RequestStream): Promise<[number, number[]][]> {
  const out: [number, number[]][] = [];
  for await (const t of stream) out.push([t.index ?? 0, t.token_ids]);
  return out;
}

const perChoice = (events: [number, number[]][]) => {
  const by = new Map<number, number[]>();
  for (const [i, ids] of events) by.set(i, [...(by.get(i) ?? []), ...ids]);
  return Object.fromEntries(by);
};

test("interleaved choices: seq per choice, copies dropped, every choice exactly once", { timeout: 5000 }, async () => {
  const { stream } = make([{ progress: [], result: null }]);
  for (const m of [tok(0, 0, [1]), tok(1, 0, [5, 6]), tok(1, 0, [5, 6]), tok(0, 1, [2]), tok(2, 0, [9]), tok(1, 2, [7]),
    result([[1, 2], [5, 6, 7], [9]])]) stream.deliver(m);
  const events = await collect(stream);
  assert.deepEqual(perChoice(events), { 0: [1, 2], 1: [5, 6, 7], 2: [9] });
  assert.equal(events.length, 5);
  assert.deepEqual(stream.choiceTokenIds.get(1), [5, 6, 7]);
  assert.equal(stream.choiceText.get(2), "<9>");
  assert.deepEqual((await stream.result()).choices?.map((c) => c.token_ids), [[1, 2], [5, 6, 7], [9]]);
});

test("a gap in one choice is filled from the stored progress of that choice", { timeout: 5000 }, async () => {
  const progress = [tok(0, 0, [1]), tok(1, 0, [5]), tok(1, 1, [6]), tok(0, 1, [2]), tok(1, 2, [7])];
  const { stream, checks } = make([{ progress, result: null }]);
  for (const m of [tok(0, 0, [1]), tok(1, 0, [5]), tok(1, 2, [7]), tok(0, 1, [2]), result([[1, 2], [5, 6, 7]])]) stream.deliver(m);
  assert.deepEqual(perChoice(await collect(stream)), { 0: [1, 2], 1: [5, 6, 7] });
  assert.equal(checks.length, 1);
  assert.equal(checks[0], null); // no digest: a watcher reads no conflict fields
});

test("tokens only the (stored) result holds are delivered from it, per choice", { timeout: 5000 }, async () => {
  const { stream } = make([{ progress: [], result: result([[1, 2], [5, 6, 7]]) }]);
  for (const m of [tok(0, 0, [1]), tok(1, 0, [5]), result([[1, 2], [5, 6, 7]])]) stream.deliver(m);
  assert.deepEqual(perChoice(await collect(stream)), { 0: [1, 2], 1: [5, 6, 7] });
  assert.equal(stream.choiceText.get(1), "<5><6><7>");
});

test("a stored digest that differs ends the stream with IdConflictError and yields nothing", { timeout: 5000 }, async () => {
  const { stream, checks } = make([{ progress: [tok(0, 0, [1])], result: result([[1], [2]]), digest: Buffer.from("other"), conflict: null }], "mine");
  await stream.recover();
  stream.deliver(tok(0, 1, [3]));
  assert.deepEqual(await collect(stream), []);
  await assert.rejects(stream.result(), (e: unknown) => e instanceof IdConflictError && e instanceof RequestFailed && e.code === "id_conflict");
  assert.deepEqual(checks[0], { entryRef: "" });
});

test("the worker's stored conflict failure for this entry is the stream's end", { timeout: 5000 }, async () => {
  const conflict = Buffer.from(JSON.stringify({ type: "failure", request_id: "q", code: "id_conflict", message: "held by another", retryable: false }));
  const { stream, checks } = make([{ progress: [], result: null, digest: null, conflict }], "mine");
  stream.entryRef = "s|1-0";
  stream.deliver(tok(0, 0, [1]));
  await assert.rejects(stream.result(), (e: unknown) => e instanceof IdConflictError && e.message.includes("held by another"));
  assert.deepEqual(checks[0], { entryRef: "s|1-0" });
});

test("events are held until the stored digest says they are this request's", { timeout: 5000 }, async () => {
  const states: Stored[] = [
    { progress: [], result: null, digest: null, conflict: null }, // nothing stored yet: not verified
    { progress: [tok(0, 0, [1])], result: null, digest: Buffer.from("mine"), conflict: null },
  ];
  const { stream, checks } = make(states, "mine");
  stream.deliver(tok(0, 0, [1]));
  stream.deliver(tok(0, 1, [2]));
  stream.deliver(result([[1, 2]]));
  assert.deepEqual(perChoice(await collect(stream)), { 0: [1, 2] });
  assert.ok(checks.length >= 2);
});

test("floats as msgspec writes them; the digest ignores what a retry may change", () => {
  const cases: [number, string][] = [[1, "1.0"], [0, "0.0"], [-0, "0.0"], [0.7, "0.7"], [1e-5, "0.00001"], [1e-6, "1e-6"],
    [1.5e-7, "1.5e-7"], [1e15, "1000000000000000.0"], [1e16, "1e16"], [-2.5e21, "-2.5e21"], [0.1 + 0.2, "0.30000000000000004"]];
  for (const [x, want] of cases) assert.equal(msgspecFloat(x), want, String(x));
  const base = { request_id: "r", prompt: "hi", n: 3, seed: 7 };
  assert.equal(requestDigest(base), requestDigest({ ...base, tenant: "a", priority: "high", metadata: { k: "v" }, submitted_at: 5, deadline: 9 }));
  assert.notEqual(requestDigest(base), requestDigest({ ...base, n: 2 }));
  assert.equal(requestDigest(base), requestDigest({ ...base, n: 3, temperature: 1 }));
  assert.match(requestDigest(base), /^[0-9a-f]{32}$/);
});

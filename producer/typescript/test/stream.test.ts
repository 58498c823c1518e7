/** The seq rule, gap recovery and the terminal event, on a stream fed by hand (no Redis). */
import assert from "node:assert/strict";
import { test } from "node:test";
import { RequestFailed } from "../src/errors";
import { RequestStream, type StoredState } from "../src/stream";
import { RECONNECTED } from "../src/subscriptions";

const tok = (seq: number, ids: number[], text = ids.map((i) => `<${i}>`).join("")) =>
  Buffer.from(JSON.stringify({ type: "token", request_id: "q", seq, token_ids: ids, text, logprobs: null }));
const result = (ids: number[], reason = "stop") => Buffer.from(JSON.stringify({
  type: "result", request_id: "q", finish_reason: reason, stop_reason: null, text: ids.map((i) => `<${i}>`).join(""),
  token_ids: ids, usage: { prompt_tokens: 1, completion_tokens: ids.length, cached_tokens: 0 },
  timings: { queued_s: null, ttft_s: null, total_s: 0 }, worker_id: "w", num_resumes: 0,
}));

function make(stored: { progress: Buffer[]; result: Buffer | null } = { progress: [], result: null }, pollMs = 50) {
  let reads = 0;
  const state: StoredState = async () => {
    reads++;
    return stored;
  };
  let released = 0;
  const stream = new RequestStream("t", "q", {
    stored: state, cancel: async () => undefined, release: async () => void released++, pollMs,
  });
  return { stream, reads: () => reads, released: () => released };
}

async function collect(stream: RequestStream): Promise<number[]> {
  const out: number[] = [];
  for await (const t of stream) out.push(...t.token_ids);
  return out;
}

test("events carrying several tokens, copies and the result", async () => {
  const { stream, released } = make();
  for (const m of [tok(0, [1, 2]), tok(0, [1, 2]), tok(2, [3]), tok(2, [3]), tok(3, [4, 5, 6]), result([1, 2, 3, 4, 5, 6])]) {
    stream.deliver(m);
  }
  assert.deepEqual(await collect(stream), [1, 2, 3, 4, 5, 6]);
  assert.equal((await stream.result()).finish_reason, "stop");
  assert.equal(stream.text, "<1><2><3><4><5><6>");
  assert.equal(released(), 1);
});

test("a gap is filled from the stored progress, in order, once", async () => {
  const { stream, reads } = make({ progress: [tok(0, [1]), tok(1, [2, 3]), tok(3, [4])], result: null });
  stream.deliver(tok(0, [1]));
  stream.deliver(tok(3, [4])); // 1..2 were missed
  stream.deliver(tok(4, [5]));
  stream.deliver(result([1, 2, 3, 4, 5]));
  assert.deepEqual(await collect(stream), [1, 2, 3, 4, 5]);
  assert.equal(reads(), 1);
});

test("a lost terminal event is read from the stored result after silence", async () => {
  const { stream, reads } = make({ progress: [tok(0, [7]), tok(1, [8])], result: result([7, 8], "length") });
  stream.deliver(tok(0, [7]));
  const r = await stream.result(2000);
  assert.deepEqual(stream.tokenIds, [7, 8]);
  assert.equal(r.finish_reason, "length");
  assert.ok(reads() >= 1);
});

test("a reconnect replays what the subscription missed", async () => {
  const { stream } = make({ progress: [tok(0, [1]), tok(1, [2])], result: null }, 10_000);
  stream.deliver(RECONNECTED);
  stream.deliver(tok(2, [3]));
  stream.deliver(result([1, 2, 3]));
  assert.deepEqual(await collect(stream), [1, 2, 3]);
});

test("a failure is a RequestFailed with its code", async () => {
  const { stream } = make();
  stream.deliver(Buffer.from(JSON.stringify({ type: "failure", request_id: "q", code: "tenant_mismatch", message: "m", retryable: false })));
  await assert.rejects(stream.result(), (err: unknown) => err instanceof RequestFailed && err.code === "tenant_mismatch");
});

test("undecodable messages are dropped", async () => {
  const warnings: string[] = [];
  const stream = new RequestStream("t", "q", {
    stored: async () => ({ progress: [], result: null }), cancel: async () => undefined,
    release: async () => undefined, pollMs: 1000, onWarning: (m) => warnings.push(m),
  });
  stream.deliver(Buffer.from("not json"));
  stream.deliver(Buffer.from(JSON.stringify({ type: "token", request_id: "q", seq: "0" })));
  stream.deliver(tok(0, [1]));
  stream.deliver(result([1]));
  assert.deepEqual(await collect(stream), [1]);
  assert.equal(warnings.length, 2);
});

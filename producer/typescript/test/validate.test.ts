/** What the client refuses before sending anything (a worker would fail it `malformed`). */
import assert from "node:assert/strict";
import { test } from "node:test";
import { encodeRequest } from "../src/codec";
import { InvalidRequest, PayloadTooLarge } from "../src/errors";
import { MAX_MESSAGE_CHARS } from "../src/limits";

const ok = { request_id: "r-1", prompt: "hi" };

test("valid requests encode to their JSON", () => {
  assert.deepEqual(JSON.parse(encodeRequest({ ...ok, max_tokens: 8, seed: 2 ** 53 - 1 }).toString()),
    { ...ok, max_tokens: 8, seed: 2 ** 53 - 1 });
  encodeRequest({ request_id: "r", messages: [{ role: "user", content: "hi" }], prompt: null });
});

for (const [label, bad] of [
  ["two prompt forms", { ...ok, prompt_token_ids: [1] }],
  ["no prompt", { request_id: "r" }],
  ["a seed JavaScript cannot hold", { ...ok, seed: 2 ** 53 }],
  ["a fractional integer", { ...ok, max_tokens: 1.5 }],
  ["NaN", { ...ok, temperature: NaN }],
  ["top_p 0", { ...ok, top_p: 0 }],
  ["min above max", { ...ok, min_tokens: 20, max_tokens: 10 }],
  ["an unknown field", { ...ok, promt: "x" }],
  ["an id that names a hash tag", { ...ok, request_id: "{x}" }],
  ["an id ending in a newline", { ...ok, request_id: "a\n" }],
  ["an unknown lane", { ...ok, priority: "urgent" }],
  ["a role", { request_id: "r", messages: [{ role: "robot", content: "x" }] }],
] as const) {
  test(`refused: ${label}`, () => {
    assert.throws(() => encodeRequest(bad), InvalidRequest);
  });
}

test("over the payload limit", () => {
  const big = { request_id: "r", messages: Array(6).fill({ role: "user", content: "x".repeat(MAX_MESSAGE_CHARS) }) };
  assert.throws(() => encodeRequest(big), (err: unknown) => err instanceof PayloadTooLarge && err.numBytes > 512 * 1024);
});

test("lengths count code points, as the worker does", () => {
  encodeRequest({ ...ok, metadata: { k: "\u{1F600}".repeat(1024) } }); // 2048 UTF-16 units
  assert.throws(() => encodeRequest({ ...ok, metadata: { k: "\u{1F600}".repeat(1025) } }), InvalidRequest);
});

/**
 * The rules a worker checks when it decodes a request, checked before anything is enqueued,
 * so a mistake is an {@link InvalidRequest} at the call instead of a `malformed` failure
 * later. The table mirrors docs/protocol.schema.json (a test compares them).
 */
import { InvalidRequest } from "./errors";
import * as L from "./limits";
import type { Request } from "./protocol";

type Spec =
  | { kind: "int"; min: number; max: number; nullable?: boolean }
  | { kind: "num"; min: number; max: number; exclusiveMin?: boolean; nullable?: boolean }
  | { kind: "str"; maxLength: number; minLength?: number; pattern?: string; nullable?: boolean }
  | { kind: "bool" }
  | { kind: "enum"; values: readonly string[] }
  | { kind: "const"; value: number }
  | { kind: "list"; maxItems: number; item: Spec; nullable?: boolean }
  | { kind: "chat"; maxItems: number; contentMax: number; nullable?: boolean }
  | { kind: "map"; maxItems: number; keyMax: number; valueMax: number }
  | { kind: "structured"; nullable: true };

const TOKEN_ID: Spec = { kind: "int", min: 0, max: L.MAX_TOKEN_ID };

/** Every field of a request and its bound. */
export const REQUEST_FIELDS: Record<string, Spec> = {
  v: { kind: "const", value: L.PROTOCOL_VERSION },
  request_id: { kind: "str", maxLength: 128, pattern: L.REQUEST_ID_PATTERN },
  tenant: { kind: "str", maxLength: 64, pattern: L.TENANT_PATTERN, nullable: true },
  prompt: { kind: "str", maxLength: L.MAX_PROMPT_CHARS, nullable: true },
  messages: { kind: "chat", maxItems: L.MAX_MESSAGES, contentMax: L.MAX_MESSAGE_CHARS, nullable: true },
  prompt_token_ids: { kind: "list", maxItems: L.MAX_PROMPT_TOKENS, item: TOKEN_ID, nullable: true },
  max_tokens: { kind: "int", min: 1, max: L.MAX_TOKENS },
  min_tokens: { kind: "int", min: 0, max: L.MAX_TOKENS },
  temperature: { kind: "num", min: 0, max: 100 },
  top_k: { kind: "int", min: 0, max: L.MAX_TOP_K },
  top_p: { kind: "num", min: 0, max: 1, exclusiveMin: true },
  min_p: { kind: "num", min: 0, max: 1 },
  repetition_penalty: { kind: "num", min: 0.01, max: 100 },
  presence_penalty: { kind: "num", min: -2, max: 2 },
  frequency_penalty: { kind: "num", min: -2, max: 2 },
  seed: { kind: "int", min: 0, max: L.MAX_SAFE_INTEGER, nullable: true },
  stop: { kind: "list", maxItems: L.MAX_STOP_STRINGS, item: { kind: "str", minLength: 1, maxLength: L.MAX_STOP_STRING_CHARS } },
  stop_token_ids: { kind: "list", maxItems: L.MAX_STOP_TOKEN_IDS, item: TOKEN_ID },
  ignore_eos: { kind: "bool" },
  logprobs: { kind: "int", min: 0, max: L.MAX_LOGPROBS, nullable: true },
  speculative: { kind: "bool" },
  priority: { kind: "enum", values: ["high", "default", "batch"] },
  deadline: { kind: "num", min: 0, max: L.MAX_UNIX_TIME, exclusiveMin: true, nullable: true },
  metadata: { kind: "map", maxItems: L.MAX_METADATA_ITEMS, keyMax: L.MAX_METADATA_KEY_CHARS, valueMax: L.MAX_METADATA_VALUE_CHARS },
  submitted_at: { kind: "num", min: 0, max: L.MAX_UNIX_TIME, nullable: true },
  n: { kind: "int", min: 1, max: L.MAX_N },
  structured: { kind: "structured", nullable: true },
};

/** Each structured output `type` and the one other field it takes (null: none). */
const STRUCTURED_FIELDS: Record<string, string | null> = {
  json_object: null, json_schema: "schema", regex: "pattern", choice: "choices", grammar: "ebnf",
};

function checkStructured(field: string, value: unknown): void {
  if (typeof value !== "object" || value === null || Array.isArray(value)) fail(field, "must be an object with a type");
  const obj = value as Record<string, unknown>;
  const kind = obj.type;
  if (typeof kind !== "string" || !Object.prototype.hasOwnProperty.call(STRUCTURED_FIELDS, kind)) {
    fail(`${field}.type`, `must be one of ${Object.keys(STRUCTURED_FIELDS).join(", ")}`);
  }
  const name = STRUCTURED_FIELDS[kind as string];
  const extra = Object.keys(obj).filter((k) => k !== "type" && k !== name);
  if (extra.length) fail(field, `unknown field ${extra[0]}`);
  if (name === null) return;
  const where = `${field}.${name}`;
  const v = obj[name];
  if (v === undefined) fail(where, "is required");
  if (name === "schema") {
    if (typeof v !== "object" || v === null || Array.isArray(v)) fail(where, "must be a JSON Schema object");
    return;
  }
  if (name === "choices") {
    if (!Array.isArray(v) || v.length < 1 || v.length > L.MAX_CHOICES) fail(where, `must be 1..${L.MAX_CHOICES} strings`);
    v.forEach((c, i) => checkValue(`${where}[${i}]`, { kind: "str", minLength: 1, maxLength: L.MAX_CHOICE_CHARS }, c));
    return;
  }
  checkValue(where, { kind: "str", minLength: 1, maxLength: L.MAX_STRUCTURED_SPEC_CHARS }, v);
}

const ROLES = ["system", "user", "assistant", "tool"];
const patterns = new Map<string, RegExp>();

/** String length as JSON Schema and the worker count it: Unicode code points. */
function codePoints(s: string): number {
  let n = 0;
  for (const _ of s) n++;
  return n;
}

function fail(field: string, message: string): never {
  throw new InvalidRequest(message, field);
}

function checkValue(field: string, spec: Spec, value: unknown): void {
  if (value === null && "nullable" in spec && spec.nullable) return;
  switch (spec.kind) {
    case "const":
      if (value !== spec.value) fail(field, `must be ${spec.value}`);
      return;
    case "bool":
      if (typeof value !== "boolean") fail(field, "must be a boolean");
      return;
    case "enum":
      if (typeof value !== "string" || !spec.values.includes(value)) fail(field, `must be one of ${spec.values.join(", ")}`);
      return;
    case "int":
      if (!Number.isSafeInteger(value)) fail(field, "must be an integer (and at most 2^53 - 1)");
      if ((value as number) < spec.min || (value as number) > spec.max) fail(field, `must be in [${spec.min}, ${spec.max}]`);
      return;
    case "num": {
      if (typeof value !== "number" || !Number.isFinite(value)) fail(field, "must be a finite number");
      const low = spec.exclusiveMin ? value <= spec.min : value < spec.min;
      if (low || value > spec.max) fail(field, `must be in ${spec.exclusiveMin ? "(" : "["}${spec.min}, ${spec.max}]`);
      return;
    }
    case "str": {
      if (typeof value !== "string") fail(field, "must be a string");
      const n = codePoints(value);
      if (n > spec.maxLength || n < (spec.minLength ?? 0)) fail(field, `must have ${spec.minLength ?? 0}..${spec.maxLength} characters`);
      if (spec.pattern !== undefined) {
        let re = patterns.get(spec.pattern);
        if (re === undefined) patterns.set(spec.pattern, (re = new RegExp(spec.pattern)));
        if (!re.test(value)) fail(field, `must match ${spec.pattern}`);
      }
      return;
    }
    case "list":
      if (!Array.isArray(value)) fail(field, "must be an array");
      if (value.length > spec.maxItems) fail(field, `at most ${spec.maxItems} items`);
      value.forEach((item, i) => checkValue(`${field}[${i}]`, spec.item, item));
      return;
    case "chat":
      if (!Array.isArray(value)) fail(field, "must be an array of {role, content}");
      if (value.length > spec.maxItems) fail(field, `at most ${spec.maxItems} messages`);
      value.forEach((m, i) => {
        const where = `${field}[${i}]`;
        if (typeof m !== "object" || m === null || Array.isArray(m)) fail(where, "must be {role, content}");
        const extra = Object.keys(m).filter((k) => k !== "role" && k !== "content");
        if (extra.length) fail(where, `unknown field ${extra[0]}`);
        checkValue(`${where}.role`, { kind: "enum", values: ROLES }, (m as { role?: unknown }).role);
        checkValue(`${where}.content`, { kind: "str", maxLength: spec.contentMax }, (m as { content?: unknown }).content);
      });
      return;
    case "structured":
      checkStructured(field, value);
      return;
    case "map": {
      if (typeof value !== "object" || value === null || Array.isArray(value)) fail(field, "must be an object of strings");
      const entries = Object.entries(value);
      if (entries.length > spec.maxItems) fail(field, `at most ${spec.maxItems} entries`);
      for (const [k, v] of entries) {
        if (codePoints(k) > spec.keyMax) fail(field, `keys have at most ${spec.keyMax} characters`);
        checkValue(`${field}.${k}`, { kind: "str", maxLength: spec.valueMax }, v);
      }
      return;
    }
  }
}

/** Throw {@link InvalidRequest} unless a worker would decode `request` (the payload size aside). */
export function validateRequest(request: unknown): asserts request is Request {
  if (typeof request !== "object" || request === null || Array.isArray(request)) {
    throw new InvalidRequest("a request is a JSON object");
  }
  const obj = request as Record<string, unknown>;
  for (const [field, value] of Object.entries(obj)) {
    if (value === undefined) continue; // JSON.stringify leaves it out
    const spec = REQUEST_FIELDS[field];
    if (spec === undefined) fail(field, "unknown field");
    checkValue(field, spec, value);
  }
  if (obj.request_id === undefined) fail("request_id", "is required");
  const forms = ["prompt", "messages", "prompt_token_ids"].filter((f) => obj[f] !== undefined && obj[f] !== null);
  if (forms.length !== 1) {
    throw new InvalidRequest(`exactly one of prompt, messages, prompt_token_ids is required (got ${forms.length})`);
  }
  const max = (obj.max_tokens as number | undefined) ?? 16;
  if (((obj.min_tokens as number | undefined) ?? 0) > max) fail("min_tokens", "must not exceed max_tokens");
}

/**
 * The digest of a request, byte for byte what shared/digest.py computes: SHA-256 (first 32
 * hex digits) of the request's canonical encoding (msgspec's JSON: fields in declaration
 * order, defaults written out) with `tenant`, `priority`, `deadline`, `submitted_at` and
 * `metadata` reset to their defaults. Computed on what the worker decodes from the payload
 * this client sends (`JSON.stringify` of the request), so numbers follow that round trip.
 */
import { createHash } from "node:crypto";
import type { Request } from "./protocol";

type Kind = "int" | "float" | "any";

/** Request's fields in declaration order (shared/protocol.py), with their defaults. */
const FIELDS: [string, Kind, unknown][] = [
  ["v", "int", 1], ["request_id", "any", undefined], ["tenant", "any", null], ["prompt", "any", null],
  ["messages", "any", null], ["prompt_token_ids", "any", null], ["max_tokens", "int", 16],
  ["min_tokens", "int", 0], ["temperature", "float", 1], ["top_k", "int", 0], ["top_p", "float", 1],
  ["min_p", "float", 0], ["repetition_penalty", "float", 1], ["presence_penalty", "float", 0],
  ["frequency_penalty", "float", 0], ["seed", "int", null], ["stop", "any", []], ["stop_token_ids", "any", []],
  ["ignore_eos", "any", false], ["logprobs", "int", null], ["speculative", "any", true],
  ["priority", "any", "default"], ["deadline", "float", null], ["metadata", "any", {}],
  ["submitted_at", "float", null], ["n", "int", 1], ["structured", "any", null],
];
const IGNORED: Record<string, unknown> = { tenant: null, priority: "default", deadline: null, submitted_at: null, metadata: {} };

/** A float as msgspec writes it: shortest digits; fixed (with ".0") for 1e-5 <= |x| < 1e16, else `1.5e-7`. */
export function msgspecFloat(x: number): string {
  if (!Number.isFinite(x)) throw new RangeError(`not a finite number: ${x}`);
  if (x === 0) return "0.0"; // -0 too: JSON.stringify sends it as 0
  const [mantissa, exp] = x.toExponential().split("e");
  const e = Number(exp);
  if (e >= -5 && e < 16) {
    const fixed = String(x);
    return fixed.includes(".") ? fixed : `${fixed}.0`;
  }
  return `${mantissa}e${e}`;
}

/** A JSON number of an untyped value after the round trip: an integer stays one, else a float. */
function anyNumber(x: number): string {
  return Number.isInteger(x) && Math.abs(x) < 1e21 ? JSON.stringify(x) : msgspecFloat(x);
}

function encodeAny(value: unknown): string {
  if (value === null || value === undefined) return "null";
  if (typeof value === "number") return anyNumber(value);
  if (typeof value === "string" || typeof value === "boolean") return JSON.stringify(value);
  if (Array.isArray(value)) return `[${value.map(encodeAny).join(",")}]`;
  if (typeof value === "object") {
    const obj = value as Record<string, unknown>;
    return encodeObject(obj, Object.keys(obj));
  }
  throw new TypeError(`cannot encode ${typeof value}`);
}

/** An object's defined keys, `first` (a struct's declared fields) before the rest in their order. */
function encodeObject(obj: Record<string, unknown>, first: string[]): string {
  const order = [...first, ...Object.keys(obj).filter((k) => !first.includes(k))].filter((k) => obj[k] !== undefined);
  return `{${order.map((k) => `${JSON.stringify(k)}:${encodeAny(obj[k])}`).join(",")}}`;
}

/** A typed field: chat messages and the structured spec are structs (declared order, tag first). */
function encodeField(name: string, value: unknown): string {
  if (name === "messages" && Array.isArray(value)) {
    return `[${value.map((m) => encodeObject(m as Record<string, unknown>, ["role", "content"])).join(",")}]`;
  }
  if (name === "structured" && value !== null && typeof value === "object") {
    return encodeObject(value as Record<string, unknown>, ["type"]);
  }
  return encodeAny(value);
}

/** The canonical encoding shared/digest.py hashes (`request` as {@link validateRequest} accepts it). */
export function canonicalRequest(request: Request): string {
  const r = request as unknown as Record<string, unknown>;
  const parts = FIELDS.map(([name, kind, fallback]) => {
    let value = name in IGNORED ? IGNORED[name] : r[name];
    if (value === undefined) value = fallback;
    const text = value === null ? "null" : kind === "float" ? msgspecFloat(value as number) : encodeField(name, value);
    return `${JSON.stringify(name)}:${text}`;
  });
  return `{${parts.join(",")}}`;
}

/** 32 hex digits; equal for two requests exactly when a worker takes them as the same request. */
export function requestDigest(request: Request): string {
  return createHash("sha256").update(canonicalRequest(request), "utf8").digest("hex").slice(0, 32);
}

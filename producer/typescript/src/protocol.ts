/**
 * The messages of the fleet protocol (docs/protocol.md; docs/protocol.schema.json).
 *
 * Inbound: one {@link Request} per stream entry (field `data`). Outbound, on the request's
 * channel and in its stored progress: {@link TokenEvent}s, then exactly one terminal event,
 * {@link ResultEvent} or {@link FailureEvent} (field `type` tells them apart).
 */
import type { Lane } from "./keys";
import { MAX_N } from "./limits";

export type Role = "system" | "user" | "assistant" | "tool";

export interface ChatMessage {
  role: Role;
  content: string;
}

/** The fields of a request; exactly one of `prompt`, `messages`, `prompt_token_ids`. */
export interface RequestFields {
  /** Client-chosen id, the idempotency key (a fresh one when left out). */
  request_id?: string;
  /** Optional in the payload (the stream names the tenant); the client's tenant by default. */
  tenant?: string | null;
  prompt?: string | null;
  messages?: ChatMessage[] | null;
  prompt_token_ids?: number[] | null;
  max_tokens?: number;
  min_tokens?: number;
  temperature?: number;
  top_k?: number;
  top_p?: number;
  min_p?: number;
  repetition_penalty?: number;
  presence_penalty?: number;
  frequency_penalty?: number;
  /** 0 .. 2^53 - 1. */
  seed?: number | null;
  stop?: string[];
  stop_token_ids?: number[];
  ignore_eos?: boolean;
  logprobs?: number | null;
  speculative?: boolean;
  /** The lane (stream) the request is added to; `default` unless the client says otherwise. */
  priority?: Lane;
  /** Unix seconds: not started by then -> `timeout` with no tokens; running then -> stops. */
  deadline?: number | null;
  metadata?: Record<string, string>;
  /** Unix seconds, for `timings.queued_s` (set by the client). */
  submitted_at?: number | null;
  /** Samples (choices) of this prompt, 1 .. 16; they share its KV blocks. */
  n?: number;
  /** Constrains the output (docs/protocol.md, "Structured output"). */
  structured?: Structured | null;
  v?: 1;
}

export type Structured =
  | { type: "json_object" }
  | { type: "json_schema"; schema: Record<string, unknown> }
  | { type: "regex"; pattern: string }
  | { type: "choice"; choices: string[] }
  | { type: "grammar"; ebnf: string };

export interface Request extends RequestFields {
  request_id: string;
}

export interface TokenLogprob {
  token_id: number;
  logprob: number;
  /** [token id, logprob] pairs, best first. */
  top: [number, number][];
}

export interface TokenEvent {
  type: "token";
  request_id: string;
  /** Index of the first of `token_ids` in the output. */
  seq: number;
  token_ids: number[];
  /** The text these tokens completed (may be empty while a character or stop string is pending). */
  text: string;
  logprobs?: TokenLogprob[] | null;
  /** The choice these tokens belong to (0 unless the request has n > 1); `seq` counts per choice. */
  index?: number;
}

export type FinishReason = "stop" | "length" | "cancelled" | "timeout";

export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  cached_tokens?: number;
}

export interface Timings {
  queued_s?: number | null;
  ttft_s?: number | null;
  total_s?: number;
}

export interface ResultEvent {
  type: "result";
  request_id: string;
  finish_reason: FinishReason;
  stop_reason?: string | number | null;
  /** The whole output text (authoritative: the token texts are a prefix of it). */
  text: string;
  token_ids: number[];
  usage: Usage;
  timings: Timings;
  worker_id?: string;
  num_resumes?: number;
  /** Every choice, in index order, when the request had n > 1 (the top level is choice 0). */
  choices?: Choice[] | null;
}

/** One sample of a request with n > 1. */
export interface Choice {
  index: number;
  finish_reason: FinishReason;
  stop_reason?: string | number | null;
  text: string;
  token_ids: number[];
}

/** Failure codes set by the fleet itself; the engine adds its validation codes (`prompt_too_long`, ...). */
export const FAILURE_CODES = [
  "malformed",
  "too_large",
  "too_deep",
  "unsupported_version",
  "poison",
  "internal",
  "tenant_mismatch",
  "id_conflict",
] as const;
export type FailureCode = (typeof FAILURE_CODES)[number] | (string & {});

export interface FailureEvent {
  type: "failure";
  request_id: string;
  code: FailureCode;
  message: string;
  retryable?: boolean;
}

export type TerminalEvent = ResultEvent | FailureEvent;
export type Event = TokenEvent | TerminalEvent;

/** The notice on a model's control channel (optional: the cancel key is what counts). */
export interface CancelNotice {
  type: "cancel";
  request_id: string;
  tenant: string;
}

/** An outbound message that is not an event of this protocol. */
export class UndecodableEvent extends Error {
  override name = "UndecodableEvent";
}

const isInt = (x: unknown): x is number => Number.isSafeInteger(x);
const isIntList = (x: unknown): x is number[] => Array.isArray(x) && x.every(isInt);

/** Parse and shape-check one event (what a channel or the stored progress/result holds). */
export function decodeEvent(raw: string | Buffer): Event {
  let obj: unknown;
  try {
    obj = JSON.parse(typeof raw === "string" ? raw : raw.toString("utf8"));
  } catch (err) {
    throw new UndecodableEvent(`not JSON: ${(err as Error).message}`);
  }
  if (typeof obj !== "object" || obj === null || typeof (obj as { request_id?: unknown }).request_id !== "string") {
    throw new UndecodableEvent("not an event object");
  }
  const e = obj as Record<string, unknown>;
  switch (e.type) {
    case "token":
      if (isInt(e.seq) && e.seq >= 0 && isIntList(e.token_ids) && typeof e.text === "string"
          && (e.index === undefined || (isInt(e.index) && e.index >= 0 && e.index < MAX_N))) return e as unknown as TokenEvent;
      break;
    case "result":
      if (typeof e.finish_reason === "string" && typeof e.text === "string" && isIntList(e.token_ids)
          && typeof e.usage === "object" && e.usage !== null) return e as unknown as ResultEvent;
      break;
    case "failure":
      if (typeof e.code === "string" && typeof e.message === "string") return e as unknown as FailureEvent;
      break;
  }
  throw new UndecodableEvent(`not a valid ${String(e.type)} event`);
}

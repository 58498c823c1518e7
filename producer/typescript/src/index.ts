export { FleetClient } from "./client";
export type { ClientOptions } from "./client";
export { allChoices, RequestStream } from "./stream";
export { runBatch } from "./batch";
export type { BatchOptions, BatchOutcome } from "./batch";
export { connect, defaultRedisUrl } from "./connect";
export type { Connection, ConnectOptions } from "./connect";
export { ConnectionFailed, FleetError, FleetTimeout, IdConflictError, InvalidRequest, PayloadTooLarge, RequestFailed, StreamClosed } from "./errors";
export { canonicalRequest, requestDigest } from "./digest";
export { encodeRequest } from "./codec";
export { validateRequest } from "./validate";
export { decodeEvent, FAILURE_CODES, UndecodableEvent } from "./protocol";
export type {
  CancelNotice, ChatMessage, Choice, Event, FailureCode, FailureEvent, FinishReason, Request, RequestFields,
  ResultEvent, Role, TerminalEvent, Timings, TokenEvent, TokenLogprob, Usage,
} from "./protocol";
export * as keys from "./keys";
export * as limits from "./limits";
export type { Lane } from "./keys";

/** Typed errors of the client. Every one is a {@link FleetError}. */
import { MAX_PAYLOAD_BYTES } from "./limits";
import type { FailureEvent } from "./protocol";

export class FleetError extends Error {
  override name = "FleetError";
}

/** The fleet ended the request with a typed failure; `code` is stable (docs/protocol.md lists them). */
export class RequestFailed extends FleetError {
  override name = "RequestFailed";
  readonly code: string;
  readonly retryable: boolean;
  constructor(readonly failure: FailureEvent) {
    super(`${failure.code}: ${failure.message}`);
    this.code = failure.code;
    this.retryable = failure.retryable ?? false;
  }
}

/**
 * The request id holds a different request (code `id_conflict`): nothing of the other
 * request's answer was delivered. Use a fresh id for a different request.
 */
export class IdConflictError extends RequestFailed {
  override name = "IdConflictError";
}

/** The typed error of a failure: {@link IdConflictError} for `id_conflict`, else {@link RequestFailed}. */
export function failureError(failure: FailureEvent): RequestFailed {
  return failure.code === "id_conflict" ? new IdConflictError(failure) : new RequestFailed(failure);
}

/** The request breaks a rule of the protocol; nothing was enqueued (the worker would fail it `malformed`). */
export class InvalidRequest extends FleetError {
  override name = "InvalidRequest";
  readonly code: string = "malformed";
  constructor(message: string, readonly field?: string) {
    super(field === undefined ? message : `${field}: ${message}`);
  }
}

/** The encoded request is over the fleet's payload limit; nothing was enqueued. */
export class PayloadTooLarge extends InvalidRequest {
  override name = "PayloadTooLarge";
  override readonly code: string = "too_large";
  constructor(readonly numBytes: number) {
    super(`the request is ${numBytes} bytes as a fleet request; the fleet accepts at most ${MAX_PAYLOAD_BYTES}`);
  }
}

/** `result()` (or a batch item) waited longer than asked; the request itself goes on. */
export class FleetTimeout extends FleetError {
  override name = "FleetTimeout";
}

/** The stream or client was closed before the request ended. */
export class StreamClosed extends FleetError {
  override name = "StreamClosed";
}

/** The Redis server or cluster at the URL could not be reached (or refused the connection). */
export class ConnectionFailed extends FleetError {
  override name = "ConnectionFailed";
}

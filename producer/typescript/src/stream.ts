/**
 * One submitted request as the client sees it: its tokens in order, exactly once, then its
 * terminal event.
 *
 * The seq rule, per choice (`index`; a request with `n` > 1 has several): an event is taken
 * only when its `seq` equals the number of tokens of its choice taken so far (an event may
 * carry several tokens). A copy already seen is dropped; an event beyond
 * that number means something was missed, and the stored progress (every token event, in
 * order) fills the gap. Silence for `pollMs`, or a reconnected subscription, also reads the
 * stored progress and result, so a lost message never hangs a client. A stream given the
 * request's digest takes nothing before the stored `digest` says the id holds this request,
 * and ends with `id_conflict` ({@link IdConflictError}) when it holds another.
 */
import { failureError, FleetTimeout, StreamClosed } from "./errors";
import { decodeEvent, UndecodableEvent } from "./protocol";
import type { Choice, FailureEvent, ResultEvent, TerminalEvent, TokenEvent } from "./protocol";
import { RECONNECTED, type Delivery } from "./subscriptions";

/** What a stream reads from Redis when it recovers: the progress list, the stored result and,
 * given `check` (a submitter's stream), the state's `digest` and `conflict:<entryRef>` fields. */
export type StoredState = (check: { entryRef: string } | null) => Promise<Stored>;
export interface Stored {
  progress: Buffer[];
  result: Buffer | null;
  digest?: Buffer | null;
  conflict?: Buffer | null;
}

/** Every choice of a result, in index order (choice 0 alone, its top-level fields, when n is 1). */
export function allChoices(result: ResultEvent): Choice[] {
  return result.choices ?? [{ index: 0, finish_reason: result.finish_reason, stop_reason: result.stop_reason,
    text: result.text, token_ids: result.token_ids }];
}

export interface StreamHooks {
  stored: StoredState;
  cancel: () => Promise<void>;
  /** Stop listening (called once the terminal event is taken, or by close()). */
  release: () => Promise<void>;
  pollMs: number;
  onWarning?: (message: string) => void;
  /** The digest of the request this client submitted (none: a watcher, nothing to compare). */
  digest?: string;
}

export class RequestStream implements AsyncIterable<TokenEvent> {
  /** Every choice's token ids taken so far, in order, by `index`. */
  readonly choiceTokenIds = new Map<number, number[]>([[0, []]]);
  /** Every choice's text so far, by `index` (the result's `text` is authoritative). */
  readonly choiceText = new Map<number, string>([[0, ""]]);
  /** `<stream key>|<entry id>` once this client has enqueued the request (its conflict field). */
  entryRef: string | null = null;
  private verified: boolean;
  private terminal: TerminalEvent | null = null;
  private readonly ready: TokenEvent[] = [];
  private readonly inbox: Delivery[] = [];
  private wake: (() => void) | null = null;
  private closed = false;
  private released = false;
  private pulling: Promise<TokenEvent | null> | null = null;

  constructor(readonly tenant: string, readonly requestId: string, private readonly hooks: StreamHooks) {
    this.verified = hooks.digest === undefined;
  }

  /** Choice 0's token ids taken so far (the only choice unless the request has n > 1). */
  get tokenIds(): number[] {
    return this.choiceTokenIds.get(0)!;
  }

  /** Choice 0's text so far. */
  get text(): string {
    return this.choiceText.get(0)!;
  }

  /** Called by the subscription with every message of this request's channel. */
  deliver(delivery: Delivery): void {
    this.inbox.push(delivery);
    this.wake?.();
  }

  /** True once the terminal event is known (tokens may still be left to iterate). */
  get done(): boolean {
    return this.terminal !== null;
  }

  /** The seq the next token event of choice `index` must start at. */
  nextSeq(index = 0): number {
    return this.choiceTokenIds.get(index)?.length ?? 0;
  }

  async *[Symbol.asyncIterator](): AsyncIterator<TokenEvent> {
    for (;;) {
      const token = await this.next();
      if (token === null) return;
      yield token;
    }
  }

  /** The next token event, or null once the request has ended (one caller at a time is served in turn). */
  next(): Promise<TokenEvent | null> {
    const previous = this.pulling ?? Promise.resolve(null);
    const pull = previous.then(() => this.pull(), () => this.pull());
    this.pulling = pull;
    return pull;
  }

  /**
   * Wait for the end, taking any tokens not yet iterated; the {@link ResultEvent}, or
   * {@link RequestFailed} with the failure's code. {@link FleetTimeout} after `timeoutMs`
   * (the request goes on; call again to keep waiting).
   */
  async result(timeoutMs?: number): Promise<ResultEvent> {
    const drain = (async () => {
      while ((await this.next()) !== null);
    })();
    let timer: NodeJS.Timeout | undefined;
    try {
      if (timeoutMs === undefined) await drain;
      else {
        await Promise.race([drain, new Promise((_, reject) => {
          timer = setTimeout(() => reject(new FleetTimeout(`no result for ${this.requestId} within ${timeoutMs} ms`)), timeoutMs);
        })]);
      }
    } finally {
      clearTimeout(timer);
    }
    const terminal = this.terminal;
    if (terminal === null) throw new StreamClosed(`the stream of ${this.requestId} was closed`);
    if (terminal.type === "failure") throw failureError(terminal);
    return terminal;
  }

  /** The terminal event once known (no waiting). */
  get outcome(): TerminalEvent | null {
    return this.terminal;
  }

  /** Ask the fleet to cancel; the request then ends with finish reason `cancelled` and the tokens so far. */
  cancel(): Promise<void> {
    return this.hooks.cancel();
  }

  /** Stop listening (the request itself goes on); iteration then ends. */
  async close(): Promise<void> {
    this.closed = true;
    this.wake?.();
    await this.release();
  }

  /** Fill from the stored progress and result (what pub/sub may have dropped). */
  async recover(): Promise<void> {
    const check = this.hooks.digest === undefined ? null : { entryRef: this.entryRef ?? "" };
    const { progress, result, digest = null, conflict = null } = await this.hooks.stored(check);
    if (this.terminal !== null) return;
    if (check !== null && (conflict !== null || (digest !== null && digest.toString() !== this.hooks.digest))) {
      const stored = conflict === null ? null : this.decode(conflict);
      this.terminal = stored?.type === "failure" ? stored : this.conflictFailure();
      return;
    }
    if (digest !== null || progress.length > 0 || result !== null) this.verified = true; // a worker began it
    for (const raw of progress) {
      const event = this.decode(raw);
      if (event?.type === "token") this.take(event);
    }
    if (result !== null) {
      const event = this.decode(result);
      if (event !== null && event.type !== "token") this.end(event);
    }
  }

  private conflictFailure(): FailureEvent {
    return { type: "failure", request_id: this.requestId, code: "id_conflict", retryable: false,
      message: "this request id holds a different request; use a fresh id" };
  }

  private async pull(): Promise<TokenEvent | null> {
    for (;;) {
      const token = this.ready.shift();
      if (token !== undefined) return token;
      if (this.terminal !== null) {
        await this.release();
        return null;
      }
      if (this.closed) return null;
      await this.nextEvent();
    }
  }

  private async release(): Promise<void> {
    if (this.released) return;
    this.released = true;
    await this.hooks.release();
  }

  private async nextEvent(): Promise<void> {
    const delivery = await this.receive();
    if (this.closed) return;
    if (delivery === null || delivery === RECONNECTED) return this.tryRecover();
    const event = this.decode(delivery);
    if (event === null) return;
    if (!this.verified) { // the id's stored digest says whether these events are ours
      await this.tryRecover();
      if (!this.verified) return; // unreadable now, or another request's: the next poll decides
    }
    if (event.type === "token") {
      if (event.seq > this.nextSeq(event.index ?? 0)) await this.tryRecover(); // a gap: the progress has it
      this.take(event);
    } else if (this.terminal === null) {
      if (this.missing(event)) {
        await this.tryRecover();
        if (this.missing(event) && this.terminal === null) return; // still missing: the next poll reads them
      }
      this.end(event);
    }
  }

  /** Whether the result holds tokens of some choice that no event brought yet. */
  private missing(event: TerminalEvent): boolean {
    return event.type === "result" && allChoices(event).some((c) => c.token_ids.length > this.nextSeq(c.index));
  }

  /** The terminal event; tokens the (authoritative) result holds that no event brought are delivered from it. */
  private end(event: TerminalEvent): void {
    for (const c of event.type === "result" ? allChoices(event) : []) {
      const have = this.choiceTokenIds.get(c.index) ?? [];
      const text = this.choiceText.get(c.index) ?? "";
      if (c.token_ids.length > have.length && have.every((t, i) => c.token_ids[i] === t)) {
        this.take({ type: "token", request_id: this.requestId, seq: have.length, index: c.index,
          token_ids: c.token_ids.slice(have.length), text: c.text.startsWith(text) ? c.text.slice(text.length) : "" });
      }
    }
    this.terminal = event;
  }

  /** The next delivery, or null after `pollMs` of silence. */
  private receive(): Promise<Delivery | null> {
    const queued = this.inbox.shift();
    if (queued !== undefined) return Promise.resolve(queued);
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        this.wake = null;
        resolve(null);
      }, this.hooks.pollMs);
      this.wake = () => {
        clearTimeout(timer);
        this.wake = null;
        resolve(this.inbox.shift() ?? null);
      };
    });
  }

  private async tryRecover(): Promise<void> {
    try {
      await this.recover();
    } catch (err) {
      // Redis is away (restart, failover): the next silence tries again.
      this.hooks.onWarning?.(`recovering ${this.requestId} failed: ${(err as Error).message}`);
    }
  }

  private take(event: TokenEvent): void {
    const index = event.index ?? 0;
    if (event.seq !== this.nextSeq(index)) return; // a copy already taken (or, after a failed recovery, still missing)
    const ids = this.choiceTokenIds.get(index) ?? [];
    ids.push(...event.token_ids);
    this.choiceTokenIds.set(index, ids);
    this.choiceText.set(index, (this.choiceText.get(index) ?? "") + event.text);
    this.ready.push(event);
  }

  private decode(raw: Buffer) {
    try {
      return decodeEvent(raw);
    } catch (err) {
      if (!(err instanceof UndecodableEvent)) throw err;
      this.hooks.onWarning?.(`dropping an undecodable event of ${this.requestId}: ${err.message}`);
      return null;
    }
  }
}

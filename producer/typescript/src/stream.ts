/**
 * One submitted request as the client sees it: its tokens in order, exactly once, then its
 * terminal event.
 *
 * The seq rule: an event is taken only when its `seq` equals the number of tokens taken so
 * far (an event may carry several tokens). A copy already seen is dropped; an event beyond
 * that number means something was missed, and the stored progress (every token event, in
 * order) fills the gap. Silence for `pollMs`, or a reconnected subscription, also reads the
 * stored progress and result, so a lost message never hangs a client.
 */
import { FleetTimeout, RequestFailed, StreamClosed } from "./errors";
import { decodeEvent, UndecodableEvent } from "./protocol";
import type { ResultEvent, TerminalEvent, TokenEvent } from "./protocol";
import { RECONNECTED, type Delivery } from "./subscriptions";

/** What a stream reads from Redis when it recovers: the progress list and the stored result. */
export type StoredState = () => Promise<{ progress: Buffer[]; result: Buffer | null }>;

export interface StreamHooks {
  stored: StoredState;
  cancel: () => Promise<void>;
  /** Stop listening (called once the terminal event is taken, or by close()). */
  release: () => Promise<void>;
  pollMs: number;
  onWarning?: (message: string) => void;
}

export class RequestStream implements AsyncIterable<TokenEvent> {
  /** Every token id taken so far, in order. */
  readonly tokenIds: number[] = [];
  /** The text of the tokens taken so far (the result's `text` is authoritative). */
  text = "";
  private terminal: TerminalEvent | null = null;
  private readonly ready: TokenEvent[] = [];
  private readonly inbox: Delivery[] = [];
  private wake: (() => void) | null = null;
  private closed = false;
  private released = false;
  private pulling: Promise<TokenEvent | null> | null = null;

  constructor(readonly tenant: string, readonly requestId: string, private readonly hooks: StreamHooks) {}

  /** Called by the subscription with every message of this request's channel. */
  deliver(delivery: Delivery): void {
    this.inbox.push(delivery);
    this.wake?.();
  }

  /** True once the terminal event is known (tokens may still be left to iterate). */
  get done(): boolean {
    return this.terminal !== null;
  }

  /** The index the next token event must start at. */
  get nextSeq(): number {
    return this.tokenIds.length;
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
    if (terminal.type === "failure") throw new RequestFailed(terminal);
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
    const { progress, result } = await this.hooks.stored();
    for (const raw of progress) {
      const event = this.decode(raw);
      if (event?.type === "token") this.take(event);
    }
    if (result !== null && this.terminal === null) {
      const event = this.decode(result);
      if (event !== null && event.type !== "token") this.terminal = event;
    }
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
    if (event.type === "token") {
      if ((event.index ?? 0) === 0 && event.seq > this.nextSeq) await this.tryRecover(); // a gap: the progress has it
      this.take(event);
    } else {
      if (event.type === "result" && event.token_ids.length > this.nextSeq) await this.tryRecover();
      this.terminal ??= event;
    }
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
    if ((event.index ?? 0) !== 0) return; // this stream yields choice 0; the result holds every choice
    if (event.seq !== this.nextSeq) return; // a copy already taken (or, after a failed recovery, still missing)
    this.tokenIds.push(...event.token_ids);
    this.text += event.text;
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

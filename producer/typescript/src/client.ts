/**
 * The client: submit requests to one model's streams, stream their tokens back.
 *
 *     const fleet = await FleetClient.connect("redis://127.0.0.1:6379/0", { tenant: "acme" });
 *     const stream = await fleet.submit({ messages: [{ role: "user", content: "Hi" }], max_tokens: 32 });
 *     for await (const token of stream) process.stdout.write(token.text);
 *     const result = await stream.result();
 */
import { randomUUID } from "node:crypto";
import { runBatch, type BatchOptions, type BatchOutcome } from "./batch";
import { encodeRequest } from "./codec";
import { requestDigest } from "./digest";
import { connect, defaultRedisUrl, type Connection, type ConnectOptions } from "./connect";
import * as keys from "./keys";
import type { Lane } from "./keys";
import { decodeEvent } from "./protocol";
import type { CancelNotice, Request, RequestFields, ResultEvent, TerminalEvent, TokenEvent } from "./protocol";
import { RequestStream, type Stored } from "./stream";
import { Subscriptions } from "./subscriptions";

export interface ClientOptions extends ConnectOptions {
  /** The stream namespace the workers serve (`fleet worker --model-name`). */
  model?: string;
  /** The tenant whose streams and keys this client uses (its ACL user's tenant). */
  tenant?: string;
  /** The lane of requests that do not name one. */
  lane?: Lane;
  /** Silence after which a stream reads the stored state (covers lost messages). */
  pollMs?: number;
  /** Time to live of a cancel key, seconds. */
  cancelTtlS?: number;
  /** Where warnings go (a recovery that failed, an undecodable event); silent by default. */
  onWarning?: (message: string) => void;
}

export class FleetClient {
  readonly model: string;
  readonly tenant: string;
  readonly lane: Lane;
  private readonly pollMs: number;
  private readonly cancelTtlS: number;
  private readonly subs: Subscriptions;
  private readonly streams = new Set<RequestStream>();

  private constructor(readonly redis: Connection, readonly cluster: boolean, sharded: boolean, url: string,
                      private readonly options: ClientOptions) {
    this.model = keys.checkModel(options.model ?? "default");
    this.tenant = keys.checkTenant(options.tenant ?? keys.DEFAULT_TENANT);
    this.lane = keys.checkLane(options.lane ?? "default");
    this.pollMs = options.pollMs ?? 2000;
    this.cancelTtlS = options.cancelTtlS ?? 24 * 3600;
    this.subs = new Subscriptions(redis, sharded, url, options);
  }

  /** Connect to the server or cluster at `url` (any node; `REDIS_URL` or localhost by default). */
  static async connect(url: string = defaultRedisUrl(), options: ClientOptions = {}): Promise<FleetClient> {
    const { redis, cluster, sharded } = await connect(url, options);
    return new FleetClient(redis, cluster, sharded, url, options);
  }

  /** A complete request from fields: a fresh id, this client's tenant and lane, the submit time. */
  makeRequest(fields: RequestFields): Request {
    return {
      ...fields,
      request_id: fields.request_id ?? randomUUID().replace(/-/g, ""),
      tenant: fields.tenant ?? this.tenant,
      priority: fields.priority ?? this.lane,
      submitted_at: fields.submitted_at ?? Date.now() / 1000,
    };
  }

  /**
   * Subscribe to the request's channel, then add it to its tenant's stream of its lane;
   * the stream of its events. Idempotent by `request_id`: a request already done is not
   * added again (its stored result is returned), and a duplicate is never generated twice.
   * The same id with a different request ends with {@link IdConflictError} (`id_conflict`),
   * never with the other request's answer: a stored digest that differs fails it before
   * anything is sent. `n: 3` gives three choices (`TokenEvent.index`, `ResultEvent.choices`).
   * {@link InvalidRequest} / {@link PayloadTooLarge} before anything is sent if a worker would refuse it.
   */
  async submit(fields: RequestFields): Promise<RequestStream> {
    const request = this.makeRequest(fields);
    const payload = encodeRequest(request);
    const tenant = request.tenant as string;
    const stream = await this.watch(request.request_id, tenant, { digest: requestDigest(request) });
    if (stream.done) return stream; // its stored result, or id_conflict: the id holds another request
    const streamKey = keys.streamKey(this.model, tenant, request.priority as Lane);
    let entryId: string | null;
    try {
      entryId = await this.redis.xadd(streamKey, "*", keys.STREAM_FIELD, payload);
    } catch (err) {
      await stream.close(); // not enqueued: no subscription left behind
      throw err;
    }
    stream.entryRef = `${streamKey}|${entryId ?? ""}`;
    return stream;
  }

  /**
   * The stream of a request submitted elsewhere (or before a restart): subscribes, then
   * replays what is stored, so nothing published before or after is missed. `digest`
   * ({@link requestDigest} of the request): the stream ends with `id_conflict` rather than
   * deliver the events of a different request.
   */
  async watch(requestId: string, tenant: string = this.tenant, options: { digest?: string } = {}): Promise<RequestStream> {
    const channel = keys.eventsChannel(tenant, requestId);
    const stream: RequestStream = new RequestStream(tenant, requestId, {
      stored: (check) => this.stored(tenant, requestId, check),
      cancel: () => this.cancel(requestId, tenant),
      release: async () => {
        this.streams.delete(stream);
        await this.subs.unsubscribe(channel);
      },
      pollMs: this.pollMs,
      onWarning: this.options.onWarning,
      digest: options.digest,
    });
    this.streams.add(stream);
    try {
      await this.subs.subscribe(channel, (d) => stream.deliver(d));
      await stream.recover();
    } catch (err) {
      await stream.close();
      throw err;
    }
    return stream;
  }

  /** Submit and wait for the result; {@link RequestFailed} on a failure, {@link FleetTimeout} after `timeoutMs`. */
  async generate(fields: RequestFields, options: { timeoutMs?: number } = {}): Promise<ResultEvent> {
    const stream = await this.submit(fields);
    try {
      return await stream.result(options.timeoutMs);
    } finally {
      await stream.close();
    }
  }

  /**
   * Cancel a queued or running request: sets its cancel key (what makes it certain), then
   * publishes the notice that stops a running request within a step. A tenant's ACL user
   * may not publish the notice: that refusal is ignored (workers see the key).
   */
  async cancel(requestId: string, tenant: string = this.tenant): Promise<void> {
    await this.redis.set(keys.cancelKey(tenant, requestId), "1", "EX", this.cancelTtlS);
    const notice: CancelNotice = { type: "cancel", request_id: requestId, tenant };
    try {
      await this.redis.publish(keys.controlChannel(this.model), JSON.stringify(notice));
    } catch (err) {
      if (!String((err as Error).message).startsWith("NOPERM")) throw err;
    }
  }

  /** The stored terminal event, or null while the request has not ended. */
  async getResult(requestId: string, tenant: string = this.tenant): Promise<TerminalEvent | null> {
    const raw = await this.redis.hgetBuffer(keys.stateKey(tenant, requestId), "result");
    if (raw === null) return null;
    const event = decodeEvent(raw);
    return event.type === "token" ? null : event;
  }

  /** The stored token events, deduplicated by the seq rule (per choice), in order. */
  async getProgress(requestId: string, tenant: string = this.tenant): Promise<TokenEvent[]> {
    const raw = await this.redis.lrangeBuffer(keys.progressKey(tenant, requestId), 0, -1);
    const events: TokenEvent[] = [];
    const seen = new Map<number, number>();
    for (const item of raw) {
      const event = decodeEvent(item);
      const index = event.type === "token" ? event.index ?? 0 : 0;
      if (event.type === "token" && event.seq === (seen.get(index) ?? 0)) {
        events.push(event);
        seen.set(index, event.seq + event.token_ids.length);
      }
    }
    return events;
  }

  /** Run many requests with at most `concurrency` in flight; outcomes in input order. */
  batch(requests: RequestFields[], options: BatchOptions = {}): Promise<BatchOutcome[]> {
    return runBatch(this, requests, options);
  }

  /** Close every stream and connection. */
  async close(): Promise<void> {
    await Promise.all([...this.streams].map((s) => s.close()));
    await this.subs.close();
    this.redis.disconnect();
  }

  private async stored(tenant: string, requestId: string, check: { entryRef: string } | null): Promise<Stored> {
    // One hash tag: on a cluster both keys live in one slot, so this is one round trip.
    // HGETs, not HMGET: the shipped ACL users may HGET only.
    const state = keys.stateKey(tenant, requestId);
    const pipeline = this.redis.pipeline().lrangeBuffer(keys.progressKey(tenant, requestId), 0, -1).hgetBuffer(state, "result");
    if (check !== null) pipeline.hgetBuffer(state, "digest").hgetBuffer(state, `conflict:${check.entryRef}`);
    const replies = await pipeline.exec();
    if (replies === null) throw new Error("pipeline aborted");
    for (const [err] of replies) if (err) throw err;
    const [progress, result, digest, conflict] = replies.map(([, value]) => value);
    return { progress: progress as Buffer[], result: result as Buffer | null,
      digest: (digest ?? null) as Buffer | null, conflict: (conflict ?? null) as Buffer | null };
  }
}

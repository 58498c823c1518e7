/**
 * One subscriber connection (one per master on a cluster) shared by every request of a
 * client, with reconnection.
 *
 * `subscribe(channel, sink)` resolves only once the server confirmed the subscription, so a
 * request enqueued afterwards cannot publish before its client listens. After a lost
 * connection (or a cluster topology change) every channel is subscribed again and each sink
 * gets {@link RECONNECTED}, so its stream recovers what it missed from the stored progress.
 */
import { Cluster, type Redis } from "ioredis";
import { clusterClient, type ConnectOptions } from "./connect";
import type { Connection } from "./connect";

export const RECONNECTED: unique symbol = Symbol("reconnected");
export type Delivery = Buffer | typeof RECONNECTED;
export type Sink = (delivery: Delivery) => void;

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

export class Subscriptions {
  private readonly sinks = new Map<string, Sink>();
  private sub: Redis | Cluster | null = null;
  private opening: Promise<Redis | Cluster> | null = null;
  private closed = false;
  private reconnectTimer: NodeJS.Timeout | null = null;

  constructor(
    private readonly main: Connection,
    private readonly sharded: boolean,
    private readonly url: string,
    private readonly options: ConnectOptions,
  ) {}

  async subscribe(channel: string, sink: Sink): Promise<void> {
    this.sinks.set(channel, sink);
    const sub = await this.open();
    // A cluster's sharded subscribers may still be starting, or the slot moving: retry.
    for (let attempt = 0; ; attempt++) {
      try {
        if (this.sharded) await (sub as Cluster).ssubscribe(channel);
        else await (sub as Redis).subscribe(channel);
        return;
      } catch (err) {
        if (attempt >= 20 || this.closed || String((err as Error).message).startsWith("NOPERM")) {
          this.sinks.delete(channel);
          throw err;
        }
        await sleep(Math.min(50 * 2 ** attempt, 1000));
      }
    }
  }

  async unsubscribe(channel: string): Promise<void> {
    if (!this.sinks.delete(channel) || this.sub === null) return;
    try {
      if (this.sharded) await (this.sub as Cluster).sunsubscribe(channel);
      else await (this.sub as Redis).unsubscribe(channel);
    } catch {
      // the connection is gone, and the subscription with it
    }
  }

  async close(): Promise<void> {
    this.closed = true;
    if (this.reconnectTimer) clearTimeout(this.reconnectTimer);
    this.sinks.clear();
    this.sub?.disconnect();
    this.sub = null;
  }

  private deliver(channel: Buffer | string, message: Buffer): void {
    this.sinks.get(channel.toString())?.(message);
  }

  /** Tell every stream to read the stored state (debounced: one topology change, one recovery). */
  private reconnected(): void {
    if (this.reconnectTimer || this.closed) return;
    this.reconnectTimer = setTimeout(() => {
      this.reconnectTimer = null;
      for (const sink of this.sinks.values()) sink(RECONNECTED);
    }, 100);
  }

  private open(): Promise<Redis | Cluster> {
    if (this.sub) return Promise.resolve(this.sub);
    this.opening ??= (this.sharded ? this.openSharded() : this.openSingle()).then(
      (sub) => {
        this.sub = sub;
        return sub;
      },
      (err: unknown) => {
        this.opening = null; // the next subscribe tries again
        throw err;
      },
    );
    return this.opening;
  }

  private async openSingle(): Promise<Redis | Cluster> {
    if (this.main instanceof Cluster) return this.openCluster({}); // a cluster of Redis < 7: plain pub/sub
    const sub = this.main.duplicate({ lazyConnect: true, autoResubscribe: true });
    sub.on("error", () => undefined);
    sub.on("messageBuffer", (channel: Buffer, message: Buffer) => this.deliver(channel, message));
    let first = true;
    sub.on("ready", () => {
      if (first) {
        first = false;
        return;
      }
      // ioredis resubscribes on its own; confirm it, then let the streams catch up.
      const channels = [...this.sinks.keys()];
      const again = channels.length ? sub.subscribe(...channels) : Promise.resolve(0);
      again.catch(() => undefined).finally(() => this.reconnected());
    });
    await sub.connect();
    return sub;
  }

  private openSharded(): Promise<Cluster> {
    return this.openCluster({ shardedSubscribers: true });
  }

  private async openCluster(extra: { shardedSubscribers?: boolean }): Promise<Cluster> {
    const sub = clusterClient(this.url, this.options, extra);
    sub.on("error", () => undefined);
    const event = extra.shardedSubscribers ? "smessageBuffer" : "messageBuffer";
    sub.on(event, (channel: Buffer, message: Buffer) => this.deliver(channel, message));
    for (const event of ["-node", "-subscriber", "subscribersReady"]) {
      sub.on(event, () => this.reconnected());
    }
    await new Promise<void>((resolve, reject) => {
      if (sub.status === "ready") return resolve();
      sub.once("ready", () => resolve());
      sub.once("end", () => reject(new Error("the cluster subscriber could not connect")));
    });
    return sub;
  }
}

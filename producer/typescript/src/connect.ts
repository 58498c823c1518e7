/**
 * One Redis server or a Redis Cluster, told apart at connect: `INFO cluster` on the node the
 * URL names says `cluster_enabled:1` on a cluster node. A cluster gets an ioredis `Cluster`
 * (slot routing, MOVED/ASK, failover) and sharded pub/sub; a single server a plain `Redis`.
 */
import { Cluster, Redis } from "ioredis";
import type { ClusterOptions, RedisOptions } from "ioredis";
import { ConnectionFailed } from "./errors";

export type Connection = Redis | Cluster;

export interface ConnectOptions {
  /** Force the mode instead of asking the server (`"auto"`, the default, asks). */
  cluster?: boolean | "auto";
  /** Extra ioredis options for every connection (TLS, timeouts, ...). */
  redisOptions?: RedisOptions;
  /** Extra options for the cluster client. */
  clusterOptions?: ClusterOptions;
}

export function defaultRedisUrl(): string {
  return process.env.REDIS_URL ?? "redis://127.0.0.1:6379/0";
}

/** Host, port, credentials and TLS of a `redis://` or `rediss://` URL, as ioredis options. */
export function urlOptions(url: string): RedisOptions & { host: string; port: number } {
  const u = new URL(url);
  if (u.protocol !== "redis:" && u.protocol !== "rediss:") throw new RangeError(`not a Redis URL: ${url}`);
  const db = u.pathname.length > 1 ? Number(u.pathname.slice(1)) : 0;
  return {
    host: u.hostname.replace(/^\[(.*)\]$/, "$1") || "127.0.0.1",
    port: u.port ? Number(u.port) : 6379,
    ...(u.username ? { username: decodeURIComponent(u.username) } : {}),
    ...(u.password ? { password: decodeURIComponent(u.password) } : {}),
    ...(u.protocol === "rediss:" ? { tls: {} } : {}),
    ...(db ? { db } : {}),
  };
}

/** The URL without its password (for messages). */
export function redact(url: string): string {
  try {
    const u = new URL(url);
    if (u.password) u.password = "***";
    return u.toString();
  } catch {
    return "(an invalid URL)";
  }
}

/** The defaults every connection of the client uses: a tenant's ACL user may not run CLIENT. */
export const BASE_OPTIONS: RedisOptions = { disableClientInfo: true, maxRetriesPerRequest: 20 };

/** What the node at `url` says of itself: a cluster node or not, and its major version. */
export async function probe(url: string, options: RedisOptions = {}): Promise<{ cluster: boolean; major: number }> {
  const node = new Redis({ ...BASE_OPTIONS, ...urlOptions(url), ...options, lazyConnect: true, maxRetriesPerRequest: 3 });
  node.on("error", () => undefined); // reported by the command below
  try {
    await node.connect();
    const info = await node.info(); // the default sections: server, clients, ..., cluster
    const major = Number(/^redis_version:(\d+)/m.exec(info)?.[1] ?? "7");
    return { cluster: /^cluster_enabled:1\s*$/m.test(info), major };
  } catch (err) {
    const message = String((err as Error).message);
    if (message.startsWith("NOPERM")) return { cluster: false, major: 7 };
    throw new ConnectionFailed(`cannot use the Redis at ${redact(url)}: ${message}`);
  } finally {
    node.disconnect();
  }
}

export function clusterClient(url: string, options: ConnectOptions, extra: ClusterOptions = {}): Cluster {
  const { host, port, db: _db, ...auth } = urlOptions(url);
  return new Cluster([{ host, port }], {
    scaleReads: "master",
    retryDelayOnFailover: 200,
    retryDelayOnClusterDown: 200,
    retryDelayOnTryAgain: 100,
    maxRedirections: 64,
    ...options.clusterOptions,
    ...extra,
    redisOptions: { ...BASE_OPTIONS, ...auth, ...options.redisOptions, ...options.clusterOptions?.redisOptions },
  });
}

/**
 * A connected client for `url`: a `Cluster` where the server is a cluster node, else a
 * `Redis`. `sharded`: events come by sharded pub/sub (a cluster of Redis >= 7, where workers
 * SPUBLISH); plain pub/sub otherwise.
 */
export async function connect(url: string, options: ConnectOptions = {}): Promise<{ redis: Connection; cluster: boolean; sharded: boolean }> {
  const found = options.cluster === undefined || options.cluster === "auto"
    ? await probe(url, options.redisOptions ?? {})
    : { cluster: options.cluster, major: 7 };
  const cluster = found.cluster;
  const redis: Connection = cluster
    ? clusterClient(url, options)
    : new Redis({ ...BASE_OPTIONS, ...urlOptions(url), ...options.redisOptions });
  redis.on("error", () => undefined); // ioredis reconnects; commands report their own errors
  if (cluster) {
    await new Promise<void>((resolve, reject) => {
      const c = redis as Cluster;
      if (c.status === "ready") return resolve();
      c.once("ready", () => resolve());
      c.once("end", () => reject(new ConnectionFailed(`could not connect to the cluster at ${redact(url)}`)));
    });
  }
  return { redis, cluster, sharded: cluster && found.major >= 7 };
}

/** Many requests with bounded concurrency; outcomes in input order. */
import { FleetTimeout } from "./errors";
import type { RequestFields, ResultEvent } from "./protocol";
import type { FleetClient } from "./client";

export type BatchOutcome =
  | { ok: true; request_id: string; result: ResultEvent }
  | { ok: false; request_id: string | undefined; error: Error };

export interface BatchOptions {
  /** Most requests in flight (default 16). */
  concurrency?: number;
  /** Per-request wait for the result; the request is cancelled when it runs out. */
  timeoutMs?: number;
  /** Called as each request ends (in completion order). */
  onOutcome?: (index: number, outcome: BatchOutcome) => void;
}

export async function runBatch(client: FleetClient, requests: RequestFields[], options: BatchOptions = {}): Promise<BatchOutcome[]> {
  const concurrency = Math.max(1, Math.floor(options.concurrency ?? 16));
  const outcomes: BatchOutcome[] = new Array(requests.length);
  let next = 0;

  async function one(index: number): Promise<BatchOutcome> {
    const request = client.makeRequest(requests[index]);
    let stream;
    try {
      stream = await client.submit(request);
      return { ok: true, request_id: request.request_id, result: await stream.result(options.timeoutMs) };
    } catch (err) {
      if (err instanceof FleetTimeout) await stream?.cancel().catch(() => undefined);
      return { ok: false, request_id: request.request_id, error: err as Error };
    } finally {
      await stream?.close();
    }
  }

  async function lane(): Promise<void> {
    while (next < requests.length) {
      const index = next++;
      outcomes[index] = await one(index);
      options.onOutcome?.(index, outcomes[index]);
    }
  }

  await Promise.all(Array.from({ length: Math.min(concurrency, requests.length) }, lane));
  return outcomes;
}

#!/usr/bin/env node
/**
 * `fleet-ts`: the TypeScript client from a shell.
 *
 *   fleet-ts stream --prompt "Once upon" [--json] [--cancel-after N]
 *   fleet-ts stream --request '{"messages": [...], "max_tokens": 64}'   # or --request @FILE
 *   fleet-ts watch ID [--json]          # a request submitted elsewhere: replays, then streams
 *   fleet-ts result ID                  # the stored terminal event (or null)
 *   fleet-ts cancel ID
 *   fleet-ts batch FILE.jsonl [--concurrency N]   # one request object a line; outcomes in order
 *   fleet-ts constants                  # the limits, patterns and key names this client uses
 *
 * Common: --url (REDIS_URL), --model, --tenant, --lane, --poll-ms. `--json` prints one line
 * per message: {"request": ...} (what `stream` sends), {"token": ...} per event taken, then
 * {"result": ...} or {"failure": ...}; an error of the client itself is {"error": name,
 * "code": ..., "message": ...}. Exit status 0 on a result, 3 on a failure, 2 on a usage
 * error, 1 otherwise.
 */
import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { FleetClient } from "./client";
import { RequestFailed } from "./errors";
import * as keys from "./keys";
import type { Lane } from "./keys";
import * as limits from "./limits";
import type { RequestFields } from "./protocol";
import type { RequestStream } from "./stream";
import { REQUEST_FIELDS } from "./validate";

const USAGE = "usage: fleet-ts stream|watch|result|cancel|batch|constants [options] (see the README)";

const { values: opts, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    url: { type: "string" },
    model: { type: "string", default: "default" },
    tenant: { type: "string", default: "default" },
    lane: { type: "string", default: "default" },
    "poll-ms": { type: "string", default: "2000" },
    prompt: { type: "string" },
    message: { type: "string" },
    request: { type: "string" },
    "max-tokens": { type: "string" },
    temperature: { type: "string" },
    seed: { type: "string" },
    json: { type: "boolean", default: false },
    "cancel-after": { type: "string" },
    concurrency: { type: "string", default: "16" },
    help: { type: "boolean", short: "h", default: false },
  },
});

const print = (obj: unknown) => process.stdout.write(JSON.stringify(obj) + "\n");

function requestFields(): RequestFields {
  // --request JSON, or --request @FILE (a request over the argument size limit of the OS)
  const text = opts.request?.startsWith("@") ? readFileSync(opts.request.slice(1), "utf8") : opts.request;
  const fields: RequestFields = text ? JSON.parse(text) : {};
  if (opts.prompt !== undefined) fields.prompt = opts.prompt;
  if (opts.message !== undefined) fields.messages = [{ role: "user", content: opts.message }];
  if (opts["max-tokens"] !== undefined) fields.max_tokens = Number(opts["max-tokens"]);
  if (opts.temperature !== undefined) fields.temperature = Number(opts.temperature);
  if (opts.seed !== undefined) fields.seed = Number(opts.seed);
  return fields;
}

async function follow(fleet: FleetClient, stream: RequestStream): Promise<number> {
  const cancelAfter = opts["cancel-after"] === undefined ? Infinity : Number(opts["cancel-after"]);
  let cancelled = false;
  for await (const token of stream) {
    if (opts.json) print({ token });
    else process.stdout.write(token.text);
    if (!cancelled && stream.tokenIds.length >= cancelAfter) {
      cancelled = true;
      await fleet.cancel(stream.requestId, stream.tenant);
    }
  }
  try {
    const result = await stream.result();
    if (opts.json) print({ result });
    else process.stdout.write(`\n[${result.finish_reason}, ${result.usage.completion_tokens} tokens]\n`);
    return 0;
  } catch (err) {
    if (!(err instanceof RequestFailed)) throw err;
    if (opts.json) print({ failure: err.failure });
    else process.stderr.write(`failed: ${err.message}\n`);
    return 3;
  }
}

function constants(): unknown {
  return {
    limits: Object.fromEntries(Object.entries(limits)),
    lanes: keys.LANES,
    fields: REQUEST_FIELDS,
    keys: {
      stream: keys.streamKey("m", "acme", "high"),
      legacy_stream: keys.legacyStreamKey("m", "batch"),
      tenants: keys.tenantsKey(),
      dead: keys.deadLetterKey("m"),
      control: keys.controlChannel("m"),
      workers: keys.workersKey("m"),
      worker: keys.workerKey("m", "w1"),
      state: keys.stateKey("acme", "q-1"),
      progress: keys.progressKey("acme", "q-1"),
      cancel: keys.cancelKey("acme", "q-1"),
      channel: keys.eventsChannel("acme", "q-1"),
    },
  };
}

async function main(): Promise<number> {
  const [command, arg] = positionals;
  if (opts.help || command === undefined) {
    process.stdout.write(USAGE + "\n");
    return command === undefined && !opts.help ? 2 : 0;
  }
  if (command === "constants") {
    print(constants());
    return 0;
  }
  const fleet = await FleetClient.connect(opts.url, {
    model: opts.model, tenant: opts.tenant, lane: opts.lane as Lane, pollMs: Number(opts["poll-ms"]),
    onWarning: (m) => process.stderr.write(`warning: ${m}\n`),
  });
  try {
    switch (command) {
      case "stream": {
        const request = fleet.makeRequest(requestFields());
        if (opts.json) print({ request });
        return await follow(fleet, await fleet.submit(request));
      }
      case "watch":
        return await follow(fleet, await fleet.watch(arg));
      case "result":
        print(await fleet.getResult(arg));
        return 0;
      case "cancel":
        await fleet.cancel(arg);
        return 0;
      case "batch": {
        const lines = readFileSync(arg, "utf8").split("\n").filter((l) => l.trim());
        const outcomes = await fleet.batch(lines.map((l) => JSON.parse(l)), { concurrency: Number(opts.concurrency) });
        for (const o of outcomes) {
          print(o.ok ? { request_id: o.request_id, result: o.result }
            : { request_id: o.request_id, error: o.error.name, code: (o.error as { code?: string }).code, message: o.error.message });
        }
        return outcomes.every((o) => o.ok) ? 0 : 3;
      }
      default:
        process.stderr.write(USAGE + "\n");
        return 2;
    }
  } finally {
    await fleet.close();
  }
}

// Exit once stdout is flushed (a pipe is written asynchronously: process.exit could cut it).
function exit(code: number): void {
  process.exitCode = code;
  setTimeout(() => process.exit(code), 5000).unref();
}

main().then(exit, (err: Error) => {
  if (opts.json) print({ error: err.name, code: (err as { code?: string }).code ?? null, message: err.message });
  process.stderr.write(`${err.name}: ${err.message}\n`);
  exit(1);
});

/**
 * `node dist/test/generate_check.js URL REQUEST_JSON`: submit one request with the client,
 * iterate its stream and print one JSON object: the tokens it yielded, then the result or
 * the error's class name and code (so a Python test can check the error is typed).
 */
import { FleetClient } from "../src/client";
import { IdConflictError, RequestFailed } from "../src/errors";

async function main(): Promise<void> {
  if (process.argv.length !== 4) throw new Error("usage: generate_check.js URL REQUEST_JSON");
  const fleet = await FleetClient.connect(process.argv[2], { pollMs: 500 });
  let tokens = 0;
  try {
    const stream = await fleet.submit(JSON.parse(process.argv[3]));
    for await (const t of stream) tokens += t.token_ids.length;
    const result = await stream.result(60_000);
    process.stdout.write(JSON.stringify({ tokens, result }) + "\n");
  } catch (err) {
    const e = err as Error;
    process.stdout.write(JSON.stringify({
      tokens, error: e.name, code: (e as RequestFailed).code ?? null,
      idConflict: e instanceof IdConflictError, requestFailed: e instanceof RequestFailed, message: e.message,
    }) + "\n");
  } finally {
    await fleet.close();
  }
}

main().catch((err: Error) => {
  process.stderr.write(`${err.message}\n`);
  process.exitCode = 2;
});

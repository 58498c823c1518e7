import { FleetClient, RequestFailed } from "@redis-llm-fleet/client";

// Summaries of many documents, at most 8 in flight; outcomes come back in input order.
async function main(): Promise<void> {
  const fleet = await FleetClient.connect(process.env.REDIS_URL, { tenant: process.env.FLEET_TENANT, lane: "batch" });
  const documents = ["Redis streams are append-only logs.", "Pub/sub keeps nothing for late listeners."];
  const outcomes = await fleet.batch(
    documents.map((doc) => ({ messages: [{ role: "user" as const, content: `Summarise: ${doc}` }], max_tokens: 48 })),
    { concurrency: 8, timeoutMs: 120_000 },
  );
  for (const [i, outcome] of outcomes.entries()) {
    if (outcome.ok) console.log(i, outcome.result.text);
    else if (outcome.error instanceof RequestFailed) console.log(i, "failed:", outcome.error.code);
    else console.log(i, "error:", outcome.error.message);
  }
  await fleet.close();
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});

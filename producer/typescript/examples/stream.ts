import { FleetClient } from "@redis-llm-fleet/client";

async function main(): Promise<void> {
  const fleet = await FleetClient.connect(process.env.REDIS_URL ?? "redis://127.0.0.1:6379/0");
  try {
    const stream = await fleet.submit({
      messages: [{ role: "user", content: "What is the capital of France?" }],
      max_tokens: 64,
      temperature: 0,
    });
    for await (const token of stream) process.stdout.write(token.text);
    const result = await stream.result();
    console.log(`\n[${result.finish_reason}, ${result.usage.completion_tokens} tokens]`);
  } finally {
    await fleet.close();
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});

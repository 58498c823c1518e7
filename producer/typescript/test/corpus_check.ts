/**
 * `node dist/test/corpus_check.js SCHEMA REQUESTS MESSAGES`: for each request of REQUESTS (a
 * JSON array), whether Ajv (draft 2020-12, strict) and the client's own check accept it;
 * for each message of MESSAGES (a JSON array of outbound/inbound protocol messages), Ajv's
 * errors. Prints one JSON object; the Python conformance tests compare it with the worker.
 */
import { readFileSync } from "node:fs";
import Ajv2020 from "ajv/dist/2020";
import { validateRequest } from "../src/validate";

const [schemaPath, requestsPath, messagesPath] = process.argv.slice(2);
const schema = JSON.parse(readFileSync(schemaPath, "utf8"));
const ajv = new Ajv2020({ strict: true, allErrors: false });
ajv.addSchema(schema, "protocol");
const asRequest = ajv.compile({ $ref: "protocol#/$defs/Request" });
const asMessage = ajv.getSchema("protocol")!;

const requests = JSON.parse(readFileSync(requestsPath, "utf8")) as unknown[];
const messages = messagesPath ? (JSON.parse(readFileSync(messagesPath, "utf8")) as unknown[]) : [];

function clientAccepts(payload: unknown): boolean {
  try {
    validateRequest(payload);
    return true;
  } catch {
    return false;
  }
}

process.stdout.write(JSON.stringify({
  requests: requests.map((r) => ({ ajv: asRequest(r) as boolean, client: clientAccepts(r) })),
  messages: messages.map((m) => (asMessage(m) ? null : ajv.errorsText(asMessage.errors))),
}) + "\n");

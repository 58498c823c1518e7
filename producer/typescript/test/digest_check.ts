/**
 * `node dist/test/digest_check.js REQUESTS`: for each request of REQUESTS (a JSON array),
 * the payload this client would send, its canonical encoding and its digest (one JSON
 * object on stdout); the Python conformance tests compare them with shared/digest.py.
 */
import { readFileSync } from "node:fs";
import { canonicalRequest, requestDigest } from "../src/digest";
import type { Request } from "../src/protocol";

const requests = JSON.parse(readFileSync(process.argv[2], "utf8")) as Request[];
process.stdout.write(JSON.stringify({
  payloads: requests.map((r) => JSON.stringify(r)),
  canonical: requests.map(canonicalRequest),
  digests: requests.map(requestDigest),
}) + "\n");

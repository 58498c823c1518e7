/** The request payload: checked, encoded as UTF-8 JSON, and bounded by the payload limit. */
import { PayloadTooLarge } from "./errors";
import { MAX_PAYLOAD_BYTES } from "./limits";
import { validateRequest } from "./validate";

/** The stream entry's `data` for `request`: {@link InvalidRequest} or {@link PayloadTooLarge} if a worker would refuse it. */
export function encodeRequest(request: unknown): Buffer {
  validateRequest(request);
  const payload = Buffer.from(JSON.stringify(request), "utf8");
  if (payload.length > MAX_PAYLOAD_BYTES) throw new PayloadTooLarge(payload.length);
  return payload;
}

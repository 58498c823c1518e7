/**
 * The bounds a worker enforces when it decodes a request (mirrors `shared/limits.py`; a test
 * keeps the two equal). Lengths of strings count Unicode code points, as JSON Schema does.
 */
export const PROTOCOL_VERSION = 1;

export const MAX_PAYLOAD_BYTES = 512 * 1024;
export const MAX_PROMPT_CHARS = 200_000;
export const MAX_PROMPT_TOKENS = 32_768;
export const MAX_MESSAGES = 256;
export const MAX_MESSAGE_CHARS = 100_000;
export const MAX_TOKENS = 16_384;
export const MAX_STOP_STRINGS = 16;
export const MAX_STOP_STRING_CHARS = 256;
export const MAX_STOP_TOKEN_IDS = 64;
export const MAX_LOGPROBS = 20;
export const MAX_N = 16;
export const MAX_STRUCTURED_SPEC_CHARS = 64 * 1024;
export const MAX_CHOICES = 256;
export const MAX_CHOICE_CHARS = 1024;
export const MAX_METADATA_ITEMS = 32;
export const MAX_METADATA_KEY_CHARS = 64;
export const MAX_METADATA_VALUE_CHARS = 1024;
export const MAX_TOKEN_ID = 2 ** 31 - 1;
export const MAX_TOP_K = 2 ** 31 - 1;
export const MAX_UNIX_TIME = 1e11;
/** Every integer of the protocol is within +-(2^53 - 1): a JavaScript number holds it exactly. */
export const MAX_SAFE_INTEGER = Number.MAX_SAFE_INTEGER;

export const REQUEST_ID_PATTERN = "^[A-Za-z0-9][A-Za-z0-9._:\\-]{0,127}$(?!\\n)";
export const TENANT_PATTERN = "^[A-Za-z0-9][A-Za-z0-9._\\-]{0,63}$(?!\\n)";
export const MODEL_NAME_PATTERN = "^[A-Za-z0-9][A-Za-z0-9._\\-]{0,63}$(?!\\n)";

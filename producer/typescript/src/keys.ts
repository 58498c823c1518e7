/**
 * Every Redis key and channel name a client uses (mirrors `shared/keys.py`).
 *
 * A tenant's request streams share the hash tag `{tenant}`; a request's keys share the hash
 * tag `{tenant/request_id}`, so on a Redis Cluster each request lives in one slot.
 */
import { MODEL_NAME_PATTERN, REQUEST_ID_PATTERN, TENANT_PATTERN } from "./limits";

export const PREFIX = "fleet";
/** Served strictly in this order. */
export const LANES = ["high", "default", "batch"] as const;
export type Lane = (typeof LANES)[number];
export const STREAM_FIELD = "data";
export const DEFAULT_TENANT = "default";

const MODEL_RE = new RegExp(MODEL_NAME_PATTERN);
const ID_RE = new RegExp(REQUEST_ID_PATTERN);
const TENANT_RE = new RegExp(TENANT_PATTERN);

function check(re: RegExp, value: string, what: string): string {
  if (typeof value !== "string" || !re.test(value)) {
    throw new RangeError(`invalid ${what} ${JSON.stringify(value)}`);
  }
  return value;
}

export const checkModel = (model: string): string => check(MODEL_RE, model, "model name");
export const checkTenant = (tenant: string): string => check(TENANT_RE, tenant, "tenant name");
export const checkRequestId = (id: string): string => check(ID_RE, id, "request id");

export function checkLane(lane: string): Lane {
  if (!(LANES as readonly string[]).includes(lane)) {
    throw new RangeError(`unknown lane ${JSON.stringify(lane)}; expected one of ${LANES.join(", ")}`);
  }
  return lane as Lane;
}

/** One tenant's request stream of one lane. */
export function streamKey(model: string, tenant: string, lane: Lane): string {
  return `${PREFIX}:${checkModel(model)}:requests:{${checkTenant(tenant)}}:${checkLane(lane)}`;
}

/** The stream every tenant shared before per-tenant streams (workers drain it; write nothing there). */
export function legacyStreamKey(model: string, lane: Lane): string {
  return `${PREFIX}:${checkModel(model)}:requests:${checkLane(lane)}`;
}

/** Hash: tenant name -> its registry entry (JSON). */
export const tenantsKey = (): string => `${PREFIX}:tenants`;
export const deadLetterKey = (model: string): string => `${PREFIX}:${checkModel(model)}:dead`;
/** Broadcast channel to every worker of a model (cancel notices). */
export const controlChannel = (model: string): string => `${PREFIX}:${checkModel(model)}:control`;
export const workersKey = (model: string): string => `${PREFIX}:${checkModel(model)}:workers`;
export const workerKey = (model: string, workerId: string): string =>
  `${PREFIX}:${checkModel(model)}:worker:${workerId}`;

export function requestTag(tenant: string, requestId: string): string {
  return `{${checkTenant(tenant)}/${checkRequestId(requestId)}}`;
}

/** Hash: the workers' bookkeeping; field `result` = the terminal event once done. */
export const stateKey = (tenant: string, id: string): string => `${PREFIX}:req:${requestTag(tenant, id)}:state`;
/** List: every token event published, in order. */
export const progressKey = (tenant: string, id: string): string =>
  `${PREFIX}:req:${requestTag(tenant, id)}:progress`;
/** String: present when the client asked to cancel. */
export const cancelKey = (tenant: string, id: string): string => `${PREFIX}:req:${requestTag(tenant, id)}:cancel`;
/** Channel of the request's events (sharded pub/sub on a cluster). */
export const eventsChannel = (tenant: string, id: string): string =>
  `${PREFIX}:req:${requestTag(tenant, id)}:events`;

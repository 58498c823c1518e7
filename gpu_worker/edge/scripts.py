"""The Lua scripts that make the worker's Redis writes atomic and owner-checked.

Per-request scripts take a :class:`RequestKeys` as KEYS (state, progress, cancel,
channel: one hash tag, one cluster slot; the channel is declared as a key so SPUBLISH
works on a cluster). The owner token ``<worker>#<fence>`` written by ``BEGIN`` is
the fencing token: every later write checks it, so a worker that was paused and lost the
request to another worker can no longer publish into it or finish it.

Stream scripts take the stream as their only key and check the pending entry's consumer
before touching it, because XCLAIM and XACK themselves do not.
"""
from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass
from typing import NamedTuple

from shared import keys

# KEYS: state, progress, cancel, channel. ARGV: worker_id, entry_ref, ttl_ms, now, digest
# ('' for none), the id_conflict failure JSON, n. Renews the TTL of the state and of any
# stored progress (PUBLISH renews them together after). The first entry begun stores its
# request's digest; an entry whose digest differs gets the failure stored in the state
# field ``conflict:<entry_ref>`` (its own, read by its client), and nothing else changes.
# -> Begun: {'done'} | {'duplicate'} | {'conflict'} | {'ok', owner, cancelled, first_start,
#    first_token_at, progress..., {ended choice JSON...}} (the last item, an array)
BEGIN = """
local digest = redis.call('HGET', KEYS[1], 'digest')
if digest and ARGV[5] ~= '' and digest ~= ARGV[5] then
  redis.call('HSET', KEYS[1], 'conflict:' .. ARGV[2], ARGV[6])
  if redis.call('PTTL', KEYS[1]) < 0 then redis.call('PEXPIRE', KEYS[1], ARGV[3]) end
  return {'conflict'}
end
local status = redis.call('HGET', KEYS[1], 'status')
if status == 'done' then return {'done'} end
local entry = redis.call('HGET', KEYS[1], 'entry')
if entry and entry ~= ARGV[2] then return {'duplicate'} end
local fence = redis.call('HINCRBY', KEYS[1], 'fence', 1)
local owner = ARGV[1] .. '#' .. fence
redis.call('HSET', KEYS[1], 'owner', owner, 'entry', ARGV[2], 'status', 'running')
if ARGV[5] ~= '' then redis.call('HSETNX', KEYS[1], 'digest', ARGV[5]) end
redis.call('HSETNX', KEYS[1], 'first_start', ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[3])  -- a resumed request's progress lives as long
local first_start = redis.call('HGET', KEYS[1], 'first_start')
local first_token = redis.call('HGET', KEYS[1], 'first_token_at') or ''
local reply = {'ok', owner, tostring(redis.call('EXISTS', KEYS[3])), first_start, first_token}
for _, event in ipairs(redis.call('LRANGE', KEYS[2], 0, -1)) do table.insert(reply, event) end
local ended = {}
for i = 0, tonumber(ARGV[7] or '1') - 1 do
  local choice = redis.call('HGET', KEYS[1], 'choice:' .. i)
  if choice then table.insert(ended, choice) end
end
table.insert(reply, ended)
return reply
"""

# KEYS: state, progress, cancel, channel. ARGV: owner, ttl_ms, publish command, event JSON,
# first-token time or '', seq, end (the event's tokens are [seq, end)). The state's
# ``published`` count makes a retried write idempotent and keeps the channel in order.
# Six commands a call: the TTLs are set when the progress list is created and renewed only
# once a tenth of the TTL has passed (the state's PTTL says when), not at every event, so
# a request's keys outlive its last write by at least 0.9 x ttl while it runs (FINISH
# renews both in full).
# ARGV[8], for choice i > 0 of a request with n > 1: its own count, ``published:<i>``.
# -> Published: 0 fenced | 1 ok | 2 ok, and cancel was asked | 3 duplicate (already stored)
# | 4 gap (an earlier event is not stored yet: retry after it).
PUBLISH = """
local counter = ARGV[8] or 'published'
local state = redis.call('HMGET', KEYS[1], 'owner', counter)
if state[1] ~= ARGV[1] then return 0 end
local published = state[2]
if published then
  published = tonumber(published)
  if tonumber(ARGV[7]) <= published then return 3 end
  if tonumber(ARGV[6]) > published then return 4 end
end
local length = redis.call('RPUSH', KEYS[2], ARGV[4])
if ARGV[5] ~= '' and not published then  -- nothing stored yet, so no first-token time either
  redis.call('HSET', KEYS[1], counter, ARGV[7], 'first_token_at', ARGV[5])
else
  redis.call('HSET', KEYS[1], counter, ARGV[7])
  if ARGV[5] ~= '' then redis.call('HSETNX', KEYS[1], 'first_token_at', ARGV[5]) end
end
redis.call(ARGV[3], KEYS[4], ARGV[4])
if length == 1 or redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) * 0.9 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
end
if redis.call('EXISTS', KEYS[3]) == 1 then return 2 end
return 1
"""

# KEYS: state, progress, cancel, channel. ARGV: owner, ttl_ms, publish command, terminal JSON,
# number of output tokens or '' (a failure), then those of choices 1..n-1 (n > 1). Stores
# the result durably, then publishes it.
# -> Finished: 0 fenced | 1 stored | 2 gap (a token event is not stored yet: retry after it).
FINISH = """
local state = redis.call('HMGET', KEYS[1], 'owner', 'published')
if state[1] ~= ARGV[1] then return 0 end
if ARGV[5] ~= '' and state[2] and tonumber(state[2]) < tonumber(ARGV[5]) then return 2 end
for i = 6, #ARGV do
  local stored = tonumber(redis.call('HGET', KEYS[1], 'published:' .. (i - 5)) or '0')
  if stored < tonumber(ARGV[i]) then return 2 end
end
redis.call('HSET', KEYS[1], 'status', 'done', 'result', ARGV[4])
redis.call('HDEL', KEYS[1], 'owner')
redis.call(ARGV[3], KEYS[4], ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[2])  -- a no-op where no token was stored
redis.call('DEL', KEYS[3])
return 1
"""

# KEYS: state, progress, cancel, channel. ARGV: owner, choice index, choice JSON, its number
# of tokens. Stores how one choice of several ended (read back by BEGIN on a resume).
# -> Finished: 0 fenced | 1 stored | 2 gap.
END_CHOICE = """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return 0 end
local counter = ARGV[2] == '0' and 'published' or ('published:' .. ARGV[2])
if tonumber(redis.call('HGET', KEYS[1], counter) or '0') < tonumber(ARGV[4]) then return 2 end
redis.call('HSET', KEYS[1], 'choice:' .. ARGV[2], ARGV[3])
return 1
"""

_OWNED = """
local function owned(id)
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], id, id, 1)
  if p[1] and p[1][2] == ARGV[2] then return p[1] end
  return nil
end
"""

# KEYS: stream. ARGV: group, consumer, ids... Resets the idle time of the entries this
# consumer still owns (so XAUTOCLAIM leaves them alone). -> the ids it no longer owns.
RENEW = _OWNED + """
local lost = {}
for i = 3, #ARGV do
  if owned(ARGV[i]) then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')
  else
    table.insert(lost, ARGV[i])
  end
end
return lost
"""

# KEYS: stream. ARGV: group, consumer, ids... Acknowledges and deletes the entries this
# consumer owns (served work only: nothing unacknowledged is ever removed). -> count.
ACK = _OWNED + """
local n = 0
for i = 3, #ARGV do
  if owned(ARGV[i]) then
    redis.call('XACK', KEYS[1], ARGV[1], ARGV[i])
    redis.call('XDEL', KEYS[1], ARGV[i])
    n = n + 1
  end
end
return n
"""

# KEYS: stream. ARGV: group, consumer, handoff consumer, idle_ms, ids... Gives owned
# entries back: moves them to the handoff consumer already idle past the claim threshold
# (claimable at once) without counting this delivery. -> count.
HANDOFF = _OWNED + """
local n = 0
for i = 5, #ARGV do
  local p = owned(ARGV[i])
  if p then
    local retries = math.max(tonumber(p[4]) - 1, 0)
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[3], 0, ARGV[i], 'IDLE', ARGV[4],
               'RETRYCOUNT', retries, 'JUSTID')
    n = n + 1
  end
end
return n
"""


@dataclass(frozen=True)
class Script:
    name: str
    source: str

    @property
    def sha(self) -> str:
        return hashlib.sha1(self.source.encode()).hexdigest()


ALL = {"begin": BEGIN, "publish": PUBLISH, "finish": FINISH, "end_choice": END_CHOICE,  # name -> source
       "renew": RENEW, "ack": ACK, "handoff": HANDOFF}


class RequestKeys(NamedTuple):
    """The KEYS of every per-request script, in the order the scripts use them."""

    state: str
    progress: str
    cancel: str
    channel: str

    @classmethod
    def of(cls, tenant: str, request_id: str) -> "RequestKeys":
        return cls(*keys.request_keys(tenant, request_id))


class Published(enum.IntEnum):
    """PUBLISH's reply."""

    FENCED = 0
    OK = 1
    CANCEL_ASKED = 2
    DUPLICATE = 3
    GAP = 4


class Finished(enum.IntEnum):
    """FINISH's reply."""

    FENCED = 0
    STORED = 1
    GAP = 2


def as_str(value: bytes | str | None) -> str:
    """A reply's text (None: '')."""
    return value.decode() if isinstance(value, bytes) else (value or "")


@dataclass(frozen=True)
class Begun:
    """BEGIN's reply. ``status``: ``ok`` (this worker owns the request now), ``done`` (a
    result is stored), ``duplicate`` (another entry owns the request id) or ``conflict``
    (the id holds a different request: this entry's failure is stored for its client). For
    ``ok``: the fencing token, whether a cancel is pending, the first start and first-token
    times of any earlier attempt, the choices an earlier attempt ended (JSON) and the stored
    progress (token event JSON, in order)."""

    status: str
    owner: str = ""
    cancelled: bool = False
    first_start: float = 0.0
    first_token_at: float | None = None
    progress: tuple[bytes, ...] = ()
    ended_choices: tuple[bytes, ...] = ()

    @classmethod
    def parse(cls, reply: list) -> "Begun":
        status = as_str(reply[0])
        if status != "ok":
            return cls(status)
        first_token = as_str(reply[4])
        rest = list(reply[5:])
        ended = rest.pop() if rest and isinstance(rest[-1], list) else []
        return cls(status, owner=as_str(reply[1]), cancelled=as_str(reply[2]) == "1",
                   first_start=float(reply[3]),
                   first_token_at=float(first_token) if first_token else None,
                   progress=tuple(rest), ended_choices=tuple(ended))

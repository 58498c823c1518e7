"""The per-request scripts as they were before the edge's cost was cut (commit 9a02502),
for the ``baseline`` runs of ``fleet bench edge``: the same replies and arguments, more
commands.

PUBLISH ran eight commands per token event (two HGETs, and both TTLs renewed at every
event); FINISH nine; BEGIN did not renew the stored progress's TTL.
"""
from __future__ import annotations

from gpu_worker.edge import scripts

# Kept verbatim (not derived from the current BEGIN): the baseline must not move with it.
BEGIN = """
local status = redis.call('HGET', KEYS[1], 'status')
if status == 'done' then return {'done'} end
local entry = redis.call('HGET', KEYS[1], 'entry')
if entry and entry ~= ARGV[2] then return {'duplicate'} end
local fence = redis.call('HINCRBY', KEYS[1], 'fence', 1)
local owner = ARGV[1] .. '#' .. fence
redis.call('HSET', KEYS[1], 'owner', owner, 'entry', ARGV[2], 'status', 'running')
redis.call('HSETNX', KEYS[1], 'first_start', ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
local first_start = redis.call('HGET', KEYS[1], 'first_start')
local first_token = redis.call('HGET', KEYS[1], 'first_token_at') or ''
local reply = {'ok', owner, tostring(redis.call('EXISTS', KEYS[3])), first_start, first_token}
for _, event in ipairs(redis.call('LRANGE', KEYS[2], 0, -1)) do table.insert(reply, event) end
return reply
"""

# KEYS: state, progress, cancel, channel. ARGV: owner, ttl_ms, publish command, event JSON,
# first-token time or '', seq, end (the event's tokens are [seq, end)). The state's
# ``published`` count makes a retried write idempotent and keeps the channel in order.
# -> Published: 0 fenced | 1 ok | 2 ok, and cancel was asked | 3 duplicate (already stored)
# | 4 gap (an earlier event is not stored yet: retry after it).
PUBLISH = """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return 0 end
local published = redis.call('HGET', KEYS[1], 'published')
if published then
  published = tonumber(published)
  if tonumber(ARGV[7]) <= published then return 3 end
  if tonumber(ARGV[6]) > published then return 4 end
end
redis.call('RPUSH', KEYS[2], ARGV[4])
redis.call('HSET', KEYS[1], 'published', ARGV[7])
redis.call(ARGV[3], KEYS[4], ARGV[4])
if ARGV[5] ~= '' then redis.call('HSETNX', KEYS[1], 'first_token_at', ARGV[5]) end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
if redis.call('EXISTS', KEYS[3]) == 1 then return 2 end
return 1
"""

# KEYS: state, progress, cancel, channel. ARGV: owner, ttl_ms, publish command, terminal JSON,
# number of output tokens or '' (a failure). Stores the result durably, then publishes it.
# -> Finished: 0 fenced | 1 stored | 2 gap (a token event is not stored yet: retry after it).
FINISH = """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return 0 end
local published = redis.call('HGET', KEYS[1], 'published')
if ARGV[5] ~= '' and published and tonumber(published) < tonumber(ARGV[5]) then return 2 end
redis.call('HSET', KEYS[1], 'status', 'done', 'result', ARGV[4])
redis.call('HDEL', KEYS[1], 'owner')
redis.call(ARGV[3], KEYS[4], ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
if redis.call('EXISTS', KEYS[2]) == 1 then redis.call('PEXPIRE', KEYS[2], ARGV[2]) end
redis.call('DEL', KEYS[3])
return 1
"""

SCRIPTS = {"begin": BEGIN, "publish": PUBLISH, "finish": FINISH}


def install(io) -> None:
    """Make the worker's :class:`~gpu_worker.edge.redis_io.RedisIO` run these instead
    (before it connects: it loads its scripts then)."""
    io.scripts.update(SCRIPTS)
    io.shas.update({name: scripts.Script(name, src).sha for name, src in SCRIPTS.items()})

"""The Redis-side half of temporal storage: the Lua scripts TemporalStorage runs on the run's hash
slot, and the key and argument contract of each.

Each script runs atomically on one node (every key it names shares the run's hash tag), so a
reservation, a commit or a snapshot is one round trip that no other writer interleaves with.
buffer/storage.py holds the Python half: the three-step write, eviction and the readers.
"""

NEW, RETRY, DUPLICATE = 0, 1, 2

# KEYS: head, oldest, dedup, pending, evict, skipped.
# ARGV: n, capacity, window_size, seq (0 = no idempotency key), dedup_ttl_sec, now_ms.
# Returns {status, start, oldest, evict...}: status NEW, RETRY (rewrite [start, start + n)) or
# DUPLICATE (stored before); evict: up to 8 windows waiting to be UNLINKed.
RESERVE_LUA = """
local n, seq = tonumber(ARGV[1]), tonumber(ARGV[4])
local oldest = tonumber(redis.call('GET', KEYS[2]) or '0')
local function evictions(status, start)
  local out = {status, start, oldest}
  for _, w in ipairs(redis.call('SRANDMEMBER', KEYS[5], 8)) do table.insert(out, tonumber(w)) end
  return out
end
if seq > 0 then
  local last = tonumber(redis.call('HGET', KEYS[3], 'seq') or '0')
  if seq < last then return evictions(2, -1) end
  if seq == last then
    local start = tonumber(redis.call('HGET', KEYS[3], 'start'))
    local state = redis.call('HGET', KEYS[3], 'state')
    if state == 'done' then return evictions(2, start) end
    local skipped = #redis.call('ZRANGEBYSCORE', KEYS[6], start, start) > 0
    if state == 'pending' and not skipped and tonumber(redis.call('HGET', KEYS[3], 'n')) == n then
      return evictions(1, start)
    end
  end
end
local head = redis.call('INCRBY', KEYS[1], n)
local start = head - n
if seq > 0 then
  redis.call('HSET', KEYS[3], 'seq', seq, 'start', start, 'n', n, 'state', 'pending')
  redis.call('EXPIRE', KEYS[3], ARGV[5])
end
redis.call('ZADD', KEYS[4], start, start .. ':' .. n .. ':' .. ARGV[6] .. ':0')
local capacity, window_size = tonumber(ARGV[2]), tonumber(ARGV[3])
if head > capacity then
  local live = math.floor((head - capacity) / window_size)
  if live > oldest then
    for w = oldest, live - 1 do redis.call('SADD', KEYS[5], w) end
    redis.call('SET', KEYS[2], live)
    oldest = live
  end
end
return evictions(0, start)
"""

# KEYS: committed, pending, dedup, skipped, oldest, evict, counters.
# ARGV: start (-1: only advance), n, seq, now_ms, stalled_ms, window_size, first_window, last_window,
# env_steps, task_id (the batch's, counted when this call commits it), demo_sampler (a
# demonstration's sampler id, counted per sampler; -1 for any other batch).
# Returns {state, committed, oldest}: state 1 committed by this call, 2 by an earlier attempt,
# -1 skipped as stalled (the caller reserves anew).
COMMIT_LUA = """
local start, n, seq = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local now, stalled, window_size = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local state = 1
if start >= 0 then
  local mine = redis.call('ZRANGEBYSCORE', KEYS[2], start, start)
  if #mine == 0 then
    if #redis.call('ZRANGEBYSCORE', KEYS[4], start, start) > 0 then state = -1 else state = 2 end
  elseif string.sub(mine[1], -1) == '1' then
    state = 2
  else
    redis.call('ZREM', KEYS[2], mine[1])
    redis.call('ZADD', KEYS[2], start, string.sub(mine[1], 1, -2) .. '1')
  end
  if state >= 1 and seq > 0 and tonumber(redis.call('HGET', KEYS[3], 'start') or '-1') == start then
    redis.call('HSET', KEYS[3], 'state', 'done')
  end
  if state == 1 then
    redis.call('HINCRBY', KEYS[7], 'batches', 1)
    redis.call('HINCRBY', KEYS[7], 'env_steps', ARGV[9])
    redis.call('HINCRBY', KEYS[7], 'env_steps:' .. ARGV[10], ARGV[9])
    if tonumber(ARGV[11]) >= 0 then redis.call('HINCRBY', KEYS[7], 'demo:' .. ARGV[11], 1) end
  end
end
local committed = tonumber(redis.call('GET', KEYS[1]) or '0')
while true do
  local first = redis.call('ZRANGE', KEYS[2], 0, 0)
  if #first == 0 then break end
  local s, m, t, done = string.match(first[1], '^(%d+):(%d+):(%d+):(%d)$')
  s, m, t = tonumber(s), tonumber(m), tonumber(t)
  if done == '1' then
    committed = s + m
  elseif now - t > stalled then
    redis.call('ZADD', KEYS[4], s, s .. ':' .. m)
    committed = s + m
  else
    break
  end
  redis.call('ZREM', KEYS[2], first[1])
end
redis.call('SET', KEYS[1], committed)
local oldest = tonumber(redis.call('GET', KEYS[5]) or '0')
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', '(' .. (oldest * window_size - 2 * window_size))
if start >= 0 and state >= 1 then
  for w = tonumber(ARGV[7]), math.min(tonumber(ARGV[8]), oldest - 1) do redis.call('SADD', KEYS[6], w) end
end
return {state, committed, oldest}
"""

# KEYS: committed, oldest, skipped. Returns {committed, oldest, "start:n"...}: one round trip.
SNAPSHOT_LUA = """
local out = {tonumber(redis.call('GET', KEYS[1]) or '0'), tonumber(redis.call('GET', KEYS[2]) or '0')}
for _, m in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do table.insert(out, m) end
return out
"""

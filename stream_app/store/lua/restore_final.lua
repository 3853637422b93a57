-- KEYS as claim_final.lua, KEYS[6] = retention floor. ARGV = fence, t, revision, n, estimate JSON, wall. A final read
-- back from ldp.estimates (the record of what was published): recorded unless the store knows a later revision
-- or the step is below the floor; its pending mark (if it is the one pending) is cleared: it was published. The
-- campaign's fence is raised to the publisher's. Returns 1 if the history changed.
local fence = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) > fence then
  redis.call('SET', KEYS[1], ARGV[1])
end
if tonumber(ARGV[2]) < tonumber(redis.call('GET', KEYS[6]) or '0') then
  return 0
end
if redis.call('HGET', KEYS[4], ARGV[2]) == ARGV[3] then
  redis.call('HDEL', KEYS[4], ARGV[2])
end
local cur = redis.call('HGET', KEYS[2], ARGV[2])
if cur and tonumber(string.match(cur, ':(%-?%d+)$') or '-1') >= tonumber(ARGV[3]) then
  return 0
end
redis.call('HSET', KEYS[2], ARGV[2], ARGV[4] .. ':' .. ARGV[3])
redis.call('HSET', KEYS[3], ARGV[2], ARGV[5])
redis.call('HDEL', KEYS[4], ARGV[2])
if ARGV[6] ~= '1' and tonumber(ARGV[2]) > tonumber(redis.call('GET', KEYS[5]) or '-1') then
  redis.call('SET', KEYS[5], ARGV[2])
end
return 1

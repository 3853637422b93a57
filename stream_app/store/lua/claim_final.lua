-- KEYS[1] = the campaign's fence, KEYS[2] = finals index, KEYS[3] = estimates (history), KEYS[4] = pending finals,
-- KEYS[5] = the campaign's newest final logical step. ARGV = token, t, revision, n, estimate JSON, wall ('1'/'0').
-- Claim revision ARGV[3] of step t for the holder of token ARGV[1]: refused ({0, fence}) if a newer holder raised
-- the campaign's fence; {2, '<n>:<revision>'} if this or a later revision was claimed before (by anyone); else the
-- final is recorded in the history and the finals index, marked pending until its publication is confirmed, and
-- {1, ''} returned: only the claimant publishes it.
local fence = tonumber(redis.call('GET', KEYS[1]) or '0')
local token = tonumber(ARGV[1])
if token < fence then
  return {0, tostring(fence)}
end
if token > fence then
  redis.call('SET', KEYS[1], ARGV[1])
end
local cur = redis.call('HGET', KEYS[2], ARGV[2])
if cur then
  local rev = tonumber(string.match(cur, ':(%-?%d+)$') or '-1')
  if rev >= tonumber(ARGV[3]) then
    return {2, cur}
  end
end
redis.call('HSET', KEYS[2], ARGV[2], ARGV[4] .. ':' .. ARGV[3])
redis.call('HSET', KEYS[3], ARGV[2], ARGV[5])
redis.call('HSET', KEYS[4], ARGV[2], ARGV[3])
if ARGV[6] ~= '1' and tonumber(ARGV[2]) > tonumber(redis.call('GET', KEYS[5]) or '-1') then
  redis.call('SET', KEYS[5], ARGV[2])
end
return {1, ''}

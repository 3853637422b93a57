-- KEYS[1] = lease key, KEYS[2] = fence counter. ARGV = holder, ttl (ms), now (ms). Take a free lease or renew one's
-- own; returns the holder's fencing token (0: another worker holds the lease). A new holder's token is the counter
-- incremented; a counter that is missing (a new or emptied store) starts at the current time in milliseconds, so a
-- token drawn after a store loss is still above every token drawn before it.
local cur = redis.call('GET', KEYS[1])
if not cur then
  if redis.call('EXISTS', KEYS[2]) == 0 then
    redis.call('SET', KEYS[2], ARGV[3])
  end
  local token = redis.call('INCR', KEYS[2])
  redis.call('SET', KEYS[1], ARGV[1] .. '|' .. token, 'PX', ARGV[2])
  return token
end
local sep = string.find(cur, '|', 1, true)
if sep and string.sub(cur, 1, sep - 1) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return tonumber(string.sub(cur, sep + 1))
end
return 0

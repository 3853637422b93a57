-- KEYS[1] = floor key. ARGV = floor. Raise the retention floor, never lower it; returns the floor.
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
local new = tonumber(ARGV[1])
if new > cur then
  redis.call('SET', KEYS[1], ARGV[1])
  return new
end
return cur

-- KEYS[1] = lease key. ARGV = holder. Delete the lease only if the holder still owns it.
local cur = redis.call('GET', KEYS[1])
if cur and string.sub(cur, 1, #ARGV[1] + 1) == ARGV[1] .. '|' then
  return redis.call('DEL', KEYS[1])
end
return 0

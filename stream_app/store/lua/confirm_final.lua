-- KEYS[1] = pending finals. ARGV = t, revision. The publication of that revision was acknowledged.
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  return redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0

-- KEYS = floor, steps, estimates, finals, closed_ts, touched, pruned, pending, count key of t1, count key of t2, ...;
-- ARGV = t1, t2, ... Forget each step below the floor (a step at or above it is left alone); count in `pruned`
-- the steps that leave the index above the highest pruned before (a step recreated below it is not counted
-- twice). Returns {how many left the step index, the pruned count}.
local floor = tonumber(redis.call('GET', KEYS[1]) or '0')
local top = tonumber(redis.call('HGET', KEYS[7], 'max') or '-1')
local count = tonumber(redis.call('HGET', KEYS[7], 'count') or '0')
local removed = 0
for i = 1, #ARGV do
  local t = tonumber(ARGV[i])
  if t < floor then
    redis.call('UNLINK', KEYS[8 + i], KEYS[8 + i] .. ':reports')
    local gone = redis.call('ZREM', KEYS[2], ARGV[i])
    removed = removed + gone
    if gone == 1 and t > top then
      top = t
      count = count + 1
    end
    redis.call('HDEL', KEYS[3], ARGV[i])
    redis.call('HDEL', KEYS[4], ARGV[i])
    redis.call('HDEL', KEYS[5], ARGV[i])
    redis.call('ZREM', KEYS[6], ARGV[i])
    redis.call('HDEL', KEYS[8], ARGV[i])
  end
end
redis.call('HSET', KEYS[7], 'max', top, 'count', count)
return {removed, count}

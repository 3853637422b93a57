-- Body of the batch apply (between apply_prelude.lua and apply_epilogue.lua). ARGV[11] now, ARGV[12] n,
-- ARGV[13] batch id, ARGV[14] where ('<partition>:<offset>'), ARGV[15] dtype ('int64' or 'float64'),
-- ARGV[16] shape ('k' or 'r,c'), ARGV[17] reports rejected by the poisoning defense, ARGV[18] the batch's
-- packed reports to append to the step's report log KEYS[1] .. ':reports' ('' = none kept), then flat index,
-- value, flat index, value, ...
if redis.call('HSETNX', KEYS[1], 'b:' .. ARGV[13], ARGV[14]) == 0 then
  status = 2
else
  redis.call('HSETNX', KEYS[1], 'dtype', ARGV[15])
  redis.call('HSETNX', KEYS[1], 'shape', ARGV[16])
  if ARGV[15] == 'int64' then
    for i = 19, #ARGV, 2 do
      redis.call('HINCRBY', KEYS[1], 'c:' .. ARGV[i], ARGV[i + 1])
    end
  else
    for i = 19, #ARGV, 2 do
      redis.call('HINCRBYFLOAT', KEYS[1], 'c:' .. ARGV[i], ARGV[i + 1])
    end
  end
  redis.call('HINCRBY', KEYS[1], 'n', ARGV[12])
  if ARGV[17] ~= '0' then
    redis.call('HINCRBY', KEYS[1], 'rejected', ARGV[17])
  end
  if ARGV[18] ~= '' then
    redis.call('APPEND', KEYS[1] .. ':reports', ARGV[18])
  end
  redis.call('HSETNX', KEYS[1], 'first_ts', ARGV[11])
  redis.call('HSET', KEYS[1], 'last_ts', ARGV[11])
  if ARGV[3] == '1' then
    redis.call('HSET', KEYS[1], 'wall', 1)
  end
  redis.call('ZADD', KEYS[4], t, ARGV[2])
  redis.call('ZINCRBY', KEYS[5], 1, ARGV[2])
end

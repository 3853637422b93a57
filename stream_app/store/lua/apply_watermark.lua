-- Body of the watermark apply (between apply_prelude.lua and apply_epilogue.lua). ARGV[11] the reports the
-- step's sender sent (kept as 'expected', the largest stated).
status = redis.call('HSETNX', KEYS[1], 'closed', 1)
if status == 1 then
  redis.call('ZADD', KEYS[4], t, ARGV[2])
end
if tonumber(ARGV[11]) > tonumber(redis.call('HGET', KEYS[1], 'expected') or '0') then
  redis.call('HSET', KEYS[1], 'expected', ARGV[11])
end

-- Shared tail of apply_batch.lua and apply_watermark.lua: the campaign's cursor of the message's partition and
-- (one node) the consumer group's position, written with the counts; then the result.
if ARGV[8] ~= '' then
  redis.call('HSET', KEYS[8], ARGV[8], ARGV[9])
end
if ARGV[10] ~= '' and KEYS[9] then
  redis.call('HSET', KEYS[9], ARGV[10], ARGV[9])
end
return {status, marker}

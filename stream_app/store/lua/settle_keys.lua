-- KEYS: the records to write, then the keys to delete; ARGV: the number of records, then value, ttl of each.
local records = tonumber(ARGV[1])
for i = 1, records do
  redis.call('SET', KEYS[i], ARGV[2 * i], 'EX', ARGV[2 * i + 1])
end
for i = records + 1, #KEYS do
  redis.call('DEL', KEYS[i])
end
return records

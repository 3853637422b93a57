-- Ingest claims on one node (a cluster uses pipelines: the keys of one batch spread over its slots).
-- KEYS: the keys; ARGV: value, ttl of each. Per key: 1 if this SET NX won, else what the key holds (false: expired).
local out = {}
for i, key in ipairs(KEYS) do
  if redis.call('SET', key, ARGV[2 * i - 1], 'NX', 'EX', ARGV[2 * i]) then
    out[i] = 1
  else
    out[i] = redis.call('GET', key)
  end
end
return out

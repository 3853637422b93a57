-- KEYS[1] = touched key. ARGV = t1, score1, t2, score2, ...: remove each mark whose score is still the one read
-- (a batch applied since then incremented it: the mark stays for the next look). Returns how many were removed.
local removed = 0
for i = 1, #ARGV, 2 do
  local s = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if s and tonumber(s) == tonumber(ARGV[i + 1]) then
    removed = removed + redis.call('ZREM', KEYS[1], ARGV[i])
  end
end
return removed

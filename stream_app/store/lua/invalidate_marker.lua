-- KEYS[1] a campaign's server marker. ARGV[1] the token this store applied under, ARGV[2] a fresh token.
-- Run on a new connection to a restarted (or failed-over) server: the marker changes, so every apply still
-- carrying the old token is refused (SERVER_CHANGED) until the worker checked the cursors. A marker another
-- worker changed already is left alone.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2])
  return 1
end
return 0

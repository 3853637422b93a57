-- Shared head of apply_batch.lua and apply_watermark.lua (stream_app/store/counts.py).
-- KEYS[1] count key of the step, KEYS[2] the campaign's epoch, KEYS[3] the attribute's retention floor,
-- KEYS[4] the attribute's step index, KEYS[5] its touched marks, KEYS[6] the campaign's newest final step,
-- KEYS[7] the campaign's server marker, KEYS[8] the campaign's cursors, KEYS[9] (one node only) the positions.
-- ARGV[1] epoch, ARGV[2] t, ARGV[3] wall ('1': a wall-clock step of the HTTP ingest), ARGV[4] wall limit,
-- ARGV[5] ahead, ARGV[6] the marker token the worker last applied under ('' = none yet), ARGV[7] a fresh token
-- (the marker if there is none), ARGV[8] cursor field, ARGV[9] cursor / position value, ARGV[10] position field;
-- from ARGV[11] on: the script's own arguments.
-- Every result is {status, marker}.
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return {3, ''}
end
local marker = redis.call('GET', KEYS[7])
if not marker then
  marker = ARGV[7]
  redis.call('SET', KEYS[7], marker)
end
if ARGV[6] ~= '' and ARGV[6] ~= marker then
  return {5, marker}
end
local t = tonumber(ARGV[2])
local floor = redis.call('GET', KEYS[3])
if floor and t < tonumber(floor) then
  return {4, marker}
end
if ARGV[3] == '1' then
  if t > tonumber(ARGV[4]) then
    return {6, marker}
  end
else
  local high = redis.call('GET', KEYS[6])
  if high and t > tonumber(high) + tonumber(ARGV[5]) then
    return {6, marker}
  end
end
local status = 1

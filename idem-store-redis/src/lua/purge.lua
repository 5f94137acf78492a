-- KEYS: records found by SCAN. ARGV: 1 the caller's now ('' = the server's clock).
-- Deletes those that expired, never a
-- PROCESSING record whose lease still runs or that has none (as the SQL purges);
-- returns how many. A finished record past its replay but not expired is stripped to
-- a tombstone instead (not counted). (On a cluster each call
-- carries the keys of one slot.)
local now = now_from(ARGV[1])
local purged = 0
for _, k in ipairs(KEYS) do
  local h = load(k)
  if h ~= nil and tonumber(h.expires_at) <= now and
     (h.status ~= 'PROCESSING' or (h.lease_until ~= nil and tonumber(h.lease_until) <= now)) then
    redis.call('DEL', k)
    purged = purged + 1
  elseif h ~= nil and h.status ~= 'PROCESSING' and h.tombstone == nil and h.replay_until ~= nil
     and tonumber(h.replay_until) <= now and tonumber(h.expires_at) > now then
    redis.call('HDEL', k, 'request_body', 'response_body', 'error_message', 'steps')
    redis.call('HSET', k, 'tombstone', 'EXPIRED')
  end
end
return purged

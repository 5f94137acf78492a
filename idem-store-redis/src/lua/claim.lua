-- KEYS[1] the record. ARGV: 1 the lease's length, 2 the record's length (µs, counted
-- from the server's clock), 3 fingerprint ('' = none), 4 request body ('' = none),
-- 5 claimant, 6 keep, 7 the caller's now ('' = the server's clock judges).
-- Returns {'ACQUIRED', fence, created_at} or {'EXISTING', field, value, ...}.
local k = KEYS[1]
local now = now_from(ARGV[7])
local lease_until, expires_at = fmt(now + tonumber(ARGV[1])), fmt(now + tonumber(ARGV[2]))
local fp = ARGV[3]
local h, flat = load(k)
local fence, created, fingerprint, steps
if h == nil then
  fence, created, fingerprint = fmt(now), fmt(now), fp
elseif h.status == 'PROCESSING' and h.claimant == ARGV[5] then
  -- This very claim, sent twice (a client that resends): it is granted already.
  return {'ACQUIRED', h.fence, h.created_at}
else
  local expired = tonumber(h.expires_at) <= now
  local lapsed = h.status == 'PROCESSING' and h.lease_until ~= nil and tonumber(h.lease_until) <= now
  local agree = fp == '' or h.fingerprint == nil or h.fingerprint == fp
  if not (expired or (lapsed and agree)) then
    table.insert(flat, 1, 'EXISTING')
    return flat
  end
  if expired then
    -- A new life: its first fence, or one above the last life's when that is higher.
    fence = fmt(math.max(tonumber(h.fence) + 1, now))
    created, fingerprint = fmt(now), fp
  else
    fence = fmt(tonumber(h.fence) + 1)
    created, steps = h.created_at, h.steps
    fingerprint = fp
    if fp == '' and h.fingerprint ~= nil then fingerprint = h.fingerprint end
  end
end
redis.call('DEL', k)
local fields = {'status', 'PROCESSING', 'fence', fence, 'created_at', created,
  'lease_until', lease_until, 'expires_at', expires_at, 'claimant', ARGV[5]}
if fingerprint ~= '' then table.insert(fields, 'fingerprint'); table.insert(fields, fingerprint) end
if ARGV[4] ~= '' then table.insert(fields, 'request_body'); table.insert(fields, ARGV[4]) end
if steps ~= nil then table.insert(fields, 'steps'); table.insert(fields, steps) end
redis.call('HSET', k, unpack(fields))
keep_until(k, expires_at, lease_until, ARGV[6])
return {'ACQUIRED', fence, created}

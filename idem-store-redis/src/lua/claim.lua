-- KEYS[1] the record. ARGV: 1 now, 2 lease_until, 3 expires_at, 4 first fence,
-- 5 fingerprint ('' = none), 6 request body ('' = none), 7 claimant, 8 keep.
-- Returns {'ACQUIRED', fence, created_at} or {'EXISTING', field, value, ...}.
local k = KEYS[1]
local now = tonumber(ARGV[1])
local fp = ARGV[5]
local h, flat = load(k)
local fence, created, fingerprint, steps
if h == nil then
  fence, created, fingerprint = ARGV[4], ARGV[1], fp
elseif h.status == 'PROCESSING' and h.claimant == ARGV[7] then
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
  fence = fmt(tonumber(h.fence) + 1)
  if expired then
    created, fingerprint = ARGV[1], fp
  else
    created, steps = h.created_at, h.steps
    fingerprint = fp
    if fp == '' and h.fingerprint ~= nil then fingerprint = h.fingerprint end
  end
end
redis.call('DEL', k)
local fields = {'status', 'PROCESSING', 'fence', fence, 'created_at', created,
  'lease_until', ARGV[2], 'expires_at', ARGV[3], 'claimant', ARGV[7]}
if fingerprint ~= '' then table.insert(fields, 'fingerprint'); table.insert(fields, fingerprint) end
if ARGV[6] ~= '' then table.insert(fields, 'request_body'); table.insert(fields, ARGV[6]) end
if steps ~= nil then table.insert(fields, 'steps'); table.insert(fields, steps) end
redis.call('HSET', k, unpack(fields))
keep_until(k, ARGV[3], ARGV[2], ARGV[8])
return {'ACQUIRED', fence, created}

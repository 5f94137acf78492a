-- Shared by every script: a record is one hash; instants are microseconds since the
-- epoch, kept as decimal strings (exact in Lua's doubles up to 2^53).
local function fmt(n) return string.format('%.0f', n) end
-- The server's clock in microseconds since the epoch: every lease, expiry and grant is
-- judged by it, never by a caller's (hosts' clocks disagree). Scripts are replicated
-- by their effects, so reading the clock is allowed (Redis 5 needs to be told).
if redis.replicate_commands then redis.replicate_commands() end
local function server_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
-- Now: the server's clock, or the caller's instant where the store is set to judge by
-- it (`arg` not empty; tests that move time).
local function now_from(arg)
  if arg == nil or arg == '' then return server_now() end
  return tonumber(arg)
end
local function load(k)
  local flat = redis.call('HGETALL', k)
  if #flat == 0 then return nil, flat end
  local h = {}
  for i = 1, #flat, 2 do h[flat[i]] = flat[i + 1] end
  return h, flat
end
-- Redis deletes the hash `keep` microseconds after the record expires (or its lease
-- ends, whichever is later); until then it is an expired record, as in a SQL table.
local function keep_until(k, expires_us, lease_us, keep_us)
  local last = tonumber(expires_us)
  if lease_us ~= nil and tonumber(lease_us) > last then last = tonumber(lease_us) end
  redis.call('PEXPIREAT', k, math.ceil((last + tonumber(keep_us)) / 1000))
end

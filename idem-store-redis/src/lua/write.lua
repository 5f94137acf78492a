-- A holder's write. KEYS[1] the record. ARGV: 1 what (renew, complete, fail, release,
-- steps), 2 fence, 3 created_at, 4 the value (new lease end, response, message,
-- steps), 5 now, 6 expires_at (complete, fail), 7 keep, 8 the writer (an id of this
-- one write call, the same on each send of it). Returns 1 when the holder's write is
-- in the record (applied now, or already, by this same write sent twice), 0 when the
-- record is another holder's or gone — or another write's, even of the same outcome.
local k = KEYS[1]
local what = ARGV[1]
local h = load(k)
local same_life = h ~= nil and h.fence == ARGV[2] and h.created_at == ARGV[3]
local held = same_life and h.status == 'PROCESSING'
if what == 'complete' or what == 'fail' then
  local status, field = 'SUCCESS', 'response_body'
  if what == 'fail' then status, field = 'FAIL', 'error_message' end
  if same_life and h.status == status and h.written_by == ARGV[8] then return 1 end
  if not held then return 0 end
  redis.call('HSET', k, 'status', status, field, ARGV[4], 'lease_until', ARGV[5],
    'completed_at', ARGV[5], 'expires_at', ARGV[6], 'written_by', ARGV[8])
  keep_until(k, ARGV[6], nil, ARGV[7])
  return 1
end
if not held then return 0 end
if what == 'renew' then
  local expires = h.expires_at
  if tonumber(ARGV[4]) > tonumber(expires) then expires = ARGV[4] end
  redis.call('HSET', k, 'lease_until', ARGV[4], 'expires_at', expires)
  keep_until(k, expires, ARGV[4], ARGV[7])
elseif what == 'steps' then
  redis.call('HSET', k, 'steps', ARGV[4])
elseif what == 'release' then
  if h.steps ~= nil then
    -- Keep the finished steps for the retry: let the lease lapse at once.
    redis.call('HSET', k, 'lease_until', h.created_at)
  else
    redis.call('DEL', k)
  end
else
  return redis.error_reply('idem: unknown write ' .. what)
end
return 1

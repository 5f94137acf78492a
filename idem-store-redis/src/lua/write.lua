-- A holder's write. KEYS[1] the record. ARGV: 1 what (renew, complete, fail, release,
-- steps), 2 fence, 3 created_at, 4 the value (the lease's new length in µs, response,
-- message, steps), 5 the record's length in µs from now (complete, fail), 6 keep, 7 the
-- writer (an id of this one write call, the same on each send of it), 8 the caller's
-- now ('' = the server's clock, which judges by default), 9 the replay's length in µs when
-- the record keeps a tombstone after it ('' = it replays until it expires), 10 the
-- subject's keyed hash ('' = none); 9 and 10 may be left out. Returns 1 when the holder's write is
-- in the record (applied now, or already, by this same write sent twice), 0 when the
-- record is another holder's or gone — or another write's, even of the same outcome.
local k = KEYS[1]
local what = ARGV[1]
local h = load(k)
local same_life = h ~= nil and h.fence == ARGV[2] and h.created_at == ARGV[3]
local held = same_life and h.status == 'PROCESSING'
-- Tell the record's waiters, where one asked, once the write is in.
local function announce()
  local channel = ARGV[11] or ''
  if h.watched == '1' and channel ~= '' then redis.call('PUBLISH', channel, k) end
end
if what == 'complete' or what == 'fail' then
  local status, field = 'SUCCESS', 'response_body'
  if what == 'fail' then status, field = 'FAIL', 'error_message' end
  if same_life and h.status == status and h.written_by == ARGV[7] then return 1 end
  if not held then return 0 end
  local now = now_from(ARGV[8])
  local expires = fmt(now + tonumber(ARGV[5]))
  redis.call('HSET', k, 'status', status, field, ARGV[4], 'lease_until', fmt(now),
    'completed_at', fmt(now), 'expires_at', expires, 'written_by', ARGV[7])
  local replay, subject = ARGV[9] or '', ARGV[10] or ''
  redis.call('HDEL', k, 'tombstone', 'replay_until', 'subject')
  if replay ~= '' then redis.call('HSET', k, 'replay_until', fmt(now + tonumber(replay))) end
  if subject ~= '' then redis.call('HSET', k, 'subject', subject) end
  keep_until(k, expires, nil, ARGV[6])
  announce()
  return 1
end
if not held then return 0 end
if what == 'renew' then
  local lease_end = fmt(now_from(ARGV[8]) + tonumber(ARGV[4]))
  local expires = h.expires_at
  if tonumber(lease_end) > tonumber(expires) then expires = lease_end end
  redis.call('HSET', k, 'lease_until', lease_end, 'expires_at', expires)
  keep_until(k, expires, lease_end, ARGV[6])
elseif what == 'steps' then
  redis.call('HSET', k, 'steps', ARGV[4])
elseif what == 'release' then
  if h.steps ~= nil then
    -- Keep the finished steps for the retry: let the lease lapse at once.
    redis.call('HSET', k, 'lease_until', h.created_at)
  else
    redis.call('DEL', k)
  end
  announce()
else
  return redis.error_reply('idem: unknown write ' .. what)
end
return 1

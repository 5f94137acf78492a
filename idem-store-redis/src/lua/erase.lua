-- KEYS[1] a record found by SCAN. ARGV[1] a data subject's keyed hash. Strips the
-- record to an erased tombstone when it is a finished record of that subject not
-- erased yet (as the SQL stores' erasure); returns 1 then, else 0.
local k = KEYS[1]
local h = load(k)
if h == nil or h.status == 'PROCESSING' or h.subject ~= ARGV[1] or h.tombstone == 'ERASED' then
  return 0
end
redis.call('HDEL', k, 'request_body', 'response_body', 'error_message', 'steps')
redis.call('HSET', k, 'tombstone', 'ERASED')
return 1

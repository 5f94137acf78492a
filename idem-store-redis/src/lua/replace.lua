-- KEYS[1] a record. ARGV: 1 fence, 2 created_at, 3 status, then the request, response,
-- error and steps as they were read (4-7), and as they are to be (8-11); '' = none.
-- Writes the new values only if the record is still as it was read; returns 1 then,
-- else 0.
local k = KEYS[1]
local h = load(k)
if h == nil or h.fence ~= ARGV[1] or h.created_at ~= ARGV[2] or h.status ~= ARGV[3] then return 0 end
local fields = {'request_body', 'response_body', 'error_message', 'steps'}
for i, field in ipairs(fields) do
  if (h[field] or '') ~= ARGV[3 + i] then return 0 end
end
for i, field in ipairs(fields) do
  local value = ARGV[7 + i]
  if value == '' then redis.call('HDEL', k, field) else redis.call('HSET', k, field, value) end
end
return 1

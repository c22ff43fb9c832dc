-- claim.lua - compare-and-set of a request id's index key
-- qg:rid:{<RID>} (store_redis.c): replace ARGV[1] by ARGV[2] with a time
-- to live of ARGV[3] ms, only when the key still holds ARGV[1] (a claim
-- left by a check that was refused, or by a record that is gone).
-- Returns 1 when it replaced the value, 0 when the key held another.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0

-- wrk_check.lua - POST /v1/check, a unique request_id per request, weight 1.
-- Arguments (after --): RUN_ID SUBJECT [SPREAD] (SPREAD > 0: the subjects
-- SUBJECT-0 .. SUBJECT-(SPREAD-1) in turn).  The service key comes from
-- $QUOTAGATE_SERVICE_KEY.  The x-subject header lets an nginx peer key its
-- limit_req zone on the same subject.  With QG_BENCH_IDS=random in the
-- environment the request ids are UUID-like (random hex, what clients
-- that generate UUIDv4s send) instead of growing counters: they land at
-- random places of the ledger's index by request id.
tid = 0                       -- set per thread by setup()
local next_tid = 1
local counter = 0
local run, subject, key = "run", "bench", ""
local spread = 0              -- > 0: subjects SUBJECT-0 .. SUBJECT-(N-1) in turn
local random_ids = os.getenv("QG_BENCH_IDS") == "random"

function setup(thread)
   thread:set("tid", next_tid)
   next_tid = next_tid + 1
end

function init(args)
   run = args[1] or run
   subject = args[2] or subject
   spread = tonumber(args[3] or "0") or 0
   key = os.getenv("QUOTAGATE_SERVICE_KEY") or ""
   math.randomseed(tid * 7919 + os.time())
end

local headers = nil

function request()
   if headers == nil then
      headers = { ["Content-Type"] = "application/json",
                  ["Authorization"] = "Bearer " .. key,
                  ["x-subject"] = subject }
   end
   counter = counter + 1
   local who = subject
   if spread > 0 then who = subject .. "-" .. (counter % spread) end
   headers["x-subject"] = who   -- an nginx peer keys its zone on it too
   local body
   if random_ids then
      -- random bits, then the thread and counter (unique in any case)
      body = string.format(
         '{"subject":"%s","request_id":"%08x-%04x-4%03x-%04x-%06x%06x",' ..
         '"weight":1}', who, math.random(0, 0x7fffffff),
         math.random(0, 0xffff), math.random(0, 0xfff),
         math.random(0, 0xffff), math.random(0, 0xffffff),
         (tid * 4000000 + counter) % 0x1000000)
   else
      body = string.format(
         '{"subject":"%s","request_id":"%s-c-%d-%d","weight":1}',
         who, run, tid, counter)
   end
   return wrk.format("POST", "/v1/check", headers, body)
end

-- wrk_check.lua - POST /v1/check, a unique request_id per request, weight 1.
-- Arguments (after --): RUN_ID SUBJECT [SPREAD] (SPREAD > 0: the subjects
-- SUBJECT-0 .. SUBJECT-(SPREAD-1) in turn).  The service key comes from
-- $QUOTAGATE_SERVICE_KEY.  The x-subject header lets an nginx peer key its
-- limit_req zone on the same subject.
tid = 0                       -- set per thread by setup()
local next_tid = 1
local counter = 0
local run, subject, key = "run", "bench", ""
local spread = 0              -- > 0: subjects SUBJECT-0 .. SUBJECT-(N-1) in turn

function setup(thread)
   thread:set("tid", next_tid)
   next_tid = next_tid + 1
end

function init(args)
   run = args[1] or run
   subject = args[2] or subject
   spread = tonumber(args[3] or "0") or 0
   key = os.getenv("QUOTAGATE_SERVICE_KEY") or ""
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
   local body = string.format(
      '{"subject":"%s","request_id":"%s-c-%d-%d","weight":1}',
      who, run, tid, counter)
   return wrk.format("POST", "/v1/check", headers, body)
end

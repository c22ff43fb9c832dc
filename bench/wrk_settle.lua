-- wrk_settle.lua - check then settle: every wrk request is a pipelined
-- pair on one connection, POST /v1/check (a fresh request_id, weight 2)
-- followed by POST /v1/settle of that id (weight 1, completed).  A
-- connection's requests are handled in order, so the settle always finds
-- its reservation; each settle is answered only once durable, so the
-- settle rate is half the response rate.  Arguments (after --): RUN_ID
-- SUBJECT [SPREAD] (SPREAD > 0: the subjects SUBJECT-0 .. SUBJECT-(SPREAD-1)
-- in turn); the service key comes from $QUOTAGATE_SERVICE_KEY.
tid = 0
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
   local id = string.format("%s-s-%d-%d", run, tid, counter)
   local who = subject
   if spread > 0 then who = subject .. "-" .. (counter % spread) end
   headers["x-subject"] = who   -- an nginx peer keys its zone on it too
   local check = wrk.format("POST", "/v1/check", headers, string.format(
      '{"subject":"%s","request_id":"%s","weight":2}', who, id))
   local settle = wrk.format("POST", "/v1/settle", headers, string.format(
      '{"request_id":"%s","weight":1,"status":"completed"}', id))
   return check .. settle
end

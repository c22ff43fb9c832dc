-- wrk_soak.lua - the soak test's steady traffic (tests/soak/soak.sh): each
-- wrk request is, in turn, a pipelined pair of a check and its settle, a
-- check and a plain proxied chat completion, or a plain and a streamed
-- one, with a pause of DELAY_MS
-- before each (wrk's delay()), so that a 30-minute run writes a ledger of
-- a few million rows, not hundreds of millions.  Answers other than 200
-- are counted per thread and printed by done(): in a soak nothing is
-- refused (the plan's limits are huge), so any is a finding.
-- Arguments (after --): RUN_ID DELAY_MS.  Keys from $QUOTAGATE_SERVICE_KEY
-- (check, settle) and $QG_SUBJECT_KEY (proxy).
tid = 0
bad = 0
count = 0
local next_tid = 1
local threads = {}
local run, delay_ms = "run", 2
local hs, hp, hps

function setup(thread)
   thread:set("tid", next_tid)
   next_tid = next_tid + 1
   table.insert(threads, thread)
end

function init(args)
   run = args[1] or run
   delay_ms = tonumber(args[2] or delay_ms) or 2
   local skey = os.getenv("QUOTAGATE_SERVICE_KEY") or ""
   local pkey = os.getenv("QG_SUBJECT_KEY") or ""
   hs = { ["Content-Type"] = "application/json",
          ["Authorization"] = "Bearer " .. skey }
   hp = { ["Content-Type"] = "application/json",
          ["Authorization"] = "Bearer " .. pkey,
          ["X-Double-Mode"] = "slow=0" }
   hps = { ["Content-Type"] = "application/json",
           ["Authorization"] = "Bearer " .. pkey,
           ["Accept"] = "text/event-stream",
           ["X-Double-Mode"] = "slow=1" }
end

function delay()
   return delay_ms
end

-- wrk pipelines as many requests as the first request() returned (it
-- counts them once, at start), so every call returns exactly two.
local function check(id, w)
   return wrk.format("POST", "/v1/check", hs, string.format(
      '{"subject":"soak","request_id":"%s","weight":%d}', id, w))
end

local function chat(stream)
   if stream then
      return wrk.format("POST", "/v1/chat/completions", hps,
         '{"model":"light","stream":true,"messages":[{"role":"user",' ..
         '"content":"soak test"}],"max_tokens":8}')
   end
   return wrk.format("POST", "/v1/chat/completions", hp,
      '{"model":"light","messages":[{"role":"user","content":' ..
      '"soak test"}],"max_tokens":8}')
end

function request()
   count = count + 1
   local k = count % 3
   local id = string.format("%s-%d-%d", run, tid, count)
   if k == 0 then
      return check(id, 2) .. wrk.format("POST", "/v1/settle", hs,
         string.format('{"request_id":"%s","weight":1,"status":"completed"}',
                       id))
   elseif k == 1 then
      return check(id, 1) .. chat(false)
   else
      return chat(false) .. chat(true)
   end
end

function response(status, headers, body)
   if status ~= 200 then
      bad = bad + 1
   end
end

function done(summary, latency, requests)
   local total = 0
   for _, t in ipairs(threads) do
      total = total + (t:get("bad") or 0)
   end
   io.write(string.format("wrk_soak: %d requests, %d answered other than 200\n",
                          summary.requests, total))
end

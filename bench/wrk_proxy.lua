-- wrk_proxy.lua - POST /v1/chat/completions, OpenAI shape, small max_tokens.
-- Arguments (after --): MODE MAX_TOKENS, MODE "plain" or "stream".
-- The subject key comes from $QG_SUBJECT_KEY (sent as Authorization: Bearer;
-- the upstream double and nginx ignore it, quotagate requires it and never
-- forwards it).  X-Double-Mode: slow=0 makes the double send its stream
-- chunks without the default 5 ms pause between them.  No X-Request-Id:
-- quotagate generates a unique one per request.
local mode, max_tokens = "plain", 16
local req = nil

function init(args)
   mode = args[1] or mode
   max_tokens = tonumber(args[2] or max_tokens) or 16
end

function request()
   if req == nil then
      local key = os.getenv("QG_SUBJECT_KEY") or "none"
      local headers = { ["Content-Type"] = "application/json",
                        ["Authorization"] = "Bearer " .. key,
                        ["X-Double-Mode"] = "slow=0" }
      local stream = ""
      if mode == "stream" then
         stream = '"stream":true,'
         headers["Accept"] = "text/event-stream"
      end
      local body = string.format(
         '{"model":"light",%s"messages":[{"role":"user","content":' ..
         '"hello there friend, how are you today?"}],"max_tokens":%d}',
         stream, max_tokens)
      req = wrk.format("POST", "/v1/chat/completions", headers, body)
   end
   return req
end

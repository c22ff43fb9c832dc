-- win_session.lua - session windows: a fixed window of length L that opens
-- at the first charge after the previous session closed.
--
-- The script twin of src/core/win_session.c: state (S[o + ...],
-- common.lua) start, used, seen; start 0 = no open session; a refused
-- amount fits again at start + L.  Built on first use (W in decide.lua).
BUILD[3] = function()
local SES = {}
local START, USED, SEEN = 1, 2, 3

local function advance(w, e, S, o)
  local now = e.now > S[o + SEEN] and e.now or S[o + SEEN]
  S[o + SEEN] = now
  if S[o + START] ~= 0 and now >= S[o + START] + w.length then
    S[o + START] = 0
    S[o + USED] = 0
  end
  return now
end

function SES.admit_at(w, e, a)
  local S, o = e.S, w.o
  local now = advance(w, e, S, o)
  if a <= 0 then return now end
  if a > w.limit then return NEVER end
  if S[o + START] == 0 or a <= w.limit - S[o + USED] then return now end
  return S[o + START] + w.length
end

function SES.charge(w, e, a)
  local S, o = e.S, w.o
  local now = advance(w, e, S, o)
  if a < 0 then return RC_OK end
  if S[o + START] == 0 then S[o + START] = now end
  S[o + USED] = U.amount_add(S[o + USED], a)
  return RC_OK
end

function SES.adjust(w, e, t0, delta)
  local S, o = e.S, w.o
  advance(w, e, S, o)
  local start = S[o + START]
  if start == 0 or t0 < start or t0 >= start + w.length then return end
  if delta > 0 then
    S[o + USED] = U.amount_add(S[o + USED], delta)
  elseif S[o + USED] < AMAX then
    local v = S[o + USED] + delta
    S[o + USED] = v < 0 and 0 or v
  end
end

-- limit, used, remaining, reset.
function SES.view(w, e)
  local S, o = e.S, w.o
  advance(w, e, S, o)
  local used, start = S[o + USED], S[o + START]
  return w.limit, used, w.limit > used and w.limit - used or 0,
         start ~= 0 and start + w.length or 0
end

function SES.recovery(w, e, max, r)
  local S, o = e.S, w.o
  advance(w, e, S, o)
  local n = #r
  if max <= 0 or S[o + START] == 0 or S[o + USED] <= 0 then
    r[n + 1] = 0
    return
  end
  r[n + 1], r[n + 2], r[n + 3] = 1, S[o + START] + w.length, w.limit
end

function SES.until_(w, S)
  local o = w.o
  return S[o + START] ~= 0 and S[o + START] + w.length or 0
end

return SES
end

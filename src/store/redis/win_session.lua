-- win_session.lua - session windows: a fixed window of length L that opens
-- at the first charge after the previous session closed.
--
-- The script twin of src/core/win_session.c: state (start, used, seen),
-- start 0 = no open session; a refused amount fits again at start + L.
local SES = {}

local function advance(w, st, ctx)
  local now = ctx.now > st.seen and ctx.now or st.seen
  st.seen = now
  if st.start ~= 0 and now >= st.start + w.length then
    st.start = 0
    st.used = 0
  end
  return now
end

function SES.admit_at(w, st, ctx, a)
  local now = advance(w, st, ctx)
  if a <= 0 then return now end
  if a > w.limit then return NEVER end
  if st.start == 0 or a <= w.limit - st.used then return now end
  return st.start + w.length
end

function SES.charge(w, st, ctx, a)
  local now = advance(w, st, ctx)
  if a < 0 then return RC_OK end
  if st.start == 0 then st.start = now end
  st.used = U.amount_add(st.used, a)
  return RC_OK
end

function SES.adjust(w, st, ctx, t0, delta)
  advance(w, st, ctx)
  if st.start == 0 or t0 < st.start or t0 >= st.start + w.length then return end
  if delta > 0 then
    st.used = U.amount_add(st.used, delta)
  elseif st.used < AMAX then
    local v = st.used + delta
    st.used = v < 0 and 0 or v
  end
end

function SES.view(w, st, ctx, out)
  advance(w, st, ctx)
  out.limit = w.limit
  out.used = st.used
  out.remaining = w.limit > st.used and w.limit - st.used or 0
  out.reset = st.start ~= 0 and st.start + w.length or 0
end

function SES.recovery(w, st, ctx, max)
  advance(w, st, ctx)
  if max <= 0 or st.start == 0 or st.used <= 0 then return {} end
  return {{st.start + w.length, w.limit}}
end

function SES.until_(w, st)
  return st.start ~= 0 and st.start + w.length or 0
end

-- win_calendar.lua - calendar windows: usage resets at fixed local instants.
--
-- The script twin of src/core/win_calendar.c.  Lua cannot compute time
-- zones, so the period is C's job (qg__calendar_period): every call that
-- may need a new period carries, for each calendar window, the period
-- [s, e) containing the instant C expects the script to use (st.pp, set
-- by ops.lua; pp.bad when C found no period there).  Before anything is
-- written, ops.lua checks that every window that must leave its cached
-- period has a passed one containing the script's own (clamped) now;
-- when one has not, the script answers "period" with that now and C
-- retries with periods for it (docs/redis-store.md, "Time").
--
-- Calls without periods (settle, void, lookup: their instance does not
-- know the entity's windows beforehand) leave a window whose period has
-- ended untouched (st.pp == nil): a settle's adjustment of a charge from
-- an ended period is a no-op anyway, and the next call with periods
-- resets the window exactly as the memory store would have.
local CAL = {}

-- Clamp now and roll the cached period forward.  Returns the instant,
-- nil when the period cannot be computed, false when no period was given.
local function advance(w, st, ctx)
  local now = ctx.now
  local have = st.e ~= 0
  if have and now < st.s then now = st.s end
  if have and now < st.e then return now end
  local pp = st.pp
  if pp == nil then return false end
  if pp.bad or not (pp.s <= now and now < pp.e) then return nil end
  st.s = pp.s
  st.e = pp.e
  st.used = 0
  return now
end

-- Would this window need a period it was not given, at entity instant now?
function CAL.needs_period(st, now)
  local n = now
  local have = st.e ~= 0
  if have and n < st.s then n = st.s end
  if have and n < st.e then return false end
  local pp = st.pp
  if pp == nil then return false end
  if pp.bad then return pp.now ~= n end
  return not (pp.s <= n and n < pp.e)
end

function CAL.admit_at(w, st, ctx, a)
  local now = advance(w, st, ctx)
  if not now then return NEVER end
  if a <= 0 or a <= w.limit - st.used then return now end
  if a > w.limit then return NEVER end
  return st.e
end

function CAL.charge(w, st, ctx, a)
  local now = advance(w, st, ctx)
  if not now then return RC_EINVAL end
  if a > 0 then st.used = U.amount_add(st.used, a) end
  return RC_OK
end

function CAL.adjust(w, st, ctx, t0, delta)
  if not advance(w, st, ctx) then return end
  if t0 < st.s or t0 >= st.e then return end
  if delta > 0 then
    st.used = U.amount_add(st.used, delta)
  elseif st.used < AMAX then
    local v = st.used + delta
    st.used = v < 0 and 0 or v
  end
end

function CAL.view(w, st, ctx, out)
  local ok = advance(w, st, ctx)
  out.limit = w.limit
  out.used = ok and st.used or 0
  out.remaining = w.limit > out.used and w.limit - out.used or 0
  out.reset = ok and st.e or 0
end

function CAL.recovery(w, st, ctx, max)
  if max <= 0 or not advance(w, st, ctx) or st.used <= 0 then return {} end
  return {{st.e, w.limit}}
end

function CAL.until_(w, st)
  return st.used > 0 and st.e or 0
end

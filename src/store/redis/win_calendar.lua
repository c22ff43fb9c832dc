-- win_calendar.lua - calendar windows: usage resets at fixed local instants.
--
-- The script twin of src/core/win_calendar.c.  Lua cannot compute time
-- zones, so the period is C's job (qg__calendar_period): every call that
-- may need a new period carries, for each calendar window, the period
-- [s, e) containing the instant C expects the script to use (e.pp[o], set
-- by ops.lua: the index of its pair in CALL.per; a start below 0 when C
-- found no period there).  Before anything is written, ops.lua checks
-- that every window that must leave its cached period has a passed one
-- containing the script's own (clamped) now; when one has not, the
-- script answers "period" with that now and C retries with periods for
-- it (docs/redis-store.md, "Time").
--
-- Calls without periods (settle, void, lookup: their instance does not
-- know the entity's windows beforehand) leave a window whose period has
-- ended untouched (no e.pp): a settle's adjustment of a charge from an
-- ended period is a no-op anyway, and the next call with periods resets
-- the window exactly as the memory store would have.
--
-- State (S[o + ...], common.lua): period start, end, used.  Built on
-- first use (W in decide.lua).
BUILD[2] = function()
local CAL = {}
local PS, PE, USED = 1, 2, 3

-- The period passed for the window at o: start, end (nil when none).
local function passed(e, o)
  local k = e.pp and e.pp[o]
  if not k then return nil end
  return CALL.per[2 * k - 1], CALL.per[2 * k]
end

-- Clamp now and roll the cached period forward.  Returns the instant,
-- nil when the period cannot be computed, false when no period was given.
local function advance(w, e, S, o)
  local now = e.now
  local have = S[o + PE] ~= 0
  if have and now < S[o + PS] then now = S[o + PS] end
  if have and now < S[o + PE] then return now end
  local ps, pe = passed(e, o)
  if ps == nil then return false end
  if ps < 0 or not (ps <= now and now < pe) then return nil end
  S[o + PS], S[o + PE], S[o + USED] = ps, pe, 0
  return now
end

-- Would this window need a period it was not given, at entity instant now?
function CAL.needs_period(w, e, now)
  local S, o = e.S, w.o
  local have = S[o + PE] ~= 0
  if have and now < S[o + PS] then now = S[o + PS] end
  if have and now < S[o + PE] then return false end
  local ps, pe = passed(e, o)
  if ps == nil then return false end
  if ps < 0 then return CALL.per.now ~= now end
  return not (ps <= now and now < pe)
end

function CAL.admit_at(w, e, a)
  local S, o = e.S, w.o
  local now = advance(w, e, S, o)
  if not now then return NEVER end
  if a <= 0 or a <= w.limit - S[o + USED] then return now end
  if a > w.limit then return NEVER end
  return S[o + PE]
end

function CAL.charge(w, e, a)
  local S, o = e.S, w.o
  local now = advance(w, e, S, o)
  if not now then return RC_EINVAL end
  if a > 0 then S[o + USED] = U.amount_add(S[o + USED], a) end
  return RC_OK
end

function CAL.adjust(w, e, t0, delta)
  local S, o = e.S, w.o
  if not advance(w, e, S, o) then return end
  if t0 < S[o + PS] or t0 >= S[o + PE] then return end
  if delta > 0 then
    S[o + USED] = U.amount_add(S[o + USED], delta)
  elseif S[o + USED] < AMAX then
    local v = S[o + USED] + delta
    S[o + USED] = v < 0 and 0 or v
  end
end

-- limit, used, remaining, reset.
function CAL.view(w, e)
  local S, o = e.S, w.o
  local ok = advance(w, e, S, o)
  local used = ok and S[o + USED] or 0
  return w.limit, used, w.limit > used and w.limit - used or 0,
         ok and S[o + PE] or 0
end

function CAL.recovery(w, e, max, r)
  local S, o = e.S, w.o
  local n = #r
  if max <= 0 or not advance(w, e, S, o) or S[o + USED] <= 0 then
    r[n + 1] = 0
    return
  end
  r[n + 1], r[n + 2], r[n + 3] = 1, S[o + PE], w.limit
end

function CAL.until_(w, S)
  local o = w.o
  return S[o + USED] > 0 and S[o + PE] or 0
end

return CAL
end

-- win_rate.lua - rate windows: a smooth rate by GCRA (a token bucket).
--
-- The script twin of src/core/win_rate.c, with the same exact integer
-- arithmetic in "scaled time" S(t) = t * L (L = limit_milli, P =
-- length_ms): an amount a costs a * P scaled units, the tolerance is
-- tau = burst * P, and the state is the theoretical arrival time tat.
-- Scaled values pass 2^53 (an instant times a limit), so a scaled value
-- X is kept as the pair (q, r) with X = q * L + r and 0 <= r < L: q is an
-- instant in ms and r the remainder, both exact doubles.  Then
--   S(now)              = (now, 0)
--   ceil(X / L)         = q + (r > 0 and 1 or 0)
--   a * P               = (floor(a*P / L), a*P mod L), in doubles when
--                         a * P < 2^52, else in bignums (bignum.lua)
-- and every formula, rounding and bound is win_rate.c's:
--   fits now        max(tat, S(now)) + a*P - S(now) <= tau
--   else at         ceil((tat + a*P - tau) / L)
--   fill cap        tat <= S(now) + tau + L * QG_TIME_MAX_MS
--   used (view)     ceil((tat - S(now)) / P), at most the amount bound
--   reset (view)    ceil(tat / L), at most QG_TIME_MAX_MS
-- The store refuses rules whose full bucket would take longer than
-- QG_TIME_MAX_MS to drain (redis_script.c), so q stays below 2^52.
-- State (S[o + ...], common.lua): q, r, seen, capped, L; L is the limit
-- tat was scaled by, and a rules change of the limit rescales nothing
-- (win_rate.c keeps the raw scaled number too): the pair is converted to
-- the new L exactly.  Built on first use (W in decide.lua); adjust and
-- recovery (RT) on first use of them.
BUILD[4] = function()
local RATE = {}
local Q, RR, SEEN, CAPPED, SL = 1, 2, 3, 4, 5

-- The pair of tat in units of the window's current limit.
local function tat_of(w, S, o)
  if S[o + SL] ~= w.limit and w.limit > 0 and w.length > 0 then
    if S[o + Q] ~= 0 or S[o + RR] ~= 0 then
      local raw = BN.add(BN.mul(BN.new(S[o + Q]), BN.new(S[o + SL])),
                         BN.new(S[o + RR]))
      S[o + Q], S[o + RR] = BN.divmod(raw, w.limit)
    end
    S[o + SL] = w.limit
  end
  return S[o + Q], S[o + RR]
end

-- a * P as a pair; math.huge, 0 when its ms part passes 2^53.
local function times_p(w, a)
  local x = a * w.length
  if x < TWO52 then return U.idiv(x, w.limit) end
  return BN.divmod(BN.mul(BN.new(a), BN.new(w.length)), w.limit)
end

-- (q1, r1) + (q2, r2) and (q1, r1) - (q2, r2), 0 <= r < L; a pair is
-- after another when q1 > q2 or (q1 == q2 and r1 > r2); ceil(X / L) is
-- q + (r > 0 and 1 or 0).
local function add(w, q1, r1, q2, r2)
  local r = r1 + r2
  if r >= w.limit then return q1 + q2 + 1, r - w.limit end
  return q1 + q2, r
end

local function sub(w, q1, r1, q2, r2)
  local r = r1 - r2
  if r < 0 then return q1 - q2 - 1, r + w.limit end
  return q1 - q2, r
end

-- Clamp now and record it.
local function clamp_now(e, S, o)
  local now = e.now > S[o + SEEN] and e.now or S[o + SEEN]
  S[o + SEEN] = now
  return now
end

function RATE.admit_at(w, e, a)
  local S, o = e.S, w.o
  local now = clamp_now(e, S, o)
  if a <= 0 then return now end
  local burst = w.burst > 0 and w.burst or w.limit
  if not (w.limit > 0 and w.length > 0) or a > burst or a > AMAX then return NEVER end
  local q, r = tat_of(w, S, o)
  local tq, tr = times_p(w, burst)
  local aq, ar = times_p(w, a)
  local mq, mr = q, r
  if not (q > now or (q == now and r > 0)) then mq, mr = now, 0 end
  local lq, lr = add(w, mq, mr, aq, ar)
  if not (lq > tq + now or (lq == tq + now and lr > tr)) then return now end
  local xq, xr = add(w, q, r, aq, ar)
  local cq, cr = sub(w, xq, xr, tq, tr)
  return cr > 0 and cq + 1 or cq
end

function RATE.charge(w, e, a)
  local S, o = e.S, w.o
  local now = clamp_now(e, S, o)
  if a <= 0 or not (w.limit > 0 and w.length > 0) then return RC_OK end
  if a > AMAX then a = AMAX end
  local q, r = tat_of(w, S, o)
  if not (q > now or (q == now and r > 0)) then
    q, r = now, 0
    S[o + CAPPED] = 0       -- drained: nothing cut is left
  end
  local tq, tr = times_p(w, w.burst > 0 and w.burst or w.limit)
  local aq, ar = times_p(w, a)
  local cq, cr = tq + now + TMAX, tr   -- S(now) + tau + L * TMAX
  if aq == math.huge then
    q, r = cq, cr
    S[o + CAPPED] = 1
  else
    q, r = add(w, q, r, aq, ar)
    if q > cq or (q == cq and r > cr) then
      q, r = cq, cr
      S[o + CAPPED] = 1
    end
  end
  S[o + Q], S[o + RR] = q, r
  return RC_OK
end

-- limit, used, remaining, reset.  used = ceil((tat - S(now)) / P) for
-- tat > S(now), reset = ceil(tat / L).
function RATE.view(w, e)
  local S, o = e.S, w.o
  local now = clamp_now(e, S, o)
  local burst = w.burst > 0 and w.burst or w.limit
  local used, reset = 0, 0
  if w.limit > 0 and w.length > 0 then
    local q, r = tat_of(w, S, o)
    if q > now or (q == now and r > 0) then
      local x = (q - now) * w.limit
      if x < TWO52 then
        used = U.ceil_div(x + r, w.length)
      else
        local n = BN.add(BN.mul(BN.new(q - now), BN.new(w.limit)), BN.new(r))
        local uq, ur = BN.divmod(n, w.length)
        used = (uq ~= math.huge and ur > 0) and uq + 1 or uq
      end
      if used > AMAX then used = AMAX end
      reset = r > 0 and q + 1 or q
      if reset > TMAX then reset = TMAX end
    end
  end
  return burst, used, burst > used and burst - used or 0, reset
end

function RATE.until_(w, S)
  local o = w.o
  if not (w.limit > 0 and w.length > 0) or (S[o + Q] == 0 and S[o + RR] == 0) then return 0 end
  local q, r = tat_of(w, S, o)
  local t = r > 0 and q + 1 or q
  return t > TMAX and TMAX or t
end

local RT = lazy(function()
local RT = {}

function RT.adjust(w, e, t0, delta)
  local S, o = e.S, w.o
  local now = clamp_now(e, S, o)
  if not (w.limit > 0 and w.length > 0) then return end
  if delta > 0 then
    RATE.charge(w, e, delta)
    return
  end
  -- giving back: floored at S(now); a bucket that was cut keeps its fill
  local q, r = tat_of(w, S, o)
  if S[o + CAPPED] ~= 0 and (q > now or (q == now and r > 0)) then return end
  S[o + CAPPED] = 0
  local d = -delta
  if d > AMAX then d = AMAX end
  local dq, dr = times_p(w, d)
  if dq == math.huge then
    S[o + Q], S[o + RR] = now, 0
    return
  end
  local fq, fr = add(w, now, 0, dq, dr)
  if q > fq or (q == fq and r > fr) then S[o + Q], S[o + RR] = sub(w, q, r, dq, dr)
  else S[o + Q], S[o + RR] = now, 0 end
end

function RT.recovery(w, e, max, r)
  local burst, _, cur, reset = RATE.view(w, e)
  local n = #r
  r[n + 1] = 0
  if max <= 0 or reset == 0 then return end
  local S, o = e.S, w.o
  local q, rr = tat_of(w, S, o)
  local k, last = 0, nil
  -- levels evenly spaced from the current remaining up to the burst;
  -- level x is reached at ceil((tat - (burst - x) * P) / L)
  for i = 1, max do
    local x = cur + U.idiv((burst - cur) * i + max - 1, max)
    if not (k > 0 and x <= last) then
      local xq, xr = times_p(w, burst - x)
      local aq, ar = sub(w, q, rr, xq, xr)
      local at = ar > 0 and aq + 1 or aq
      k = k + 1
      if at > TMAX then
        r[n + 2 * k], r[n + 2 * k + 1] = TMAX, burst
        break
      end
      r[n + 2 * k], r[n + 2 * k + 1] = at, x
      last = x
    end
  end
  r[n + 1] = k
end

return RT
end)

return setmetatable(RATE, {__index = RT})
end

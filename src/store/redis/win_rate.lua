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
-- State: "q r seen capped L"; L is the limit tat was scaled by, and a
-- rules change of the limit rescales nothing (win_rate.c keeps the raw
-- scaled number too): the pair is converted to the new L exactly.
local RATE = {}
local TWO52 = 4503599627370496

local function clamp_now(st, ctx)
  local now = ctx.now > st.seen and ctx.now or st.seen
  st.seen = now
  return now
end

local function burst_of(w) return w.burst > 0 and w.burst or w.limit end

local function valid(w) return w.limit > 0 and w.length > 0 end

-- The pair of tat in units of the window's current limit.
local function tat_of(w, st)
  if st.L ~= w.limit and valid(w) then
    if st.q ~= 0 or st.r ~= 0 then
      local raw = BN.add(BN.mul(BN.new(st.q), BN.new(st.L)), BN.new(st.r))
      st.q, st.r = BN.divmod(raw, w.limit)
    end
    st.L = w.limit
  end
  return st.q, st.r
end

-- a * P as a pair; math.huge, 0 when its ms part passes 2^53.
local function times_p(w, a)
  local x = a * w.length
  if x < TWO52 then return U.idiv(x, w.limit) end
  return BN.divmod(BN.mul(BN.new(a), BN.new(w.length)), w.limit)
end

-- (q1, r1) + (q2, r2) and (q1, r1) - (q2, r2), 0 <= r < L.
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

local function gt(q1, r1, q2, r2) return q1 > q2 or (q1 == q2 and r1 > r2) end

local function ceil_of(q, r) return r > 0 and q + 1 or q end

function RATE.admit_at(w, st, ctx, a)
  local now = clamp_now(st, ctx)
  if a <= 0 then return now end
  local burst = burst_of(w)
  if not valid(w) or a > burst or a > AMAX then return NEVER end
  local q, r = tat_of(w, st)
  local tq, tr = times_p(w, burst)
  local aq, ar = times_p(w, a)
  local mq, mr = q, r
  if not gt(q, r, now, 0) then mq, mr = now, 0 end
  local lq, lr = add(w, mq, mr, aq, ar)
  if not gt(lq, lr, tq + now, tr) then return now end
  local xq, xr = add(w, q, r, aq, ar)
  return ceil_of(sub(w, xq, xr, tq, tr))
end

function RATE.charge(w, st, ctx, a)
  local now = clamp_now(st, ctx)
  if a <= 0 or not valid(w) then return RC_OK end
  if a > AMAX then a = AMAX end
  local q, r = tat_of(w, st)
  if not gt(q, r, now, 0) then
    q, r = now, 0
    st.capped = 0       -- drained: nothing cut is left
  end
  local tq, tr = times_p(w, burst_of(w))
  local aq, ar = times_p(w, a)
  local cq, cr = tq + now + TMAX, tr   -- S(now) + tau + L * TMAX
  if aq == math.huge then
    q, r = cq, cr
    st.capped = 1
  else
    q, r = add(w, q, r, aq, ar)
    if gt(q, r, cq, cr) then
      q, r = cq, cr
      st.capped = 1
    end
  end
  st.q, st.r = q, r
  return RC_OK
end

function RATE.adjust(w, st, ctx, t0, delta)
  local now = clamp_now(st, ctx)
  if not valid(w) then return end
  if delta > 0 then
    RATE.charge(w, st, ctx, delta)
    return
  end
  -- giving back: floored at S(now); a bucket that was cut keeps its fill
  local q, r = tat_of(w, st)
  if st.capped ~= 0 and gt(q, r, now, 0) then return end
  st.capped = 0
  local d = -delta
  if d > AMAX then d = AMAX end
  local dq, dr = times_p(w, d)
  if dq == math.huge then
    st.q, st.r = now, 0
    return
  end
  local fq, fr = add(w, now, 0, dq, dr)
  if gt(q, r, fq, fr) then st.q, st.r = sub(w, q, r, dq, dr)
  else st.q, st.r = now, 0 end
end

-- ceil((tat - S(now)) / P) for tat > S(now).
local function used_of(w, q, r, now)
  local x = (q - now) * w.limit
  if x < TWO52 then return U.ceil_div(x + r, w.length) end
  local n = BN.add(BN.mul(BN.new(q - now), BN.new(w.limit)), BN.new(r))
  local uq, ur = BN.divmod(n, w.length)
  if uq == math.huge then return uq end
  return ur > 0 and uq + 1 or uq
end

function RATE.view(w, st, ctx, out)
  local now = clamp_now(st, ctx)
  local burst = burst_of(w)
  out.limit = burst
  out.used = 0
  out.reset = 0
  if valid(w) then
    local q, r = tat_of(w, st)
    if gt(q, r, now, 0) then
      local used = used_of(w, q, r, now)
      out.used = used > AMAX and AMAX or used
      local reset = ceil_of(q, r)
      out.reset = reset > TMAX and TMAX or reset
    end
  end
  out.remaining = burst > out.used and burst - out.used or 0
end

function RATE.recovery(w, st, ctx, max)
  local v = {}
  RATE.view(w, st, ctx, v)
  if max <= 0 or v.reset == 0 then return {} end
  local burst, cur = v.limit, v.remaining
  local q, r = tat_of(w, st)
  local pts = {}
  -- levels evenly spaced from the current remaining up to the burst;
  -- level x is reached at ceil((tat - (burst - x) * P) / L)
  for i = 1, max do
    local x = cur + U.idiv((burst - cur) * i + max - 1, max)
    if not (#pts > 0 and x <= pts[#pts][2]) then
      local xq, xr = times_p(w, burst - x)
      local at = ceil_of(sub(w, q, r, xq, xr))
      if at > TMAX then
        pts[#pts + 1] = {TMAX, burst}
        break
      end
      pts[#pts + 1] = {at, x}
    end
  end
  return pts
end

function RATE.until_(w, st)
  if not valid(w) or (st.q == 0 and st.r == 0) then return 0 end
  local t = ceil_of(tat_of(w, st))
  return t > TMAX and TMAX or t
end

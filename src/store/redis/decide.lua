-- decide.lua - one decision over all windows of a member and its org.
--
-- The script twin of src/core/decide.c: every applicable window reports
-- the earliest instant the request fits; the request is admitted (and
-- every applicable window charged, all or nothing) when all of them say
-- now; else the binding window is the one whose instant is latest and
-- retry_after = that instant - now.  Pay as you go: lifted (soft) windows
-- never refuse, the overage is what the request takes beyond the least
-- room they have left, priced and added to the spent amount unless that
-- passes the cap.  Window types dispatch through W (by type number, as
-- window.c's table does); a type's functions are built the first time a
-- call needs them (BUILD, one per win_*.lua), since Redis runs the whole
-- script body at every call.
local W = setmetatable({}, {__index = function(t, ty)
  local m = BUILD[ty]()
  rawset(t, ty, m)
  return m
end})

local D = (function()
local D = {}
local OUT_ALLOW, OUT_REJECT, OUT_NEVER = 1, 2, 3

-- din: n, w[i] (its window), e[i] (its entity: state S, instant now,
-- request id rid), model, weight, now (every entity's), soft (bit
-- mask), price, cap, cap_end, spent ({v = amount} or false).

local function soft_bit(mask, i)
  return math.floor(mask / 2 ^ (i - 1)) % 2 == 1
end

function D.overage_cost(over, price)
  if over <= 0 or price <= 0 then return 0 end
  local c = U.mul_ceil_div(over, price, 1000)
  return c > MMAX and MMAX or c
end

function D.overage_of(charged, headroom)
  if headroom < 0 or charged <= headroom then return 0 end
  return charged - headroom
end

-- Append the views to reply r: per window limit, used, remaining,
-- reset, then its recovery schedule when with_recovery and it holds
-- usage (qg__decide_views), else no points.
function D.views(din, r, with_recovery)
  local n = #r
  for i = 1, din.n do
    local w, e = din.w[i], din.e[i]
    local wt = W[w.type]
    local limit, used, rem, reset = wt.view(w, e)
    r[n + 1], r[n + 2], r[n + 3], r[n + 4] = limit, used, rem, reset
    if with_recovery and used > 0 then
      wt.recovery(w, e, QG_MAX_RECOVERY, r)
    else
      r[n + 5] = 0
    end
    n = #r
  end
end

-- Undo the charges of windows [1, upto) after a later one failed.
local function rollback(din, upto)
  for i = 1, upto - 1 do
    local w = din.w[i]
    if U.applies(w, din.model) then
      local e = din.e[i]
      if w.type == 5 then W[5].release(w, e)
      else
        local d = -U.amount(w, din.weight)
        if d ~= 0 then W[w.type].adjust(w, e, e.now, d) end
      end
    end
  end
end

local function charge_all(din)
  local model, weight = din.model, din.weight
  for i = 1, din.n do
    local w = din.w[i]
    local mask = w.mask
    if not mask or (model >= 0 and mask[model] == true) then
      local a = (w.unit == 1 or w.type == 5) and 1000 or weight
      local rc = W[w.type].charge(w, din.e[i], a)
      if rc ~= RC_OK then
        rollback(din, i)
        return rc
      end
    end
  end
  return RC_OK
end

-- Decide; when every window admits, charge them all.  Returns RC_OK or a
-- window's error (nothing charged then), out filled; the views follow
-- with D.views (recovery schedules for a refusal only).
function D.decide(din, out)
  local now = din.now
  local latest, soft_latest = now, now
  local binding, never, soft_bind, soft_never = -1, -1, -1, -1
  local room, over, cost, spent_after = math.huge, 0, 0, 0
  local cap_ok = true
  local model, weight, soft = din.model, din.weight, din.soft
  out.weight = weight
  out.retry_after = 0
  out.overage, out.cost, out.price, out.headroom, out.cap_reached = 0, 0, 0, -1, 0
  for i = 1, din.n do
    local w = din.w[i]
    local mask = w.mask
    if not mask or (model >= 0 and mask[model] == true) then
      local wt = W[w.type]
      local a = (w.unit == 1 or w.type == 5) and 1000 or weight
      local at = wt.admit_at(w, din.e[i], a)
      if soft == 0 or not soft_bit(soft, i) then
        if at == NEVER then
          if never < 0 then never = i end
        elseif at > latest then
          latest = at
          binding = i
        end
      else
        local _, _, remaining = wt.view(w, din.e[i])
        if remaining < room then room = remaining end
        if at == NEVER then
          if soft_never < 0 then soft_never = i end
        elseif at > soft_latest then
          soft_latest = at
          soft_bind = i
        end
      end
    end
  end
  if soft ~= 0 then
    out.headroom = room == math.huge and -1 or room
    out.price = din.price
    over = D.overage_of(weight, out.headroom)
    cost = D.overage_cost(over, din.price)
    -- both within the money bound: the sum is exact
    cap_ok = din.cap <= 0 or din.spent.v + cost <= din.cap
    spent_after = U.money_add(din.spent.v, cost)
  end
  if never >= 0 then
    out.outcome = OUT_NEVER
    out.binding = never
  elseif binding >= 0 or not cap_ok then
    local soft_fit = soft_never >= 0 and NEVER or soft_latest
    local retry_at = soft_fit < din.cap_end and soft_fit or din.cap_end
    out.outcome = OUT_REJECT
    out.binding = binding
    if binding < 0 then
      -- only the cap refuses (some lifted window lacks room)
      out.cap_reached = 1
      out.overage = over
      out.cost = cost
      out.binding = soft_bind >= 0 and soft_bind or soft_never
      latest = retry_at
      if soft_never >= 0 and din.cap > 0 and cost > din.cap then
        out.outcome = OUT_NEVER
      end
    elseif not cap_ok and retry_at > latest then
      latest = retry_at
    end
    if out.outcome == OUT_REJECT then out.retry_after = latest - now end
  else
    local rc = charge_all(din)
    if rc ~= RC_OK then return rc end
    if soft ~= 0 then
      din.spent.v = spent_after
      out.overage = over
      out.cost = cost
    end
    out.outcome = OUT_ALLOW
    out.binding = -1
  end
  return RC_OK
end

-- Settle: adjust every applicable weight window by delta for a charge
-- made at t0, and free the request's lease.
function D.settle(din, t0, delta)
  for i = 1, din.n do
    local w = din.w[i]
    if U.applies(w, din.model) then
      if w.type == 5 then W[5].release(w, din.e[i])
      elseif w.unit ~= 1 and delta ~= 0 then
        W[w.type].adjust(w, din.e[i], t0, delta)
      end
    end
  end
end

return D
end)()

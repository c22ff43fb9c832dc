-- win_rolling.lua - rolling windows: a charge at t counts while t > now - L.
--
-- The script twin of src/core/win_rolling.c, line for line: the same log
-- of (t, amount) entries coalesced per millisecond, the same running total
-- saturating at the bound, the same clamping of time through the newest
-- entry and its slack (pad), and the same compaction when a charge would
-- need an (M+1)th entry (every instant rounded UP to a grid of
-- g = ceil(L / (M/2)), equal ones merged), so a bounded log admits
-- exactly what the memory store's admits.
--
-- Storage: the window's entries live in its entity's sorted set, in the
-- score range of its slot: score = slot * 2^48 + t, member the packed
-- (slot, t, amount) (struct '>Bdd': unique, since t is unique within the
-- window).  The state (S[o + ...], common.lua) keeps slot, total, pad,
-- count, the newest instant, and the oldest entry's instant and amount,
-- so that clamping, the coalescing test, pruning (nothing to drop while
-- the oldest entry still counts) and the view's reset (the oldest entry
-- holding an amount) read nothing from the set in the common case.
-- Entries are read lazily from whichever end is nearer into parallel
-- arrays (ct, ca, cm: instant, amount, member, by index from the
-- oldest; e.X[o], per call), so a walk reads only what the C code would
-- touch.  Built on first use (W in decide.lua), and what only refusals,
-- settles, expiries and compaction need (RS) on first use of that.
BUILD[1] = function()
local R = {}
local MFMT = '>Bdd'
local SLOT, TOTAL, PAD, COUNT, NEWEST, OLDEST, OA = 1, 2, 3, 4, 5, 6, 7

local function member_of(S, o, t, a) return spack(MFMT, S[o + SLOT], t, a) end

-- Lower bound of the newest instant this state has seen.
local function clamp_now(S, o, now)
  if S[o + COUNT] == 0 then return now end
  local seen = S[o + NEWEST] - S[o + PAD]
  return now > seen and now or seen
end

local RS = lazy(function()
local RS = {}

-- The entry cache of the window at o (created empty).
local function cache(e, o)
  local X = e.X
  if not X then X = {}; e.X = X end
  local c = X[o]
  if not c then c = {ct = {}, ca = {}, cm = {}}; X[o] = c end
  return c
end

local function reset_cache(e, o) if e.X then e.X[o] = nil end end

-- Load entries [i, i + n) into the cache c.
local function fill(e, o, c, i, n)
  local S = e.S
  local count = S[o + COUNT]
  if i + n > count then n = count - i end
  if n <= 0 then return end
  local base = S[o + SLOT] * SLOTW
  local ct, ca, cm = c.ct, c.ca, c.cm
  if i <= count - (i + n) then
    local res = rcall('ZRANGEBYSCORE', e.zkey, sfmt('%d', base),
                      sfmt('%d', base + SLOTW - 1), 'LIMIT', sfmt('%d', i),
                      sfmt('%d', n))
    for k = 1, #res do
      local _, t, a = sunpack(MFMT, res[k])
      ct[i + k - 1], ca[i + k - 1], cm[i + k - 1] = t, a, res[k]
    end
  else
    local res = rcall('ZREVRANGEBYSCORE', e.zkey, sfmt('%d', base + SLOTW - 1),
                      sfmt('%d', base), 'LIMIT', sfmt('%d', count - (i + n)),
                      sfmt('%d', n))
    for k = 1, #res do
      local _, t, a = sunpack(MFMT, res[k])
      ct[i + n - k], ca[i + n - k], cm[i + n - k] = t, a, res[k]
    end
  end
end

-- The cache, with entry i (0-based, from the oldest) present in it.
-- Chunks grow as a walk goes on: most walks stop at the first entry or
-- two.
local function ent(e, o, i)
  local c = cache(e, o)
  if not c.ct[i] then fill(e, o, c, i, i < 4 and 4 or (i < 64 and i or 64)) end
  return c
end

-- The same, walking from the newest end.
local function ent_back(e, o, i)
  local c = cache(e, o)
  if not c.ct[i] then
    local count = e.S[o + COUNT]
    local k = count - i < 64 and count - i + 3 or 64
    local lo = i >= k - 1 and i - k + 1 or 0
    fill(e, o, c, lo, i - lo + 1)
  end
  return c
end

-- Change the amount of the entry at t (index i when known) to v.
local function set_amount(e, o, i, t, old_m, v)
  local S = e.S
  local base = S[o + SLOT] * SLOTW
  local m = member_of(S, o, t, v)
  E.zrem(e, base + t, old_m)
  E.zadd(e, base + t, m)
  if t == S[o + OLDEST] then S[o + OA] = v end
  local c = e.X and e.X[o]
  if i and c then c.ca[i], c.cm[i] = v, m end
end

-- min(bound, sum of the entries), stopping once the bound is reached.
local function resum(e, o)
  local t = 0
  for i = 0, e.S[o + COUNT] - 1 do
    if t >= AMAX then break end
    t = U.amount_add(t, ent(e, o, i).ca[i])
  end
  return t
end

-- The exact sum of the entries (a bignum), for a total at the bound.
local function exact_sum(e, o)
  local t = BN.new(0)
  for i = 0, e.S[o + COUNT] - 1 do
    t = BN.add(t, BN.new(ent(e, o, i).ca[i]))
  end
  return t
end

-- Prune's work once the oldest entry no longer counts: drop every entry
-- with t + L <= now, then read the new oldest.
function RS.drop(w, e, o, now)
  local S = e.S
  local base = S[o + SLOT] * SLOTW
  local hi = base + now - w.length
  local res = rcall('ZRANGEBYSCORE', e.zkey, sfmt('%d', base), sfmt('%d', hi),
                    'WITHSCORES')
  if #res == 0 then return end
  local sat = S[o + TOTAL] >= AMAX
  if not sat then
    local total = S[o + TOTAL]
    for k = 1, #res, 2 do
      local _, _, a = sunpack(MFMT, res[k])
      total = total - a
    end
    S[o + TOTAL] = total
  end
  E.zrem_range(e, base, hi, res, true)
  S[o + COUNT] = S[o + COUNT] - #res / 2
  reset_cache(e, o)
  if S[o + COUNT] > 0 then
    if sat then S[o + TOTAL] = resum(e, o) end
    local c = ent(e, o, 0)
    S[o + OLDEST], S[o + OA] = c.ct[0], c.ca[0]
  else
    S[o + OLDEST], S[o + OA] = 0, 0
  end
end

-- Round every entry's time up to a multiple of g and merge equal ones.
local function compact(e, o, g)
  local S = e.S
  local seen = S[o + NEWEST] - S[o + PAD]
  local ot, oa, om = {}, {}, {}
  for i = 0, S[o + COUNT] - 1 do
    local c = ent(e, o, i)
    ot[i + 1], oa[i + 1], om[i + 1] = c.ct[i], c.ca[i], c.cm[i]
  end
  local nt, na = {}, {}
  for k = 1, #ot do
    local t = U.ceil_div(ot[k], g) * g
    local n = #nt
    if n > 0 and nt[n] == t then na[n] = U.amount_add(na[n], oa[k])
    else nt[n + 1], na[n + 1] = t, oa[k] end
  end
  local base = S[o + SLOT] * SLOTW
  for k = 1, #ot do E.zrem(e, base + ot[k], om[k]) end
  reset_cache(e, o)
  local c = cache(e, o)
  for k = 1, #nt do
    local m = member_of(S, o, nt[k], na[k])
    E.zadd(e, base + nt[k], m)
    c.ct[k - 1], c.ca[k - 1], c.cm[k - 1] = nt[k], na[k], m
  end
  S[o + COUNT] = #nt
  S[o + NEWEST] = nt[#nt]
  S[o + OLDEST], S[o + OA] = nt[1], na[1]
  local slack = S[o + NEWEST] - seen
  S[o + PAD] = slack > UINT32_MAX and UINT32_MAX or slack
end

-- admit_at's walk for an amount a that does not fit now: entries leave
-- oldest first, entry e at exactly e.t + L.
function RS.walk(w, e, o, a)
  local S = e.S
  local total = S[o + TOTAL]
  if total < AMAX then
    local freed = 0
    for i = 0, S[o + COUNT] - 1 do
      local c = ent(e, o, i)
      freed = freed + c.ca[i]
      if total - freed + a <= w.limit then return c.ct[i] + w.length end
    end
    return NEVER
  end
  local rest, lim = exact_sum(e, o), BN.new(w.limit - a)
  for i = 0, S[o + COUNT] - 1 do
    local c = ent(e, o, i)
    rest = BN.sub(rest, BN.new(c.ca[i]))
    if BN.cmp(rest, lim) <= 0 then return c.ct[i] + w.length end
  end
  return NEVER
end

-- charge into the newest entry (t at or before it).
function RS.coalesce(w, e, o, now, a)
  local S = e.S
  local n = S[o + COUNT]
  local c = ent_back(e, o, n - 1)
  local lt = c.ct[n - 1]
  set_amount(e, o, n - 1, lt, c.cm[n - 1], U.amount_add(c.ca[n - 1], a))
  S[o + TOTAL] = U.amount_add(S[o + TOTAL], a)
  local seen_old = lt - S[o + PAD]
  local seen = now > seen_old and now or seen_old
  local sl = lt - seen
  S[o + PAD] = sl > UINT32_MAX and UINT32_MAX or sl
  return RC_OK
end

-- A charge that would need an (M+1)th entry: compact.  Returns RC_EFULL,
-- or nil when the charge can go on.
function RS.make_room(w, e, o)
  local S = e.S
  local mx = w.maxe
  local g = U.ceil_div(w.length > 0 and w.length or 1, math.floor(mx / 2))
  if g < 1 then g = 1 end
  while S[o + COUNT] >= mx do
    compact(e, o, g)
    if g > 2305843009213693951 then break end
    g = g * 2
  end
  if S[o + COUNT] >= mx then return RC_EFULL end
  return nil
end

-- The view's reset when the oldest entry holds nothing: the first that
-- holds any amount.
function RS.reset(w, e, o)
  for i = 1, e.S[o + COUNT] - 1 do
    local c = ent(e, o, i)
    if c.ca[i] > 0 then return c.ct[i] + w.length end
  end
  return 0
end

function RS.adjust(w, e, t0, delta)
  local S, o = e.S, w.o
  local now = clamp_now(S, o, e.now)
  R.prune(w, e, o, now)
  if t0 + w.length <= now then return end
  -- the charge lives in the first entry with t >= t0
  local base = S[o + SLOT] * SLOTW
  local res = rcall('ZRANGEBYSCORE', e.zkey, sfmt('%d', base + t0),
                    sfmt('%d', base + SLOTW - 1), 'LIMIT', '0', '1')
  if #res == 0 then return end
  local _, et, ea = sunpack(MFMT, res[1])
  local v
  if delta > 0 then
    v = U.amount_add(ea, delta)
  else
    if ea >= AMAX then return end
    v = ea + delta
    if v < 0 then v = 0 end
  end
  set_amount(e, o, nil, et, res[1], v)
  reset_cache(e, o)
  if S[o + TOTAL] < AMAX then
    S[o + TOTAL] = U.amount_add(S[o + TOTAL] - ea, v)
  elseif delta < 0 then
    S[o + TOTAL] = resum(e, o)
  end
end

-- Append the recovery schedule to r (its point count, then the points).
function RS.recovery(w, e, max, r)
  local S, o = e.S, w.o
  local now = clamp_now(S, o, e.now)
  R.prune(w, e, o, now)
  local at, rm = {}, {}
  local count = S[o + COUNT]
  -- exact: at the bound, the sum of the entries (a bignum)
  local big = S[o + TOTAL] >= AMAX
  local used = big and exact_sum(e, o) or S[o + TOTAL]
  local function rem_of(u)
    if big then
      local L = BN.new(w.limit)
      return BN.cmp(L, u) > 0 and BN.tonum(BN.sub(L, u)) or 0
    end
    return w.limit > u and w.limit - u or 0
  end
  local prev = rem_of(used)
  for i = 0, count - 1 do
    if #at >= max - 1 then break end
    local c = ent(e, o, i)
    local a = c.ca[i]
    if a > 0 then
      if big then used = BN.sub(used, BN.new(a)) else used = used - a end
      local rem = rem_of(used)
      if rem > prev then
        at[#at + 1], rm[#rm + 1] = c.ct[i] + w.length, rem
        prev = rem
      end
    end
  end
  -- full recovery: the departure of the newest entry holding any amount
  local final_at = 0
  for i = count - 1, 0, -1 do
    local c = ent_back(e, o, i)
    if c.ca[i] > 0 then final_at = c.ct[i] + w.length; break end
  end
  if final_at ~= 0 and (#at == 0 or at[#at] ~= final_at) then
    at[#at + 1], rm[#rm + 1] = final_at, w.limit
  end
  local n = #r
  r[n + 1] = #at
  for k = 1, #at do
    r[n + 2 * k], r[n + 2 * k + 1] = at[k], rm[k]
  end
end

return RS
end)

-- Drop entries that no longer count: t + L <= now.  Nothing to read
-- while the oldest entry still counts.
function R.prune(w, e, o, now)
  local S = e.S
  if S[o + COUNT] > 0 and S[o + OLDEST] + w.length <= now then
    RS.drop(w, e, o, now)
  end
  if S[o + COUNT] == 0 then S[o + TOTAL] = 0; S[o + PAD] = 0 end
end

function R.admit_at(w, e, a)
  local S, o = e.S, w.o
  local now = clamp_now(S, o, e.now)
  R.prune(w, e, o, now)
  if a <= 0 or a <= w.limit - S[o + TOTAL] then return now end
  if a > w.limit or a > AMAX then return NEVER end
  return RS.walk(w, e, o, a)
end

function R.charge(w, e, a)
  local S, o = e.S, w.o
  local now = clamp_now(S, o, e.now)
  R.prune(w, e, o, now)
  if a < 0 then return RC_OK end
  if a > AMAX then a = AMAX end
  local t = now
  if w.prec > 0 then t = U.ceil_div(now, w.prec) * w.prec end
  local n = S[o + COUNT]
  if n > 0 and S[o + NEWEST] >= t then return RS.coalesce(w, e, o, now, a) end
  if n >= w.maxe then
    local rc = RS.make_room(w, e, o)
    if rc then return rc end
    n = S[o + COUNT]
    if n > 0 and S[o + NEWEST] >= t then return R.charge(w, e, a) end
  end
  local m = member_of(S, o, t, a)
  E.zadd(e, S[o + SLOT] * SLOTW + t, m)
  local c = e.X and e.X[o]
  if c then c.ct[n], c.ca[n], c.cm[n] = t, a, m end
  if n == 0 then S[o + OLDEST], S[o + OA] = t, a end
  S[o + COUNT] = n + 1
  S[o + NEWEST] = t
  S[o + TOTAL] = U.amount_add(S[o + TOTAL], a)
  local sl = t - now
  S[o + PAD] = sl > UINT32_MAX and UINT32_MAX or sl
  return RC_OK
end

-- limit, used, remaining, reset.
function R.view(w, e)
  local S, o = e.S, w.o
  R.prune(w, e, o, clamp_now(S, o, e.now))
  local total, reset = S[o + TOTAL], 0
  if S[o + COUNT] > 0 then
    if S[o + OA] > 0 then reset = S[o + OLDEST] + w.length
    else reset = RS.reset(w, e, o) end
  end
  return w.limit, total, w.limit > total and w.limit - total or 0, reset
end

-- Instant after which the state no longer matters (key expiry).
function R.until_(w, S)
  local o = w.o
  return S[o + COUNT] > 0 and S[o + NEWEST] + w.length or 0
end

-- adjust and recovery are RS's
return setmetatable(R, {__index = RS})
end

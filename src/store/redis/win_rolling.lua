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
-- window).  The field keeps slot, total, pad, count and the newest
-- instant, so clamping and the coalescing test need no read of the set.
-- Entries are read lazily from whichever end is nearer into parallel
-- arrays (st.ct, st.ca, st.cm: instant, amount, member, by index from the
-- oldest), so a decision reads only what the C code would touch.
local R = {}
local MFMT = '>Bdd'

local function member_of(st, t, a) return struct.pack(MFMT, st.slot, t, a) end

local function reset_cache(st) st.ct, st.ca, st.cm = {}, {}, {} end

-- Load entries [i, i + n) into the cache.
local function fill(st, i, n)
  if i + n > st.count then n = st.count - i end
  if n <= 0 then return end
  local e, base = st.E, st.slot * SLOTW
  local ct, ca, cm = st.ct, st.ca, st.cm
  if i <= st.count - (i + n) then
    local res = redis.call('ZRANGEBYSCORE', e.zkey, base, base + SLOTW - 1,
                           'LIMIT', i, n)
    for k = 1, #res do
      local _, t, a = struct.unpack(MFMT, res[k])
      ct[i + k - 1], ca[i + k - 1], cm[i + k - 1] = t, a, res[k]
    end
  else
    local res = redis.call('ZREVRANGEBYSCORE', e.zkey, base + SLOTW - 1, base,
                           'LIMIT', st.count - (i + n), n)
    for k = 1, #res do
      local _, t, a = struct.unpack(MFMT, res[k])
      ct[i + n - k], ca[i + n - k], cm[i + n - k] = t, a, res[k]
    end
  end
end

-- Make entry i (0-based, from the oldest) present in the cache.  Chunks
-- grow as a walk goes on: most walks stop at the first entry or two.
local function ent(st, i)
  if not st.ct then reset_cache(st) end
  if not st.ct[i] then fill(st, i, i < 4 and 4 or (i < 64 and i or 64)) end
end

-- The same, walking from the newest end.
local function ent_back(st, i)
  if not st.ct then reset_cache(st) end
  if not st.ct[i] then
    local k = st.count - i < 64 and st.count - i + 3 or 64
    local lo = i >= k - 1 and i - k + 1 or 0
    fill(st, lo, i - lo + 1)
  end
end

-- Change entry i's amount to v (its cache slot is updated).
local function set_amount(st, i, t, old_m, v)
  local base = st.slot * SLOTW
  local m = member_of(st, t, v)
  E.zrem(st.E, base + t, old_m)
  E.zadd(st.E, base + t, m)
  if i and st.ct then st.ca[i], st.cm[i] = v, m end
end

-- Lower bound of the newest instant this state has seen.
local function clamp_now(st, now)
  if st.count == 0 then return now end
  local seen = st.newest - st.pad
  return now > seen and now or seen
end

-- min(bound, sum of the entries), stopping once the bound is reached.
local function resum(st)
  local t = 0
  for i = 0, st.count - 1 do
    if t >= AMAX then break end
    ent(st, i)
    t = U.amount_add(t, st.ca[i])
  end
  return t
end

-- The exact sum of the entries (a bignum), for a total at the bound.
local function exact_sum(st)
  local t = BN.new(0)
  for i = 0, st.count - 1 do
    ent(st, i)
    t = BN.add(t, BN.new(st.ca[i]))
  end
  return t
end

-- Drop entries that no longer count: t + L <= now.  Once per instant:
-- within one script every operation uses the same clamped now, and
-- entries added since lie at or after it.
local function prune(w, st, now)
  if st.pruned == now then return end
  st.pruned = now
  if st.count > 0 and now - w.length >= 0 then
    local e, base = st.E, st.slot * SLOTW
    local hi = base + now - w.length
    local res = redis.call('ZRANGEBYSCORE', e.zkey, base, hi, 'WITHSCORES')
    if #res > 0 then
      local sat = st.total >= AMAX
      if not sat then
        for k = 1, #res, 2 do
          local _, _, a = struct.unpack(MFMT, res[k])
          st.total = st.total - a
        end
      end
      E.zrem_range(e, base, hi, res)
      st.count = st.count - #res / 2
      st.ct = nil
      if st.count > 0 and sat then st.total = resum(st) end
    end
  end
  if st.count == 0 then st.total = 0; st.pad = 0 end
end

-- Round every entry's time up to a multiple of g and merge equal ones.
local function compact(st, g)
  local seen = st.newest - st.pad
  local ot, oa, om = {}, {}, {}
  for i = 0, st.count - 1 do
    ent(st, i)
    ot[i + 1], oa[i + 1], om[i + 1] = st.ct[i], st.ca[i], st.cm[i]
  end
  local nt, na = {}, {}
  for k = 1, #ot do
    local t = U.ceil_div(ot[k], g) * g
    local n = #nt
    if n > 0 and nt[n] == t then na[n] = U.amount_add(na[n], oa[k])
    else nt[n + 1], na[n + 1] = t, oa[k] end
  end
  local base = st.slot * SLOTW
  for k = 1, #ot do E.zrem(st.E, base + ot[k], om[k]) end
  reset_cache(st)
  for k = 1, #nt do
    local m = member_of(st, nt[k], na[k])
    E.zadd(st.E, base + nt[k], m)
    st.ct[k - 1], st.ca[k - 1], st.cm[k - 1] = nt[k], na[k], m
  end
  st.count = #nt
  st.newest = nt[#nt]
  local slack = st.newest - seen
  st.pad = slack > UINT32_MAX and UINT32_MAX or slack
end

function R.admit_at(w, st, ctx, a)
  local now = clamp_now(st, ctx.now)
  prune(w, st, now)
  if a <= 0 or a <= w.limit - st.total then return now end
  if a > w.limit or a > AMAX then return NEVER end
  -- entries leave oldest first, entry e at exactly e.t + L
  if st.total < AMAX then
    local freed = 0
    for i = 0, st.count - 1 do
      ent(st, i)
      freed = freed + st.ca[i]
      if st.total - freed + a <= w.limit then return st.ct[i] + w.length end
    end
    return NEVER
  end
  local rest, lim = exact_sum(st), BN.new(w.limit - a)
  for i = 0, st.count - 1 do
    rest = BN.sub(rest, BN.new(st.ca[i]))
    if BN.cmp(rest, lim) <= 0 then return st.ct[i] + w.length end
  end
  return NEVER
end

function R.charge(w, st, ctx, a)
  local now = clamp_now(st, ctx.now)
  prune(w, st, now)
  if a < 0 then return RC_OK end
  if a > AMAX then a = AMAX end
  local t = now
  if w.prec > 0 then t = U.ceil_div(now, w.prec) * w.prec end
  local n = st.count
  if n > 0 and st.newest >= t then
    ent_back(st, n - 1)
    local lt = st.ct[n - 1]
    set_amount(st, n - 1, lt, st.cm[n - 1], U.amount_add(st.ca[n - 1], a))
    st.total = U.amount_add(st.total, a)
    local seen_old = lt - st.pad
    local seen = now > seen_old and now or seen_old
    local sl = lt - seen
    st.pad = sl > UINT32_MAX and UINT32_MAX or sl
    return RC_OK
  end
  local m = w.maxe
  if n >= m then
    local g = U.ceil_div(w.length > 0 and w.length or 1, math.floor(m / 2))
    if g < 1 then g = 1 end
    while st.count >= m do
      compact(st, g)
      if g > 2305843009213693951 then break end
      g = g * 2
    end
    n = st.count
    if n >= m then return RC_EFULL end
    if n > 0 and st.newest >= t then return R.charge(w, st, ctx, a) end
  end
  local m = member_of(st, t, a)
  E.zadd(st.E, st.slot * SLOTW + t, m)
  if st.ct then st.ct[n], st.ca[n], st.cm[n] = t, a, m end
  st.count = n + 1
  st.newest = t
  st.total = U.amount_add(st.total, a)
  local sl = t - now
  st.pad = sl > UINT32_MAX and UINT32_MAX or sl
  return RC_OK
end

function R.adjust(w, st, ctx, t0, delta)
  local now = clamp_now(st, ctx.now)
  prune(w, st, now)
  if t0 + w.length <= now then return end
  -- the charge lives in the first entry with t >= t0
  local base = st.slot * SLOTW
  local res = redis.call('ZRANGEBYSCORE', st.E.zkey, base + t0,
                         base + SLOTW - 1, 'LIMIT', 0, 1)
  if #res == 0 then return end
  local _, et, ea = struct.unpack(MFMT, res[1])
  local v
  if delta > 0 then
    v = U.amount_add(ea, delta)
  else
    if ea >= AMAX then return end
    v = ea + delta
    if v < 0 then v = 0 end
  end
  set_amount(st, nil, et, res[1], v)
  st.ct = nil
  if st.total < AMAX then
    st.total = U.amount_add(st.total - ea, v)
  elseif delta < 0 then
    st.total = resum(st)
  end
end

function R.view(w, st, ctx, out)
  local now = clamp_now(st, ctx.now)
  prune(w, st, now)
  out.limit = w.limit
  out.used = st.total
  out.remaining = w.limit > st.total and w.limit - st.total or 0
  out.reset = 0
  for i = 0, st.count - 1 do
    ent(st, i)
    if st.ca[i] > 0 then out.reset = st.ct[i] + w.length; break end
  end
end

function R.recovery(w, st, ctx, max)
  local now = clamp_now(st, ctx.now)
  prune(w, st, now)
  local pts = {}
  -- exact: at the bound, the sum of the entries (a bignum)
  local big = st.total >= AMAX
  local used = big and exact_sum(st) or st.total
  local function rem_of(u)
    if big then
      local L = BN.new(w.limit)
      return BN.cmp(L, u) > 0 and BN.tonum(BN.sub(L, u)) or 0
    end
    return w.limit > u and w.limit - u or 0
  end
  local prev = rem_of(used)
  for i = 0, st.count - 1 do
    if #pts >= max - 1 then break end
    ent(st, i)
    local a = st.ca[i]
    if a > 0 then
      if big then used = BN.sub(used, BN.new(a)) else used = used - a end
      local rem = rem_of(used)
      if rem > prev then
        pts[#pts + 1] = {st.ct[i] + w.length, rem}
        prev = rem
      end
    end
  end
  -- full recovery: the departure of the newest entry holding any amount
  local final_at = 0
  for i = st.count - 1, 0, -1 do
    ent_back(st, i)
    if st.ca[i] > 0 then final_at = st.ct[i] + w.length; break end
  end
  if final_at == 0 then return pts end
  if #pts == 0 or pts[#pts][1] ~= final_at then
    pts[#pts + 1] = {final_at, w.limit}
  end
  return pts
end

-- Instant after which the state no longer matters (key expiry).
function R.until_(w, st)
  return st.count > 0 and st.newest + w.length or 0
end

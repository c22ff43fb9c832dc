-- win_concurrency.lua - concurrency windows: requests in flight as leases.
--
-- The script twin of src/core/win_concurrency.c: each admitted request
-- holds a lease {rid, expires} (lease_ttl, default 15 minutes); leases with
-- expires <= now are dropped; a refused request fits again when enough
-- leases have expired.  Leases live in the entity's sorted set, in the
-- window's slot range: score = slot * 2^48 + expires, member one byte
-- (100 + slot: never a rolling member's first byte) then the rid (the low
-- 64 bits of the request id hash, 16 hex digits), and are read whole on
-- first use (there are at most N + 16 of them).  The
-- cap is the C code's: a charge fails with QG_EFULL when N + 16 (at most
-- 65536) leases are held.
local CONC = {}

local CONC_SLACK, CONC_HARD_CAP = 16, 65536

local function slots_of(w)
  if w.limit <= 0 then return 0 end
  return (U.idiv(w.limit, 1000))
end

local function load(st)
  if st.leases then return end
  local base = st.slot * SLOTW
  local res = redis.call('ZRANGEBYSCORE', st.E.zkey, base, base + SLOTW - 1,
                         'WITHSCORES')
  st.leases = {}
  for k = 1, #res, 2 do
    st.leases[#st.leases + 1] = {rid = string.sub(res[k], 2),
                                 exp = tonumber(res[k + 1]) - base, m = res[k]}
  end
end

local function member(st, rid) return string.char(100 + st.slot) .. rid end

-- Clamp now, record it, and drop expired leases.
local function advance(st, ctx)
  local now = ctx.now > st.seen and ctx.now or st.seen
  st.seen = now
  load(st)
  local keep, base = {}, st.slot * SLOTW
  for _, l in ipairs(st.leases) do
    if l.exp <= now then E.zrem(st.E, base + l.exp, l.m)
    else keep[#keep + 1] = l end
  end
  st.leases = keep
  return now
end

local function sorted_expiries(st)
  local t = {}
  for i, l in ipairs(st.leases) do t[i] = l.exp end
  table.sort(t)
  return t
end

function CONC.admit_at(w, st, ctx, a)
  local now = advance(st, ctx)
  local slots = slots_of(w)
  if a <= 0 or #st.leases < slots then return now end
  if slots == 0 then return NEVER end
  -- full: the (excess + 1)-th expiry in order frees the slot needed
  local excess = #st.leases - slots
  return sorted_expiries(st)[excess + 1]
end

function CONC.charge(w, st, ctx, a)
  local now = advance(st, ctx)
  local ttl = w.lease > 0 and w.lease or CONC_DEFAULT_TTL
  local exp = now + ttl
  local base = st.slot * SLOTW
  -- the same request charged again refreshes its lease
  for _, l in ipairs(st.leases) do
    if l.rid == ctx.rid then
      E.zrem(st.E, base + l.exp, l.m)
      l.exp = exp
      E.zadd(st.E, base + exp, l.m)
      return RC_OK
    end
  end
  local lim = slots_of(w) + CONC_SLACK
  if lim > CONC_HARD_CAP then lim = CONC_HARD_CAP end
  if #st.leases >= lim then return RC_EFULL end
  local l = {rid = ctx.rid, exp = exp, m = member(st, ctx.rid)}
  E.zadd(st.E, base + exp, l.m)
  st.leases[#st.leases + 1] = l
  return RC_OK
end

function CONC.adjust(w, st, ctx, t0, delta) end

-- Free the lease of ctx.rid.  Returns true when one was freed.
function CONC.release(w, st, ctx)
  advance(st, ctx)
  for i, l in ipairs(st.leases) do
    if l.rid == ctx.rid then
      E.zrem(st.E, st.slot * SLOTW + l.exp, l.m)
      table.remove(st.leases, i)
      return true
    end
  end
  return false
end

function CONC.view(w, st, ctx, out)
  advance(st, ctx)
  out.limit = slots_of(w) * 1000
  out.used = #st.leases * 1000
  out.remaining = out.limit > out.used and out.limit - out.used or 0
  local e = 0
  for _, l in ipairs(st.leases) do
    if e == 0 or l.exp < e then e = l.exp end
  end
  out.reset = e
end

function CONC.recovery(w, st, ctx, max)
  advance(st, ctx)
  local limit = slots_of(w) * 1000
  local used = #st.leases * 1000
  local prev = limit > used and limit - used or 0
  local pts, last_at = {}, 0
  local exps = sorted_expiries(st)
  local i = 1
  -- expiries in order, leases sharing an instant leaving together
  while i <= #exps do
    local at, same = exps[i], 0
    while i <= #exps and exps[i] == at do same = same + 1; i = i + 1 end
    last_at = at
    used = used - same * 1000
    local rem = limit > used and limit - used or 0
    if rem > prev and #pts < max - 1 then pts[#pts + 1] = {at, rem} end
    if rem > prev then prev = rem end
  end
  if last_at == 0 or limit == 0 then return {} end
  if #pts == 0 or pts[#pts][1] ~= last_at then pts[#pts + 1] = {last_at, limit} end
  return pts
end

function CONC.until_(w, st)
  load(st)
  local e = 0
  for _, l in ipairs(st.leases) do if l.exp > e then e = l.exp end end
  return e
end

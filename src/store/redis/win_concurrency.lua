-- win_concurrency.lua - concurrency windows: requests in flight as leases.
--
-- The script twin of src/core/win_concurrency.c: each admitted request
-- holds a lease {rid, expires} (lease_ttl, default 15 minutes); leases with
-- expires <= now are dropped; a refused request fits again when enough
-- leases have expired.  Leases live in the entity's sorted set, in the
-- window's slot range: score = slot * 2^48 + expires, member one byte
-- (100 + slot: never a rolling member's first byte) then the rid (the low
-- 64 bits of the request id hash, 16 hex digits).  The cap is the C
-- code's: a charge fails with QG_EFULL when N + 16 (at most 65536) leases
-- are held.
--
-- State (S[o + ...], common.lua): slot, seen, the lease count, the
-- earliest expiry (-1: unknown, read when needed) and an upper bound of
-- the latest (the keys' expiry).  With them an admission reads no lease
-- (count below the slots, earliest expiry still ahead) and adds its own
-- with one ZADD; the leases themselves are read (in expiry order, into
-- e.X[o]) only by a full window, a recovery schedule or an expiry.
-- Built on first use (W in decide.lua), what only expiries, full
-- windows, releases and recoveries need (CS) on first use of that.
BUILD[5] = function()
local CONC = {}
local SLOT, SEEN, COUNT, MIN, MAX = 1, 2, 3, 4, 5
local CONC_SLACK, CONC_HARD_CAP = 16, 65536

local function slots_of(w)
  if w.limit <= 0 then return 0 end
  return (U.idiv(w.limit, 1000))
end

local function member(S, o, rid) return string.char(100 + S[o + SLOT]) .. rid end

local function forget(e, o) if e.X then e.X[o] = nil end end

local CS = lazy(function()
local CS = {}

-- Every lease, in expiry order: {exp = {...}, m = {...}}.
function CS.load(e, S, o)
  local X = e.X
  if not X then X = {}; e.X = X end
  local l = X[o]
  if l then return l end
  local base = S[o + SLOT] * SLOTW
  local res = rcall('ZRANGEBYSCORE', e.zkey, sfmt('%d', base),
                    sfmt('%d', base + SLOTW - 1), 'WITHSCORES')
  l = {exp = {}, m = {}}
  for k = 1, #res, 2 do
    local i = (k + 1) / 2
    l.m[i], l.exp[i] = res[k], tonumber(res[k + 1]) - base
  end
  X[o] = l
  return l
end

-- The earliest expiry (the state holds leases).
function CS.earliest(e, S, o)
  local l = e.X and e.X[o]
  if l then return l.exp[1] or 0 end
  local base = S[o + SLOT] * SLOTW
  local res = rcall('ZRANGEBYSCORE', e.zkey, sfmt('%d', base),
                    sfmt('%d', base + SLOTW - 1), 'WITHSCORES', 'LIMIT', '0', '1')
  if #res == 0 then return 0 end
  return tonumber(res[2]) - base
end

-- Drop the leases with expires <= now.
function CS.expire(e, S, o, now)
  local base = S[o + SLOT] * SLOTW
  local res = rcall('ZRANGEBYSCORE', e.zkey, sfmt('%d', base),
                    sfmt('%d', base + now), 'WITHSCORES')
  E.zrem_range(e, base, base + now, res, true)
  S[o + COUNT] = S[o + COUNT] - #res / 2
  forget(e, o)
  if S[o + COUNT] > 0 then S[o + MIN] = CS.earliest(e, S, o)
  else S[o + MIN], S[o + MAX] = 0, 0 end
end

-- The lease m (held, expiring at old) now expires at exp.
function CS.refresh(e, S, o, m, old, exp)
  local base = S[o + SLOT] * SLOTW
  E.zrem(e, base + old, m)
  E.zadd(e, base + exp, m)
  forget(e, o)
  if old == S[o + MIN] then S[o + MIN] = S[o + COUNT] == 1 and exp or -1 end
  if exp > S[o + MAX] then S[o + MAX] = exp end
end

function CS.adjust(w, e, t0, delta) end

-- Free the lease of e.rid.  Returns true when one was freed.
function CS.release(w, e)
  local S, o = e.S, w.o
  CONC.advance(e, S, o)
  if S[o + COUNT] == 0 then return false end
  local m = member(S, o, e.rid)
  if UNDO.on then
    -- the undo log needs its score
    local sc = rcall('ZSCORE', e.zkey, m)
    if not sc then return false end
    E.zrem(e, tonumber(sc), m)
  else
    if rcall('ZREM', e.zkey, m) == 0 then return false end
    e.zdirty = true
    e.zn = e.zn - 1
    if e.zn <= 0 then e.znew = true end
  end
  forget(e, o)
  S[o + COUNT] = S[o + COUNT] - 1
  if S[o + COUNT] == 0 then S[o + MIN], S[o + MAX] = 0, 0
  else S[o + MIN] = -1 end
  return true
end

function CS.recovery(w, e, max, r)
  local S, o = e.S, w.o
  CONC.advance(e, S, o)
  local limit = slots_of(w) * 1000
  local used = S[o + COUNT] * 1000
  local prev = limit > used and limit - used or 0
  local exps = CS.load(e, S, o).exp
  local at, rm, last_at = {}, {}, 0
  local i = 1
  -- expiries in order, leases sharing an instant leaving together
  while i <= #exps do
    local t, same = exps[i], 0
    while i <= #exps and exps[i] == t do same = same + 1; i = i + 1 end
    last_at = t
    used = used - same * 1000
    local rem = limit > used and limit - used or 0
    if rem > prev and #at < max - 1 then at[#at + 1], rm[#rm + 1] = t, rem end
    if rem > prev then prev = rem end
  end
  local n = #r
  if last_at == 0 or limit == 0 then r[n + 1] = 0; return end
  if #at == 0 or at[#at] ~= last_at then at[#at + 1], rm[#rm + 1] = last_at, limit end
  r[n + 1] = #at
  for k = 1, #at do r[n + 2 * k], r[n + 2 * k + 1] = at[k], rm[k] end
end

return CS
end)

-- Clamp now, record it, and drop expired leases (nothing to read while
-- the earliest expiry is ahead).
function CONC.advance(e, S, o)
  local now = e.now > S[o + SEEN] and e.now or S[o + SEEN]
  S[o + SEEN] = now
  if S[o + COUNT] > 0 then
    if S[o + MIN] < 0 then S[o + MIN] = CS.earliest(e, S, o) end
    if S[o + MIN] <= now then CS.expire(e, S, o, now) end
  end
  return now
end

function CONC.admit_at(w, e, a)
  local S, o = e.S, w.o
  local now = CONC.advance(e, S, o)
  local slots = slots_of(w)
  if a <= 0 or S[o + COUNT] < slots then return now end
  if slots == 0 then return NEVER end
  -- full: the (excess + 1)-th expiry in order frees the slot needed
  return CS.load(e, S, o).exp[S[o + COUNT] - slots + 1]
end

function CONC.charge(w, e, a)
  local S, o = e.S, w.o
  local now = CONC.advance(e, S, o)
  local exp = now + (w.lease > 0 and w.lease or CONC_DEFAULT_TTL)
  local base = S[o + SLOT] * SLOTW
  local m = member(S, o, e.rid)
  local count = S[o + COUNT]
  local lim = slots_of(w) + CONC_SLACK
  if lim > CONC_HARD_CAP then lim = CONC_HARD_CAP end
  if count >= lim then
    -- full: only the same request, charged again, refreshes its lease
    local sc = rcall('ZSCORE', e.zkey, m)
    if not sc then return RC_EFULL end
    CS.refresh(e, S, o, m, tonumber(sc) - base, exp)
    return RC_OK
  end
  if not E.zadd_nx(e, base + exp, m) then
    -- the same request charged again refreshes its lease
    CS.refresh(e, S, o, m, tonumber(rcall('ZSCORE', e.zkey, m)) - base, exp)
    return RC_OK
  end
  forget(e, o)
  S[o + COUNT] = count + 1
  if count == 0 then S[o + MIN] = exp
  elseif S[o + MIN] >= 0 and exp < S[o + MIN] then S[o + MIN] = exp end
  if exp > S[o + MAX] then S[o + MAX] = exp end
  return RC_OK
end

-- limit, used, remaining, reset.
function CONC.view(w, e)
  local S, o = e.S, w.o
  CONC.advance(e, S, o)
  local limit, used = slots_of(w) * 1000, S[o + COUNT] * 1000
  return limit, used, limit > used and limit - used or 0,
         S[o + COUNT] > 0 and S[o + MIN] or 0
end

function CONC.until_(w, S)
  return S[w.o + MAX]
end

-- release, adjust and recovery are CS's
return setmetatable(CONC, {__index = CS})
end

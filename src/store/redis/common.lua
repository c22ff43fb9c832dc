-- common.lua - what every script of the Redis store shares: constants,
-- exact integer helpers, and the entities (a member's or an org's state)
-- with their loading, binding to a window list, and writing back.
--
-- Key layout (docs/redis-store.md): an entity has two keys, both tagged
-- with the decision's hash tag, passed in KEYS:
--   qg:{TAG}:s:<ENTITY>  hash: one field per window (its state packed with
--                        Redis's struct library: binary doubles, exact
--                        for every integer of the domain; the field is
--                        named by the window's id: name hash + type),
--                        plus L (layout id), t (newest instant seen),
--                        sp/ss (payg spent amount and its cap period
--                        start, members only) and v (a write counter);
--   qg:{TAG}:z:<ENTITY>  sorted set: the entries of every rolling log and
--                        every lease of the entity, each window in its own
--                        score range [slot * 2^48, (slot + 1) * 2^48).
-- Instants are below 2^48 and slots below 16, so every score is an exact
-- integer below 2^52.  Text is parsed nowhere on the hot path: in Redis's
-- Lua a string split costs more than a whole window's arithmetic.
--
-- A script reads an entity's hash once (HGETALL), works on Lua tables, and
-- writes the fields that changed at the end (flush).  Sorted-set changes
-- are made at once.  While the undo log is on (a check that may have to
-- be voided, ops.lua), every write also records its inverse.
local NEVER = 9223372036854775807   -- QG_NEVER (2^63 as a double)
local TWO53 = 9007199254740992
local UINT32_MAX = 4294967295
local SLOTW = 281474976710656       -- 2^48, one window's score range
local TMAX = 253402300799999        -- QG_TIME_MAX_MS
local CONC_DEFAULT_TTL = 900000     -- win_concurrency.c
local MARGIN_MS = 3600000           -- kept this long past the last use
local RC_OK, RC_EINVAL, RC_EFULL = 0, -2, -6
local QG_MAX_RECOVERY = 4

local U = {}

-- The preamble's window lists are functions that build their tables: a
-- call builds only the lists it uses (each once).
local LAYOUT_MEMO = {}
local function layout(i)
  local l = LAYOUT_MEMO[i]
  if not l then
    l = LAYOUTS[i]()
    l.index = i
    LAYOUT_MEMO[i] = l
  end
  return l
end

-- floor(a / b) and a - b * floor(a / b), exact for integers with
-- |a| + b < 2^53, b > 0 (the double quotient may round across an
-- integer; the remainder shows it and one step fixes it).
function U.idiv(a, b)
  local q = math.floor(a / b)
  local r = a - q * b
  if r < 0 then q = q - 1; r = r + b elseif r >= b then q = q + 1; r = r - b end
  return q, r
end

-- qg__ceil_div (fixed.h).
function U.ceil_div(a, b)
  if a <= 0 then
    local q = U.idiv(-a, b)
    return -q
  end
  local q, r = U.idiv(a, b)
  return r ~= 0 and q + 1 or q
end

-- qg__amount_add / qg__money_add with the Redis store's bounds.
function U.amount_add(a, b)
  if b > AMAX then b = AMAX end
  a = a + b
  return a > AMAX and AMAX or a
end

function U.money_add(a, b)
  if b > MMAX then b = MMAX end
  a = a + b
  return a > MMAX and MMAX or a
end

function U.fmt(x) return string.format('%d', x) end

-- qg__window_applies (rules.h): mask false = every model.
function U.applies(w, model)
  if not w.mask then return true end
  return model >= 0 and w.mask[model] == true
end

-- qg__win_amount (window.h).
function U.amount(w, weight)
  if w.unit == 1 or w.type == 5 then return 1000 end
  return weight
end

-- ceil(a * b / d) for a, b, d >= 0 integers below 2^53, exact; math.huge
-- when it is 2^53 or more.
function U.mul_ceil_div(a, b, d)
  if a * b < TWO53 / 2 then
    return U.ceil_div(a * b, d)
  end
  local q, r = BN.divmod(BN.mul(BN.new(a), BN.new(b)), d)
  if q == math.huge then return q end
  return r > 0 and q + 1 or q
end

-- ------------------------------------------------------------ undo log

-- Entries of four values: op (1 restore a hash field, 2 delete a hash
-- field, 3 add a sorted-set member back, 4 remove a member), the KEYS
-- index, and two operands (field and old value; score and member).
local UNDO = {on = false, list = {}, n = 0}

function UNDO.push(op, k, a, b)
  if UNDO.on then
    local l, n = UNDO.list, UNDO.n
    l[n + 1] = op
    l[n + 2] = k
    l[n + 3] = a
    l[n + 4] = b
    UNDO.n = n + 4
  end
end

-- ------------------------------------------------------------ entities

local E = {}

-- The entity whose hash is KEYS[hk] and sorted set KEYS[hk + 1].  With
-- the window list it will follow (lay), only that list's fields are read
-- (HMGET: every string a reply makes costs in Redis's Lua); the whole
-- hash when the entity followed another list (its other fields must go).
function E.load(hk, lay)
  local h, orig, exists = {}, {}, false
  local raw
  if lay then
    local names = {'L', 't', 'sp', 'ss', 'v'}
    for i, w in ipairs(lay.w) do names[5 + i] = w.wid end
    raw = redis.call('HMGET', KEYS[hk], unpack(names))
    for i = 1, #names do
      local v = raw[i]
      if v then
        h[names[i]] = v
        orig[names[i]] = v
        exists = true
      end
    end
    if not exists or h.L == lay.id then
      return {hk = hk, zk = hk + 1, hkey = KEYS[hk], zkey = KEYS[hk + 1],
              h = h, orig = orig, exists = exists, st = {}, zdirty = false,
              seen = tonumber(h.t or '0')}
    end
    h, orig = {}, {}
  end
  raw = redis.call('HGETALL', KEYS[hk])
  for i = 1, #raw, 2 do h[raw[i]] = raw[i + 1]; orig[raw[i]] = raw[i + 1] end
  return {hk = hk, zk = hk + 1, hkey = KEYS[hk], zkey = KEYS[hk + 1],
          h = h, orig = orig, exists = #raw > 0, st = {}, zdirty = false,
          seen = tonumber(h.t or '0')}
end

function E.zadd(e, score, member)
  redis.call('ZADD', e.zkey, score, member)
  e.zdirty = true
  UNDO.push(4, e.zk, 0, member)
end

-- Remove member (whose score was `score`).
function E.zrem(e, score, member)
  redis.call('ZREM', e.zkey, member)
  e.zdirty = true
  UNDO.push(3, e.zk, score, member)
end

-- Remove every member with a score in [lo, hi] (members and scores as a
-- ZRANGEBYSCORE WITHSCORES reply, for the undo log).
function E.zrem_range(e, lo, hi, res)
  if #res == 0 then return end
  redis.call('ZREMRANGEBYSCORE', e.zkey, lo, hi)
  e.zdirty = true
  if UNDO.on then
    for i = 1, #res, 2 do UNDO.push(3, e.zk, tonumber(res[i + 1]), res[i]) end
  end
end

-- Window state: unpack a field, or make a fresh state.  Formats (struct):
--   rolling      >BdI4I4d  slot, total, pad, count, newest instant
--   calendar     >ddd      period start, end, used
--   session      >ddd      start, used, seen
--   rate         >dddBd    tat as (q, r), seen, capped, the limit L
--   concurrency  >Bd       slot, seen
local ST = {}
local FMT = {'>BdI4I4d', '>ddd', '>ddd', '>dddBd', '>Bd'}

function ST.parse(w, s)
  local t = w.type
  if t == 1 then
    local slot, total, pad, count, newest = struct.unpack(FMT[1], s)
    return {slot = slot, total = total, pad = pad, count = count, newest = newest}
  elseif t == 2 then
    local a, b, c = struct.unpack(FMT[2], s)
    return {s = a, e = b, used = c}
  elseif t == 3 then
    local a, b, c = struct.unpack(FMT[3], s)
    return {start = a, used = b, seen = c}
  elseif t == 4 then
    local q, r, seen, capped, L = struct.unpack(FMT[4], s)
    return {q = q, r = r, seen = seen, capped = capped, L = L}
  else
    local slot, seen = struct.unpack(FMT[5], s)
    return {slot = slot, seen = seen}
  end
end

function ST.fresh(w)
  local t = w.type
  if t == 1 then return {slot = -1, total = 0, pad = 0, count = 0, newest = 0}
  elseif t == 2 then return {s = 0, e = 0, used = 0}
  elseif t == 3 then return {start = 0, used = 0, seen = 0}
  elseif t == 4 then return {q = 0, r = 0, seen = 0, capped = 0, L = w.limit}
  else return {slot = -1, seen = 0} end
end

function ST.pack(w, st)
  local t = w.type
  if t == 1 then
    return struct.pack(FMT[1], st.slot, st.total, st.pad, st.count, st.newest)
  elseif t == 2 then return struct.pack(FMT[2], st.s, st.e, st.used)
  elseif t == 3 then return struct.pack(FMT[3], st.start, st.used, st.seen)
  elseif t == 4 then
    return struct.pack(FMT[4], st.q, st.r, st.seen, st.capped, st.L)
  else return struct.pack(FMT[5], st.slot, st.seen) end
end

-- The slot of a rolling or concurrency field's packed state.
local function slot_of(v) return (string.byte(v, 1)) end

-- The window type a field name stands for (its last digit), 0 for the
-- entity's own fields.
local function field_type(k)
  if #k ~= 9 then return 0 end
  return string.byte(k, 9) - 48
end

-- Bind the entity to window list `lay` (a LAYOUTS entry), without
-- writing anything yet (a call may still answer "period", ops.lua).  With
-- relayout, an entity that followed another list keeps the state of every
-- window of the same type and name and drops the rest (store_memory.c,
-- entity_relayout); without, the list is only used to read the state.
-- E.commit then clears the sorted-set ranges of dropped windows (and of a
-- fresh window's slot, should state have vanished from under it).
function E.bind(e, lay, relayout)
  e.lay = lay
  e.clear = {}
  if relayout and e.h.L ~= lay.id then
    if e.exists then
      local keep = {}
      for _, w in ipairs(lay.w) do keep[w.wid] = true end
      local drop = {}
      for k, _ in pairs(e.h) do
        if field_type(k) > 0 and not keep[k] then drop[#drop + 1] = k end
      end
      table.sort(drop)
      for _, k in ipairs(drop) do
        local ty = field_type(k)
        if ty == 1 or ty == 5 then e.clear[#e.clear + 1] = slot_of(e.h[k]) end
        e.h[k] = nil
      end
    end
    e.h.L = lay.id
  end
  local used, fresh = {}, {}
  for i, w in ipairs(lay.w) do
    local s = e.h[w.wid]
    local st
    if s then st = ST.parse(w, s) else st = ST.fresh(w); fresh[#fresh + 1] = i end
    st.E = e
    e.st[i] = st
    if w.type == 1 or w.type == 5 then e.haslog = true end
  end
  -- every slot a field still holds (a list read without relayout may
  -- leave others' fields in place) or one being cleared is taken
  for k, v in pairs(e.h) do
    local ty = field_type(k)
    if ty == 1 or ty == 5 then used[slot_of(v)] = true end
  end
  for _, slot in ipairs(e.clear) do used[slot] = true end
  for _, i in ipairs(fresh) do
    local w, st = lay.w[i], e.st[i]
    if w.type == 1 or w.type == 5 then
      local slot = 0
      while used[slot] do slot = slot + 1 end
      used[slot] = true
      st.slot = slot
      if e.exists and redis.call('ZCOUNT', e.zkey, slot * SLOTW,
                                 slot * SLOTW + SLOTW - 1) > 0 then
        e.clear[#e.clear + 1] = slot
      end
    end
  end
end

function E.commit(e)
  for _, slot in ipairs(e.clear or {}) do
    local lo, hi = slot * SLOTW, slot * SLOTW + SLOTW - 1
    E.zrem_range(e, lo, hi, redis.call('ZRANGEBYSCORE', e.zkey, lo, hi, 'WITHSCORES'))
  end
  e.clear = {}
end

-- The layout the entity's state follows (its L field), or nil.
function E.stored_layout(e)
  local i = e.h.L and LAYOUT_BY_ID[e.h.L]
  return i and layout(i) or nil
end

-- Write back what changed; keep the keys `ttl` ms.  Returns the write
-- counter after the writes.
function E.flush(e, ttl)
  if e.lay then
    for i, w in ipairs(e.lay.w) do e.h[w.wid] = ST.pack(w, e.st[i]) end
  end
  if e.seen > 0 or e.h.t then e.h.t = U.fmt(e.seen) end
  local changed = e.zdirty
  local sets, dels = {}, {}
  for k, v in pairs(e.h) do
    if e.orig[k] ~= v and k ~= 'v' then sets[#sets + 1] = k end
  end
  for k, _ in pairs(e.orig) do
    if e.h[k] == nil then dels[#dels + 1] = k end
  end
  if #sets > 0 or #dels > 0 then changed = true end
  local v = tonumber(e.orig.v or '0')
  if not changed then return v end
  v = v + 1
  e.h.v = U.fmt(v)
  sets[#sets + 1] = 'v'
  table.sort(sets)
  local args = {}
  for _, k in ipairs(sets) do
    args[#args + 1] = k
    args[#args + 1] = e.h[k]
    if e.orig[k] then UNDO.push(1, e.hk, k, e.orig[k])
    else UNDO.push(2, e.hk, k, '') end
  end
  for _, k in ipairs(dels) do UNDO.push(1, e.hk, k, e.orig[k]) end
  redis.call('HSET', e.hkey, unpack(args))
  if #dels > 0 then redis.call('HDEL', e.hkey, unpack(dels)) end
  redis.call('PEXPIRE', e.hkey, ttl)
  if e.zdirty or e.haslog then redis.call('PEXPIRE', e.zkey, ttl) end
  return v
end

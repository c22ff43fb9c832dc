-- common.lua - what every script of the Redis store shares: constants,
-- exact integer helpers, and the entities (a member's or an org's state)
-- with their loading, binding to a window list, and writing back.
--
-- Key layout (docs/redis-store.md): an entity has two keys, both tagged
-- with the decision's hash tag, passed in KEYS:
--   qg:{TAG}:e:<ENTITY>  string: the entity's whole state, packed with
--                        Redis's struct library (binary doubles: exact for
--                        every integer of the domain), read with one GET
--                        and one struct.unpack, written with one SET;
--   qg:{TAG}:l:<ENTITY>  sorted set: the entries of every rolling log and
--                        every lease of the entity, each window in its own
--                        score range [slot * 2^48, (slot + 1) * 2^48).
-- Instants are below 2^48 and slots below 16, so every score is an exact
-- integer below 2^52.
--
-- The state string: a header HFMT (the id of the window list it follows,
-- a flag saying the rest is exactly that list's format, the newest
-- instant seen, the payg spent amount and its cap period start (members),
-- a write counter, the instant until which both keys are known to live,
-- the window count), each window's state (TFMT by type), then the window
-- ids, 9 bytes each (name hash and type digit), so that a state written
-- under a list this script does not know can still be read window by
-- window.  Unpacked, the state is one flat array S: the header at
-- S[1..8], a window's values from S[w.o + 1] (w.o from the list, built
-- by redis_script.c).  One array instead of a table per window: in
-- Redis's Lua every table, closure and string costs more than the
-- arithmetic of a decision.
--
-- A script reads each entity once, works on S, and writes the state back
-- at the end when it changed (flush).  Sorted-set changes are made at
-- once.  While the undo log is on (a check that may have to be voided,
-- ops.lua), every write also records its inverse.
local NEVER = 9223372036854775807   -- QG_NEVER (2^63 as a double)
local TWO52 = 4503599627370496
local TWO53 = 9007199254740992
local UINT32_MAX = 4294967295
local SLOTW = 281474976710656       -- 2^48, one window's score range
local TMAX = 253402300799999        -- QG_TIME_MAX_MS
local CONC_DEFAULT_TTL = 900000     -- win_concurrency.c
local MARGIN_MS = 3600000           -- kept this long past the last use
local RC_OK, RC_EINVAL, RC_EFULL = 0, -2, -6
local QG_MAX_RECOVERY = 4
local rcall, spack, sunpack = redis.call, struct.pack, struct.unpack
-- A number passed to a command as a Lua number is formatted by Redis with
-- "%.17g" (~3.5k instructions each, docs/benchmarks.md, "Redis store");
-- every number the scripts pass is an integer below 2^53, which
-- sfmt('%d', x) writes exactly, for a tenth of that.
local sfmt = string.format

-- Every module is built inside a function of its own (here U, E; D in
-- decide.lua, OPS in ops.lua, the window types on first use): Redis runs
-- the whole script body at every call, and a closure made at the top of
-- a long chunk costs a walk over every variable the chunk's closures
-- share, one made inside a function only over that function's.
local BUILD = {}   -- window types' builders (win_*.lua), by type number
local CALL = {}    -- this call's context: the calendar periods (ops.lua)

-- A table whose functions build() makes on first use: rare paths cost a
-- call nothing until one takes them.
local function lazy(build)
  return setmetatable({}, {__index = function(t, k)
    for name, f in pairs(build()) do rawset(t, name, f) end
    return rawget(t, k)
  end})
end

-- The preamble's window lists, each built once per call on first use.
local LIST_MEMO = {}
local function layout(i)
  local l = LIST_MEMO[i]
  if not l then
    l = LIST(i)
    l.index = i
    LIST_MEMO[i] = l
  end
  return l
end

local U = (function()
local U = {}

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

-- qg__window_applies (rules.h): mask false = every model.
function U.applies(w, model)
  local mask = w.mask
  return not mask or (model >= 0 and mask[model] == true)
end

-- qg__win_amount (window.h).
function U.amount(w, weight)
  if w.unit == 1 or w.type == 5 then return 1000 end
  return weight
end

-- ceil(a * b / d) for a, b, d >= 0 integers below 2^53, exact; math.huge
-- when it is 2^53 or more.
function U.mul_ceil_div(a, b, d)
  if a * b < TWO52 then
    return U.ceil_div(a * b, d)
  end
  local q, r = BN.divmod(BN.mul(BN.new(a), BN.new(b)), d)
  if q == math.huge then return q end
  return r > 0 and q + 1 or q
end

return U
end)()

-- ------------------------------------------------------------ undo log

-- Entries of four values: op (1 set a state key back to a, 2 delete a
-- state key, 3 add a sorted-set member back, 4 remove a member), the KEYS
-- index, and two operands (the old state; score and member).
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

-- the header: list id, canonical flag, newest instant, spent amount, its
-- cap period start, write counter, keys known to live until, windows
local HFMT, HSIZE = '>c16BdddddB', 58
local H_L, H_CANON, H_T, H_SP, H_SS, H_V, H_XP, H_N = 1, 2, 3, 4, 5, 6, 7, 8
local NOLIST = '----------------'   -- a header without windows
-- a window type's state: format, values, fresh values (slot -1: none yet)
--   rolling      slot, total, pad, count, newest, oldest, oldest amount
--   calendar     period start, end, used
--   session      start, used, seen
--   rate         tat as (q, r), seen, capped, the limit L it is scaled by
--   concurrency  slot, seen, count, earliest expiry (-1 unknown), latest
local TFMT = {'>Bdddddd', '>ddd', '>ddd', '>dddBd', '>Bdddd'}
local TLEN = {7, 3, 3, 5, 5}
local NOEXTRAS = {}

local E = (function()
local E = {}

-- The entity whose state is KEYS[hk] and sorted set KEYS[hk + 1]: one
-- GET, nothing parsed until it is bound to a list (E.bind) or read
-- without one (E.header).
-- (Every field an entity will have is in its constructor: a table that
-- grows is rebuilt at each power of two.)  hk: its state's KEYS index
-- (the sorted set's is hk + 1); blob: the state as read (false: none);
-- S: unpacked; S0: its values as read (the list's own format only);
-- lay: the list bound; L: the list id it is written under;
-- extras: windows of another list kept as they are; seen, now, rid: its
-- newest instant, the instant the call judges at, the request's lease id;
-- zn: members its windows count in the sorted set, znew: the set may
-- have no expiry (it was or became empty); X: per-window caches; pp:
-- calendar windows' periods; clear: slots to clear.
-- A call reads a KEYS index once (2, the member; 4, its org), so each has
-- one table, kept between calls (a loaded library's state) and filled
-- afresh here, not built: in Redis a table built with nine named fields
-- costs ~3.7k instructions (docs/benchmarks.md, "Redis store").
local ENT = {}
function E.read(hk)
  local e = ENT[hk]
  if not e then
    e = {hk = hk, zkey = false, blob = false, S = false, S0 = false,
         lay = false, L = false, extras = NOEXTRAS, seen = 0, now = 0,
         rid = '', zdirty = false, zn = 0, znew = false, X = false,
         pp = false, clear = false}
    ENT[hk] = e
  end
  e.zkey, e.blob = KEYS[hk + 1], rcall('GET', KEYS[hk])
  e.S, e.S0, e.lay, e.L, e.extras, e.seen = false, false, false, false, NOEXTRAS, 0
  e.now, e.rid, e.zdirty, e.zn, e.znew = 0, '', false, 0, false
  e.X, e.pp, e.clear = false, false, false
  return e
end

-- An entity read through no window list: only its header.
function E.header(e)
  if e.blob then e.S = {sunpack(HFMT, e.blob)}
  else e.S = {NOLIST, 0, 0, 0, 0, 0, 0, 0} end
  e.seen = e.S[H_T]
end

-- The list the entity's state follows (its header's id), or nil.
function E.stored_layout(e)
  if not e.blob then return nil end
  local i = LIST_INDEX(string.sub(e.blob, 1, 16))
  return i and layout(i) or nil
end

local BIND = lazy(function()
local BIND = {}

-- The count of a window that keeps members in the sorted set (rolling
-- entries, leases) from its values at v[k + 1...], 0 for other types.
local function zcount(ty, v, k)
  if ty == 1 then return v[k + 4] elseif ty == 5 then return v[k + 3] end
  return 0
end

-- The state's windows, read without a list: header, and per window its
-- id, type and values.
local function parse_any(blob)
  local h = {sunpack(HFMT, blob)}
  local n, pos = h[H_N], h[H_N + 1]
  local wids = #blob - 9 * n
  local wins = {}
  for k = 1, n do
    local wid = string.sub(blob, wids + 9 * k - 8, wids + 9 * k)
    local ty = string.byte(wid, 9) - 48
    local v = {sunpack(TFMT[ty], blob, pos)}
    pos = v[#v]
    v[#v] = nil
    wins[k] = {wid = wid, type = ty, v = v}
  end
  return h, wins
end

-- Fresh values of window w into S.
local function fresh(w, S)
  local o, ty = w.o, w.type
  if ty == 1 then
    S[o + 1], S[o + 2], S[o + 3], S[o + 4] = -1, 0, 0, 0
    S[o + 5], S[o + 6], S[o + 7] = 0, 0, 0
  elseif ty == 4 then
    S[o + 1], S[o + 2], S[o + 3], S[o + 4], S[o + 5] = 0, 0, 0, 0, w.limit
  elseif ty == 5 then
    S[o + 1], S[o + 2], S[o + 3], S[o + 4], S[o + 5] = -1, 0, 0, 0, 0
  else
    S[o + 1], S[o + 2], S[o + 3] = 0, 0, 0
  end
end

function BIND.any(e, lay, relayout)
  local blob = e.blob
  local h, wins = {NOLIST, 0, 0, 0, 0, 0, 0, 0}, {}
  if blob then h, wins = parse_any(blob) end
  local L = h[H_L]
  local drop = relayout and L ~= lay.id
  local S = {L, 0, h[H_T], h[H_SP], h[H_SS], h[H_V], h[H_XP], 0}
  local byid, inlay, fresh_w, clear, extras = {}, {}, {}, {}, {}
  for _, win in ipairs(wins) do byid[win.wid] = win end
  for k, w in ipairs(lay.w) do
    local wid = string.sub(lay.wids, 9 * k - 8, 9 * k)
    inlay[wid] = true
    local win = byid[wid]
    if win then
      for j = 1, TLEN[w.type] do S[w.o + j] = win.v[j] end
    else
      fresh(w, S)
      fresh_w[#fresh_w + 1] = w
    end
  end
  for _, win in ipairs(wins) do
    if not inlay[win.wid] then
      if not drop then extras[#extras + 1] = win
      elseif win.type == 1 or win.type == 5 then clear[#clear + 1] = win.v[1] end
    end
  end
  -- every slot a window still holds, or one being cleared, is taken
  local used, zn = {}, 0
  for _, w in ipairs(lay.w) do
    if (w.type == 1 or w.type == 5) and S[w.o + 1] >= 0 then used[S[w.o + 1]] = true end
    zn = zn + zcount(w.type, S, w.o)
  end
  for _, win in ipairs(extras) do
    if win.type == 1 or win.type == 5 then used[win.v[1]] = true end
    zn = zn + zcount(win.type, win.v, 0)
  end
  for _, slot in ipairs(clear) do used[slot] = true end
  for _, w in ipairs(fresh_w) do
    if w.type == 1 or w.type == 5 then
      local slot = 0
      while used[slot] do slot = slot + 1 end
      used[slot] = true
      S[w.o + 1] = slot
      if blob and rcall('ZCOUNT', e.zkey, sfmt('%d', slot * SLOTW),
                        sfmt('%d', slot * SLOTW + SLOTW - 1)) > 0 then
        clear[#clear + 1] = slot
      end
    end
  end
  e.S, e.seen, e.zn, e.znew = S, h[H_T], zn, zn == 0
  e.L = (drop or not blob or L == NOLIST) and lay.id or L
  e.extras = #extras > 0 and extras or NOEXTRAS
  e.clear = #clear > 0 and clear or false
end

return BIND
end)

-- Bind the entity to window list `lay` (a LIST entry), without writing
-- anything yet (a call may still answer "period", ops.lua).  The common
-- case: the state is exactly that list's (its id, canonical, its size),
-- one struct.unpack.  Otherwise (BIND.any) the windows are matched by
-- id: with relayout, an entity that followed another list keeps the
-- state of every window of the same type and name and drops the rest
-- (store_memory.c, entity_relayout); without, the list is only used to
-- read the state and windows it does not name are kept as they are
-- (e.extras).  E.commit then clears the sorted-set ranges of dropped
-- windows (and of a fresh window's slot, should state have vanished from
-- under it).
function E.bind(e, lay, relayout)
  e.lay = lay
  local blob = e.blob
  if blob and #blob == lay.size then
    local S = {sunpack(lay.fmt, blob)}
    if S[H_L] == lay.id and S[H_CANON] == 1 then
      -- the values as read, for E.flush to see whether any changed
      -- (cheaper than packing the state to compare it with the blob)
      e.S0 = {unpack(S, 1, lay.nv)}
      local zn, lw = 0, lay.w
      for i = 1, #lw do
        local w = lw[i]
        local ty = w.type
        if ty == 1 then zn = zn + S[w.o + 4] elseif ty == 5 then zn = zn + S[w.o + 3] end
      end
      e.S, e.L, e.seen, e.zn, e.znew = S, lay.id, S[H_T], zn, zn == 0
      return
    end
  end
  e.S0 = false
  BIND.any(e, lay, relayout)
end


function E.zadd(e, score, member)
  rcall('ZADD', e.zkey, sfmt('%d', score), member)
  e.zdirty = true
  e.zn = e.zn + 1
  UNDO.push(4, e.hk + 1, 0, member)
end

-- Add member unless it is there; true when added.
function E.zadd_nx(e, score, member)
  if rcall('ZADD', e.zkey, 'NX', sfmt('%d', score), member) == 0 then return false end
  e.zdirty = true
  e.zn = e.zn + 1
  UNDO.push(4, e.hk + 1, 0, member)
  return true
end

-- Remove member (whose score was `score`).
function E.zrem(e, score, member)
  rcall('ZREM', e.zkey, member)
  e.zdirty = true
  e.zn = e.zn - 1
  if e.zn <= 0 then e.znew = true end
  UNDO.push(3, e.hk + 1, score, member)
end

-- Remove every member with a score in [lo, hi] (members and scores as a
-- ZRANGEBYSCORE WITHSCORES reply, for the undo log); counted tells they
-- are members the windows' counts include.
function E.zrem_range(e, lo, hi, res, counted)
  if #res == 0 then return end
  rcall('ZREMRANGEBYSCORE', e.zkey, sfmt('%d', lo), sfmt('%d', hi))
  e.zdirty = true
  if counted then
    e.zn = e.zn - #res / 2
    if e.zn <= 0 then e.znew = true end
  end
  if UNDO.on then
    for i = 1, #res, 2 do UNDO.push(3, e.hk + 1, tonumber(res[i + 1]), res[i]) end
  end
end

function E.commit(e)
  local clear = e.clear
  if not clear then return end
  for _, slot in ipairs(clear) do
    local lo, hi = slot * SLOTW, slot * SLOTW + SLOTW - 1
    E.zrem_range(e, lo, hi, rcall('ZRANGEBYSCORE', e.zkey, sfmt('%d', lo),
                                  sfmt('%d', hi), 'WITHSCORES'), false)
  end
  e.clear = false
end

-- The state as a string: header and the bound list's windows, the
-- windows kept from another list, then every window's id.
local function pack(e)
  local S, lay, extras = e.S, e.lay, e.extras
  if not lay then
    -- no list: the header, the rest of the state as it was
    local rest = e.blob and string.sub(e.blob, HSIZE + 1) or ''
    return spack(HFMT, S[1], S[2], S[3], S[4], S[5], S[6], S[7], S[8]) .. rest
  end
  S[H_L] = e.L
  S[H_CANON] = (e.L == lay.id and extras == NOEXTRAS) and 1 or 0
  S[H_N] = lay.n + #extras
  local s = spack(lay.fmt, unpack(S, 1, lay.nv))
  if extras == NOEXTRAS then return s .. lay.wids end
  local parts, wids = {s}, {lay.wids}
  for _, win in ipairs(extras) do
    parts[#parts + 1] = spack(TFMT[win.type], unpack(win.v))
    wids[#wids + 1] = win.wid
  end
  return table.concat(parts) .. table.concat(wids)
end

-- Write back what changed.  u: the instant until which the state matters
-- (ops.lua, ttl_of); now: the script's instant.  The keys live an hour
-- past u: their expiry is set, an hour further still, only when the one
-- set last (the header's xp, in the script's time) falls short of that,
-- so most writes keep the TTL they have.  Returns the write counter
-- after the writes.
function E.flush(e, now, u)
  local S = e.S
  if not e.lay and not e.blob and e.seen <= 0 then return 0 end
  S[H_T] = e.seen
  local v = S[H_V]
  local S0, lay = e.S0, e.lay
  if S0 and e.L == lay.id and e.extras == NOEXTRAS then
    -- read in the list's exact format and written back in it: the state
    -- changed when a value did (pack would write the same header fields)
    if not e.zdirty then
      local same = true
      for i = 1, lay.nv do
        if S[i] ~= S0[i] then same = false; break end
      end
      if same then return v end
    end
  elseif pack(e) == e.blob and not e.zdirty then
    return v
  end
  local need = (u > now and u - now or 0) + MARGIN_MS
  local ttl
  if not e.blob or now + need > S[H_XP] then
    ttl = need + MARGIN_MS
    S[H_XP] = now + ttl
  end
  S[H_V] = v + 1
  local blob = pack(e)
  if ttl then rcall('SET', KEYS[e.hk], blob, 'PX', sfmt('%d', ttl))
  else rcall('SET', KEYS[e.hk], blob, 'KEEPTTL') end
  if e.blob then UNDO.push(1, e.hk, e.blob, '') else UNDO.push(2, e.hk, '', '') end
  -- the sorted set: its expiry with the state's, and set again when it
  -- was (re)created by this call
  if e.zn > 0 and (ttl or (e.zdirty and e.znew)) then
    rcall('PEXPIRE', e.zkey, sfmt('%d', ttl or S[H_XP] - now))
  end
  return v + 1
end

return E
end)()

-- ops.lua - the entry points of the Redis store's script, one per store
-- method (store.h), chosen by ARGV[1]:
--   check    decide, charge when allowed, remember the request id
--   settle   replace a reservation with the actual usage
--   usage    views of a subject's windows with recovery schedules
--   restore  re-apply a charge from the ledger (rebuild)
--   lookup   the answer to a request id recorded under this tag (a check
--            whose id turned out to be another tag's, store_redis.c)
--   void     take back a check that was admitted under an id that belongs
--            to another tag
-- Each mirrors the method of the same name in src/store/store_memory.c.
-- KEYS: [1] the request-id record qg:{TAG}:q:<RID> (usage: none), then
-- the member's state and sorted set, then the org's when it has one.
-- Argument layouts are built by src/store/redis_args.c; replies are
-- flat arrays redis_reply.c decodes.  The file ends with the entry, for
-- FCALL (a loaded Function library) and for EVALSHA alike.
local GROUP_NAMES = {lookup = true, settle = true, usage = true,
                     restore = true, void = true}
local OPS = (function()
local OPS = {}
-- ARGV[1] names the operation, ARGV[2] holds its numbers as big-endian
-- doubles (redis_args.c, qg__rs_addnums: one struct.unpack instead of a
-- tonumber each), ARGV[3...] its strings; num() and arg() read them in
-- order.
local A = {n = 0, s = 2}
local function num() local i = A.n + 1; A.n = i; return A.v[i] end
local function arg() local i = A.s + 1; A.s = i; return ARGV[i] end

local function time_now()
  local t = rcall('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The record of an admitted request, packed (struct): member and org
-- (hex, org "-" none), then numbers; unpacked, an array indexed by these.
local REC_FMT = '>ssddddddddddddddBBB'
local R_M, R_O, R_T0, R_EXP, R_RES, R_ACT, R_CHG, R_ANCHOR = 1, 2, 3, 4, 5, 6, 7, 8
local R_MODEL, R_PR, R_CI, R_CO, R_HEAD, R_PRICE, R_COST = 9, 10, 11, 12, 13, 14, 15
local R_CAPSTART, R_STATE, R_STATUS, R_LATE = 16, 17, 18, 19

local function rec_parse(s) return {sunpack(REC_FMT, s)} end
local function rec_pack(r) return spack(REC_FMT, unpack(r, 1, 19)) end

-- Time never runs backwards for a member and its org (store_memory.c,
-- gather): the instant every window judges at.
local function gather(m, o, now)
  if m.seen > now then now = m.seen end
  if o and o.seen > now then now = o.seen end
  m.seen = now
  if o then o.seen = now end
  return now
end

-- The decision input over the member's windows, then the org's; every
-- window judges at now.  (The member's anchor matters to calendar periods
-- only, which C computes.)
-- One table for every call, kept between calls (a loaded library's
-- state) and reset, not built (E.read says why): its arrays keep entries
-- past n from earlier calls, which nothing reads.
local DIN = {n = 0, w = {}, e = {}, model = 0, weight = 0, now = 0,
             soft = 0, price = 0, cap = 0, cap_end = 0, spent = false}
local function make_din(m, o, model, weight, now, anchor, rid)
  local din = DIN
  din.n, din.model, din.weight, din.now = 0, model, weight, now
  din.soft, din.price, din.cap, din.cap_end, din.spent = 0, 0, 0, 0, false
  for side = 1, 2 do
    local e = side == 1 and m or o
    if e then
      e.now, e.rid = now, rid
      if e.lay then
        local n, lw = din.n, e.lay.w
        for i = 1, #lw do
          din.w[n + i] = lw[i]
          din.e[n + i] = e
        end
        din.n = n + #lw
      end
    end
  end
  return din
end

-- Read the periods C passed for the calendar windows of the lists it
-- named (pnow: the instant it computed them for; "-1 -1": none there):
-- their starts and ends in one array, with the instant as .now.
local function read_periods()
  local v, k = A.v, A.n
  local n = v[k + 2]
  local p = {now = v[k + 1]}
  for i = 1, 2 * n do p[i] = v[k + 2 + i] end
  A.n = k + 2 + 2 * n
  return p
end

-- Hand the periods to the calendar windows of the entities bound to the
-- lists C computed them for (`ok_m`, `ok_o`); other windows get none.
local function set_periods(din, periods, m, o, ok_m, ok_o)
  local k = 0
  CALL.per = periods
  for i = 1, din.n do
    local w, e = din.w[i], din.e[i]
    if w.type == 2 and ((e == m and ok_m) or (e == o and ok_o)) then
      k = k + 1
      if not e.pp then e.pp = {} end
      e.pp[w.o] = k
    end
  end
end

-- The instant a window needs a period for that C did not pass, or nil.
local function period_needed(din, now)
  for i = 1, din.n do
    local w = din.w[i]
    if w.type == 2 and W[2].needs_period(w, din.e[i], now) then return now end
  end
  return nil
end

-- Read the member (KEYS 2) and its org (KEYS 4), bind both to their
-- window lists (moving them to these lists) and build the decision input
-- for amount at instant t.  Returns din, m, o and the instant decided at;
-- or nil and the 'period' reply when a calendar period must first be
-- recomputed by C (nothing written then).
local function prepare(org, ml, ol, model, amount, t, anchor, rid, periods)
  local m = E.read(2)
  local o = (org ~= '-') and E.read(4) or nil
  E.bind(m, layout(ml), true)
  if o then E.bind(o, layout(ol), true) end
  local now = gather(m, o, t)
  local din = make_din(m, o, model, amount, now, anchor, rid)
  set_periods(din, periods, m, o, true, true)
  local pn = period_needed(din, now)
  if pn then return nil, {'period', t, pn} end
  E.commit(m)
  if o then E.commit(o) end
  return din, m, o, now
end

-- payg: the member's spent amount in the cap period starting at start
-- (store_memory.c, spent_in): an amount of an earlier period is dropped.
local function spent_in(m, start)
  local S = m.S
  if S[H_SS] ~= start and start >= S[H_SS] then
    S[H_SP] = 0
    S[H_SS] = start
  end
  return {v = S[H_SP]}
end

-- Settle or restore: move the spent amount by delta when it is still the
-- period the charge was made in; it saturates and then keeps the bound.
local function spent_adjust(m, start, delta)
  local S = m.S
  if delta == 0 or S[H_SS] ~= start then return end
  local sp = S[H_SP]
  if delta > 0 then
    sp = U.money_add(sp, delta)
  elseif sp < MMAX then
    sp = sp + (delta < -MMAX and -MMAX or delta)
    if sp < 0 then sp = 0 end
  end
  S[H_SP] = sp
end

-- The instant until which an entity's state matters (its keys' expiry,
-- E.flush): the newest state of any window, the cap period of a spent
-- amount.
local function until_of(e)
  local u, S = 0, e.S
  if e.lay then
    for _, w in ipairs(e.lay.w) do
      local t = W[w.type].until_(w, S)
      if t > u then u = t end
    end
  end
  if S[H_SP] > 0 and S[H_SS] + 34 * 86400000 > u then u = S[H_SS] + 34 * 86400000 end
  return u
end

local function flush_all(m, o, now)
  local mv = E.flush(m, now, until_of(m))
  local ov = o and E.flush(o, now, until_of(o)) or 0
  return mv, ov
end

-- Append the views to reply r: the lists they follow, then per window
-- its numbers and recovery points.
local function put_views(r, din, m, o, with_recovery)
  local n = #r
  r[n + 1] = m.lay and m.lay.index or 0
  r[n + 2] = o and o.lay and o.lay.index or 0
  r[n + 3] = din.n
  D.views(din, r, with_recovery)
end

-- Append out's decision fields to reply r.
local function put_decision(r, out, replayed, decided_at, spent)
  local b = out.binding
  local n = #r
  r[n + 1] = out.outcome
  r[n + 2] = replayed
  r[n + 3] = out.weight
  r[n + 4] = decided_at
  r[n + 5] = out.retry_after
  r[n + 6] = b >= 1 and b - 1 or -1
  r[n + 7] = out.headroom
  r[n + 8] = out.overage
  r[n + 9] = out.cost
  r[n + 10] = out.price
  r[n + 11] = out.cap_reached
  r[n + 12] = spent
end

-- A new decision's reply ends with what takes it back (void): the write
-- counters after it and its undo log.  C needs it when the request id
-- turns out to be another tag's: the memory store then never touched
-- these entities, refusal or not.
local function put_undo(r, mv, ov)
  local n = #r
  r[n + 1] = mv
  r[n + 2] = ov
  r[n + 3] = UNDO.n / 4
  for i = 1, UNDO.n do r[n + 3 + i] = UNDO.list[i] end
end

-- ------------------------------------------------------------ replays

-- A remembered request id's answer (check, lookup): built when a call
-- meets one.
local RP = lazy(function()
local RP = {}

-- Read an entity through the list its state follows (else `cur`, when
-- given), without relayout; only its header when it has neither.
function RP.read_as_stored(hk, cur)
  local e = E.read(hk)
  local l = E.stored_layout(e) or cur
  if l then E.bind(e, l, false) else E.header(e) end
  return e, l
end

-- The original answer to a remembered request id: the reservation's
-- entities at now (their own lists, no relayout), views only.
function RP.replay(r, raw_now, ml, ol, periods)
  local cm = ml and layout(ml)
  local m, lm = RP.read_as_stored(2, cm)
  local o, lo, co
  if r[R_O] ~= '-' then
    co = ol and ol > 0 and layout(ol) or nil
    o, lo = RP.read_as_stored(4, co)
  end
  local now = gather(m, o, raw_now)
  local din = make_din(m, o, r[R_MODEL], r[R_RES], now, r[R_ANCHOR], '')
  if periods then
    set_periods(din, periods, m, o, lm ~= nil and lm == cm, lo ~= nil and lo == co)
    local pn = period_needed(din, now)
    if pn then return {'period', raw_now, pn} end
  end
  E.commit(m)
  if o then E.commit(o) end
  local head = r[R_HEAD]
  local out = {outcome = 1, weight = r[R_RES], retry_after = 0, binding = -1,
               headroom = head, overage = D.overage_of(r[R_RES], head),
               cost = r[R_COST], price = r[R_PRICE], cap_reached = 0}
  local reply = {'ok'}
  put_decision(reply, out, 1, r[R_T0], m.S[H_SP])
  put_views(reply, din, m, o, false)
  flush_all(m, o, now)
  return reply
end

function RP.lookup()
  local now, member = num(), arg()
  local rec = rcall('GET', KEYS[1])
  if not rec then return {'absent'} end
  local r = rec_parse(rec)
  if r[R_M] ~= member then return {'einval'} end
  if now == 0 then now = time_now() end
  return RP.replay(r, now, nil, nil, nil)
end

return RP
end)

-- -------------------------------------------------------------- check

-- {'ok'} with room for 48 values: a check's reply (two windows: 37) is
-- filled at once instead of grown, which in Lua moves the table at every
-- power of two.  The nils are room, not values: # counts only what was
-- appended.
local function new_reply()
  return {'ok', nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil,
          nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil,
          nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil,
          nil, nil, nil, nil, nil, nil, nil, nil, nil, nil}
end

-- The check's decision, one table for every call (as DIN).
local OUT = {outcome = 0, binding = -1, weight = 0, retry_after = 0,
             overage = 0, cost = 0, price = 0, headroom = -1, cap_reached = 0}

function OPS.check()
  -- the numbers by position, not through num(): its 21 calls were 189 of
  -- a check's 1,737 Lua instructions (redis_args.c, qg__rs_args_check,
  -- the order; read_periods goes on from A.n)
  local v = A.v
  local raw_now, weight, model = v[1], v[2], v[3]
  local ml, ol, anchor = v[4], v[5], v[6]
  local rid, member, org = ARGV[3], ARGV[4], ARGV[5]
  local lease_ttl, rid_ttl = v[7], v[8]
  local soft, price, cap, cap_start, cap_end = v[9], v[10], v[11], v[12], v[13]
  local pr, ci, co = v[14], v[15], v[16]
  local check_cap = v[17]
  A.n = 17
  local periods = read_periods()
  if raw_now == 0 then raw_now = time_now() end
  local rec = rcall('GET', KEYS[1])
  if rec then
    local r = rec_parse(rec)
    if r[R_M] ~= member then return {'einval'} end
    return RP.replay(r, raw_now, ml, ol, periods)
  end
  -- a cap period C computed for another instant (its clock, not Redis's)
  if check_cap ~= 0 and soft ~= 0 and (raw_now < cap_start or raw_now >= cap_end) then
    return {'period', raw_now, raw_now}
  end
  UNDO.on = true
  local din, m, o, now = prepare(org, ml, ol, model, weight, raw_now, anchor,
                                 rid, periods)
  if not din then return m end
  if soft ~= 0 then
    din.soft, din.price, din.cap, din.cap_end = soft, price, cap, cap_end
    din.spent = spent_in(m, cap_start)
  end
  local out = OUT        -- D.decide sets every other field
  out.outcome, out.binding = 0, -1
  local rc = D.decide(din, out)
  if din.spent then m.S[H_SP] = din.spent.v end
  if rc ~= RC_OK then
    local reply = {'err', rc}
    put_undo(reply, flush_all(m, o, now))
    return reply
  end
  local reply = new_reply()
  put_decision(reply, out, 0, now, m.S[H_SP])
  put_views(reply, din, m, o, out.outcome ~= 1)
  if out.outcome == 1 then
    rcall('SET', KEYS[1], spack(REC_FMT, member, org, now, now + lease_ttl,
                                weight, 0, weight, anchor, model, pr, ci, co,
                                out.headroom, out.price, out.cost, cap_start,
                                1, 0, 0), 'PX', sfmt('%d', rid_ttl))
  end
  put_undo(reply, flush_all(m, o, now))
  return reply
end

-- ------------------------------------------------------------- settle

local ST = lazy(function()
local ST = {}

-- The weight of the reported tokens (weights.c): in doubles while both
-- products are exact (below 2^52, so is their sum), else in bignums; over
-- the bound it is AMAX + 1 (the settle charges the bound).
local function weight_milli(pr, ci, co, it, ot)
  local a, b = it * ci, ot * co
  local q, r
  if a >= 0 and b >= 0 and a < TWO52 and b < TWO52 then
    q, r = U.idiv(a + b, 1000000)
  else
    local nano = BN.add(BN.mul(BN.new(it), BN.new(ci)), BN.mul(BN.new(ot), BN.new(co)))
    q, r = BN.divmod(nano, 1000000)
    if q == math.huge then return AMAX + 1 end
  end
  if r > 0 then q = q + 1 end
  q = q + pr
  return q > AMAX and AMAX + 1 or q
end

local function settle_reply(r, replayed)
  return {'ok', replayed, r[R_LATE], r[R_RES], r[R_ACT], r[R_CHG], r[R_T0],
          r[R_STATUS], D.overage_of(r[R_CHG], r[R_HEAD]), r[R_COST]}
end

function ST.settle()
  local v = A.v
  local now, status, it, ot, weight = v[1], v[2], v[3], v[4], v[5]
  local no_charge, has_member, member = v[6], v[7], ARGV[3]
  local keys_member, keys_org, rid = ARGV[4], ARGV[5], ARGV[6]
  local rec = rcall('GET', KEYS[1])
  if not rec then return {'notfound'} end
  local r = rec_parse(rec)
  if has_member ~= 0 and r[R_M] ~= member then return {'einval'} end
  if r[R_M] ~= keys_member or r[R_O] ~= keys_org then return {'moved', r[R_M], r[R_O]} end
  if r[R_STATE] == 2 then return settle_reply(r, 1) end
  if now == 0 then now = time_now() end
  local actual, res = nil, r[R_RES]
  if no_charge ~= 0 then
    actual = 0
  elseif r[R_PR] >= 0 then
    actual = weight_milli(r[R_PR], r[R_CI], r[R_CO], it, ot)
    if actual > AMAX then actual = AMAX end
  else
    actual = weight >= 0 and weight or res
  end
  local delta = actual - res
  local late = now >= r[R_EXP]
  -- a reservation whose lease expired is final: never refunded
  if late and delta < 0 then delta = 0 end
  local cost = D.overage_cost(D.overage_of(res + delta, r[R_HEAD]), r[R_PRICE])
  local m = E.read(2)
  local o = (r[R_O] ~= '-') and E.read(4) or nil
  local lm, lo = E.stored_layout(m), o and E.stored_layout(o)
  if m.blob and not lm then return {'layout'} end
  if o and o.blob and not lo then return {'layout'} end
  if lm then E.bind(m, lm, false) else E.header(m) end
  if o then if lo then E.bind(o, lo, false) else E.header(o) end end
  local tnow = gather(m, o, now)
  local din = make_din(m, o, r[R_MODEL], res, tnow, r[R_ANCHOR], rid)
  E.commit(m)
  if o then E.commit(o) end
  D.settle(din, r[R_T0], delta)
  spent_adjust(m, r[R_CAPSTART], cost - r[R_COST])
  r[R_COST] = cost
  r[R_ACT] = actual
  r[R_CHG] = res + delta
  r[R_STATUS] = status
  r[R_STATE] = 2
  r[R_LATE] = late and 1 or 0
  rcall('SET', KEYS[1], rec_pack(r), 'KEEPTTL')
  flush_all(m, o, tnow)
  return settle_reply(r, 0)
end

return ST
end)

-- ---------------------------------------------- usage, restore, void

local OT = lazy(function()
local OT = {}

function OT.usage()
  local now, ml, ol, anchor, cap_start = num(), num(), num(), num(), num()
  local periods = read_periods()
  if now == 0 then now = time_now() end
  local m = E.read(2)
  local o = (ol > 0) and E.read(4) or nil
  E.bind(m, layout(ml), true)
  if o then E.bind(o, layout(ol), true) end
  now = gather(m, o, now)
  local din = make_din(m, o, -1, 0, now, anchor, '')
  set_periods(din, periods, m, o, true, true)
  local pn = period_needed(din, now)
  if pn then return {'period', now, pn} end
  E.commit(m)
  if o then E.commit(o) end
  local spent = 0
  if cap_start >= 0 and m.S[H_SS] == cap_start then spent = m.S[H_SP] end
  local reply = {'ok', spent}
  put_views(reply, din, m, o, true)
  flush_all(m, o, now)
  return reply
end

function OT.restore()
  local at, charged, reserved, model = num(), num(), num(), num()
  local ml, ol, anchor = num(), num(), num()
  local settled, status, head, price, cost, cap_start = num(), num(), num(), num(), num(), num()
  local charge_only, rid, member, org = num(), arg(), arg(), arg()
  local lease_ttl, rid_ttl = num(), num()
  local pr, ci, co = num(), num(), num()
  local periods = read_periods()
  if charge_only == 0 and rcall('EXISTS', KEYS[1]) == 1 then
    return {'ok', RC_OK}          -- already restored
  end
  local din, m, o, now = prepare(org, ml, ol, model, charged, at, anchor, rid,
                                 periods)
  if not din then return m end
  local rc = RC_OK
  for i = 1, din.n do
    local w = din.w[i]
    -- a settled request no longer holds a concurrency slot
    if U.applies(w, model) and not (w.type == 5 and settled ~= 0) then
      rc = W[w.type].charge(w, din.e[i], U.amount(w, charged))
      if rc ~= RC_OK then break end
    end
  end
  if rc == RC_OK and cost > 0 then
    spent_in(m, cap_start)
    spent_adjust(m, cap_start, cost)
  end
  flush_all(m, o, now)
  if rc == RC_OK and charge_only == 0 then
    local state, act, st = 1, 0, 0
    if settled ~= 0 then state, act, st = 2, charged, status end
    rcall('SET', KEYS[1], spack(REC_FMT, member, org, now, now + lease_ttl,
                                reserved, act, charged, anchor, model, pr,
                                ci, co, head, price, cost, cap_start, state,
                                st, 0), 'PX', sfmt('%d', rid_ttl))
  end
  return {'ok', rc}
end

-- Apply an undo log (check's reply: entries of four) in reverse.
local function apply_undo(list, n)
  for i = n - 3, 1, -4 do
    local op, k, a, b = tonumber(list[i]), tonumber(list[i + 1]), list[i + 2], list[i + 3]
    if op == 1 then rcall('SET', KEYS[k], a, 'KEEPTTL')
    elseif op == 2 then rcall('DEL', KEYS[k])
    elseif op == 3 then rcall('ZADD', KEYS[k], a, b)
    else rcall('ZREM', KEYS[k], b) end
  end
end

-- The write counter of the entity whose state is KEYS[hk] (0: none).
local function version_of(hk)
  local blob = rcall('GET', KEYS[hk])
  if not blob then return 0 end
  local _, _, _, _, _, v = sunpack(HFMT, blob)
  return v
end

-- Set the write counter of an existing state (its bytes 42 to 49).
local function set_version(hk, v)
  if rcall('EXISTS', KEYS[hk]) == 1 then
    rcall('SETRANGE', KEYS[hk], 41, spack('>d', v))
  end
end

function OT.void()
  local mv, ov, n, rid = num(), num(), num(), arg()
  local list = {}
  for i = 1, 4 * n do list[i] = arg() end
  local rec = rcall('GET', KEYS[1])
  local has_org = #KEYS == 5
  local cm = version_of(2)
  local co = has_org and version_of(4) or 0
  if cm == mv and co == ov then
    -- nothing touched these entities since: restore them exactly
    apply_undo(list, 4 * n)
    set_version(2, mv + 1)
    if has_org then set_version(4, ov + 1) end
    rcall('DEL', KEYS[1])
    return {'ok', 1}
  end
  -- a refusal: what it changed was looking (pruning, clamping), and
  -- others have looked since
  if not rec then return {'ok', 0} end
  local r = rec_parse(rec)
  -- others decided meanwhile: take the charge back as decide.c's
  -- rollback does (every window by its amount, the lease freed)
  local m = RP.read_as_stored(2, nil)
  local o = has_org and RP.read_as_stored(4, nil) or nil
  local now = gather(m, o, r[R_T0])
  local din = make_din(m, o, r[R_MODEL], r[R_RES], now, r[R_ANCHOR], rid)
  E.commit(m)
  if o then E.commit(o) end
  for i = 1, din.n do
    local w = din.w[i]
    if U.applies(w, r[R_MODEL]) then
      local e = din.e[i]
      if w.type == 5 then W[5].release(w, e)
      else
        local d = -U.amount(w, r[R_RES])
        if d ~= 0 then W[w.type].adjust(w, e, r[R_T0], d) end
      end
    end
  end
  spent_adjust(m, r[R_CAPSTART], -r[R_COST])
  flush_all(m, o, now)
  rcall('DEL', KEYS[1])
  return {'ok', 2}
end

return OT
end)

-- Each operation, from the group that holds it (the check's is always
-- there; the others are built when called).
local GROUP = {lookup = RP, settle = ST, usage = OT, restore = OT, void = OT}

-- The struct format of n numbers, made once per n (kept across calls
-- when the library is a loaded function).
local NUMS_FMT = {}

function OPS.run(op)
  local nb = #ARGV[2] / 8
  local fmt = NUMS_FMT[nb]
  if not fmt then
    fmt = '>' .. string.rep('d', nb)
    NUMS_FMT[nb] = fmt
  end
  A.n, A.s = 0, 2
  A.v = {sunpack(fmt, ARGV[2])}
  if op == 'check' then return OPS.check() end
  return GROUP[op][op]()
end

return OPS
end)()

-- One call: KEYS and ARGV are the call's (the preamble's locals, set by
-- the entry below).  A library loaded as a Redis Function keeps its
-- state between calls, so what a call changes outside its entities is
-- put back first: the argument cursor (OPS.run), the undo log and the
-- calendar periods.  What stays is what a call only builds: the window
-- lists (layout), the window types' functions (W), the lazy groups.
local function qg_main()
  UNDO.on, UNDO.n = false, 0
  CALL.per = nil
  local op = ARGV[1]
  if not (op == 'check' or GROUP_NAMES[op]) or not ARGV[2] then
    return redis.error_reply('qg: unknown operation ' .. tostring(op))
  end
  return OPS.run(op)
end

-- The body ends by handing its entry out (the preamble opened the body
-- as the function BODY, redis_script.c).
return qg_main
end

-- The entry.  As a Function library (FUNCTION LOAD, then FCALL by the
-- name FNAME the preamble sets) the library registers the function and
-- runs its body once, at the function's first call (a library's load
-- may use only a few globals: setmetatable is not among them); as an
-- EVAL script (servers without Functions) the body runs at every call.
-- The function's description is LOADED, the instant of the load
-- (redis_script.c): FUNCTION LIST shows it, and an instance deletes the
-- libraries of other rules versions nobody loaded for a day.
if FNAME then
  local main
  redis.register_function{function_name = FNAME, description = LOADED,
    callback = function(keys, args)
      KEYS, ARGV = keys, args
      if not main then main = BODY() end
      return main()
    end}
  return
end
return BODY()()

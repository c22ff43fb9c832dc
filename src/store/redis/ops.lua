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
-- the member's hash and sorted set, then the org's when it has one.
-- Argument layouts are built by src/store/redis_script.c; replies are
-- flat arrays it decodes.
local OPS = {}
-- ARGV[1] names the operation, ARGV[2] holds its numbers as big-endian
-- doubles (redis_args.c, qg__rs_addnums: one struct.unpack instead of a
-- tonumber each), ARGV[3...] its strings; num() and arg() read them in
-- order.
local A = {n = 0, s = 2}
local function num() local i = A.n + 1; A.n = i; return A.v[i] end
local function arg() local i = A.s + 1; A.s = i; return ARGV[i] end

local function time_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The record of an admitted request, packed (struct): member and org
-- (hex, org "-" none), then numbers.
local REC_FIELDS = {'m', 'o', 't0', 'exp', 'res', 'act', 'chg', 'anchor',
                    'model', 'pr', 'ci', 'co', 'head', 'price', 'cost',
                    'capstart', 'state', 'status', 'late'}
local REC_FMT = '>ssddddddddddddddBBB'

local function rec_parse(s)
  local v, r = {struct.unpack(REC_FMT, s)}, {}
  for i, k in ipairs(REC_FIELDS) do r[k] = v[i] end
  return r
end

local function rec_pack(r)
  return struct.pack(REC_FMT, r.m, r.o, r.t0, r.exp, r.res, r.act, r.chg,
                     r.anchor, r.model, r.pr, r.ci, r.co, r.head, r.price,
                     r.cost, r.capstart, r.state, r.status, r.late)
end

-- Time never runs backwards for a member and its org (store_memory.c,
-- gather): the instant every window judges at.
local function gather(m, o, now)
  if m.seen > now then now = m.seen end
  if o and o.seen > now then now = o.seen end
  m.seen = now
  if o then o.seen = now end
  return now
end

-- The decision input over the member's windows, then the org's.
local function make_din(m, o, model, weight, now, anchor, rid)
  local din = {n = 0, w = {}, st = {}, org = {}, model = model,
               weight = weight, soft = 0, price = 0, cap = 0, cap_end = 0,
               ctx = {[0] = {now = now, anchor = anchor, rid = rid},
                      [1] = {now = now, anchor = 0, rid = rid}}}
  local function add(e, side)
    if not e or not e.lay then return end
    for i, w in ipairs(e.lay.w) do
      din.n = din.n + 1
      din.w[din.n] = w
      din.st[din.n] = e.st[i]
      din.org[din.n] = side
    end
  end
  add(m, 0)
  add(o, 1)
  return din
end

-- Read the periods C passed for the calendar windows of the lists it
-- named (pnow: the instant it computed them for; "-1 -1": none there).
local function read_periods()
  local pnow, n = num(), num()
  local p = {}
  for i = 1, n do
    local s, e = num(), num()
    p[i] = {s = s, e = e, bad = s < 0, now = pnow}
  end
  return p
end

-- Hand the periods to the calendar windows of the entities bound to the
-- lists C computed them for (`ok_m`, `ok_o`); other windows get none.
local function set_periods(din, periods, ok_m, ok_o)
  local k = 0
  for i = 1, din.n do
    if din.w[i].type == 2 then
      local ok = (din.org[i] == 0) and ok_m or ((din.org[i] == 1) and ok_o)
      if ok then
        k = k + 1
        din.st[i].pp = periods[k]
      else
        din.st[i].pp = nil
      end
    end
  end
end

-- The instant a window needs a period for that C did not pass, or nil.
local function period_needed(din, now)
  for i = 1, din.n do
    if din.w[i].type == 2 and CAL.needs_period(din.st[i], now) then return now end
  end
  return nil
end

-- payg: the member's spent amount in the cap period starting at start
-- (store_memory.c, spent_in): an amount of an earlier period is dropped.
local function spent_in(m, start)
  local ss = tonumber(m.h.ss or '0')
  if ss ~= start and start >= ss then
    m.h.sp = '0'
    m.h.ss = U.fmt(start)
  end
  return {v = tonumber(m.h.sp or '0')}
end

-- Settle or restore: move the spent amount by delta when it is still the
-- period the charge was made in; it saturates and then keeps the bound.
local function spent_adjust(m, start, delta)
  if delta == 0 or tonumber(m.h.ss or '0') ~= start then return end
  local sp = tonumber(m.h.sp or '0')
  if delta > 0 then
    sp = U.money_add(sp, delta)
  elseif sp < MMAX then
    sp = sp + (delta < -MMAX and -MMAX or delta)
    if sp < 0 then sp = 0 end
  end
  m.h.sp = U.fmt(sp)
end

-- How long an entity's keys must live: until its newest state stops
-- mattering, plus a margin (real time; now is the script's instant).
local function ttl_of(e, now)
  local u = 0
  if e.lay then
    for i, w in ipairs(e.lay.w) do
      local t = W[w.type].until_(w, e.st[i])
      if t > u then u = t end
    end
  end
  local sp, ss = tonumber(e.h.sp or '0'), tonumber(e.h.ss or '0')
  if sp > 0 and ss + 34 * 86400000 > u then u = ss + 34 * 86400000 end
  local ttl = u - now
  if ttl < 0 then ttl = 0 end
  return ttl + MARGIN_MS
end

local function flush_all(m, o, now)
  local mv = E.flush(m, ttl_of(m, now))
  local ov = o and E.flush(o, ttl_of(o, now)) or 0
  return mv, ov
end

-- Append the views to reply r: the lists they follow, then per window
-- its numbers and recovery points.
local function put_views(r, m, o, views)
  r[#r + 1] = m.lay and m.lay.index or 0
  r[#r + 1] = o and o.lay and o.lay.index or 0
  r[#r + 1] = #views
  for _, v in ipairs(views) do
    r[#r + 1] = v.limit
    r[#r + 1] = v.used
    r[#r + 1] = v.remaining
    r[#r + 1] = v.reset
    r[#r + 1] = #v.rec
    for _, p in ipairs(v.rec) do
      r[#r + 1] = p[1]
      r[#r + 1] = p[2]
    end
  end
end

-- Append out's decision fields and views to reply r.
local function put_decision(r, out, replayed, decided_at, spent, m, o)
  local b = out.binding
  r[#r + 1] = out.outcome
  r[#r + 1] = replayed
  r[#r + 1] = out.weight
  r[#r + 1] = decided_at
  r[#r + 1] = out.retry_after
  r[#r + 1] = b >= 1 and b - 1 or -1
  r[#r + 1] = out.headroom
  r[#r + 1] = out.overage
  r[#r + 1] = out.cost
  r[#r + 1] = out.price
  r[#r + 1] = out.cap_reached
  r[#r + 1] = spent
  put_views(r, m, o, out.views)
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

-- The original answer to a remembered request id: the reservation's
-- entities at now (their own lists, no relayout), views only.
local function replay(r, raw_now, ml, ol, periods)
  local m = E.load(2)
  local o = (r.o ~= '-') and E.load(4) or nil
  local cm = ml and layout(ml)
  local co = o and ol and ol > 0 and layout(ol) or nil
  local lm = E.stored_layout(m) or cm
  local lo = o and (E.stored_layout(o) or co)
  if lm then E.bind(m, lm, false) end
  if lo then E.bind(o, lo, false) end
  local now = gather(m, o, raw_now)
  local din = make_din(m, o, r.model, r.res, now, r.anchor, '')
  if periods then
    set_periods(din, periods, lm ~= nil and lm == cm, lo ~= nil and lo == co)
    local pn = period_needed(din, now)
    if pn then return {'period', raw_now, pn} end
  end
  E.commit(m)
  if o then E.commit(o) end
  local out = {outcome = 1, weight = r.res, retry_after = 0, binding = -1,
               headroom = r.head, overage = D.overage_of(r.res, r.head),
               cost = r.cost, price = r.price, cap_reached = 0}
  D.views(din, out, false)
  local spent = tonumber(m.h.sp or '0')
  flush_all(m, o, now)
  local reply = {'ok'}
  put_decision(reply, out, 1, r.t0, spent, m, o)
  return reply
end

function OPS.check()
  local raw_now, weight, model = num(), num(), num()
  local ml, ol, anchor = num(), num(), num()
  local rid, member, org = arg(), arg(), arg()
  local lease_ttl, rid_ttl = num(), num()
  local soft, price, cap, cap_start, cap_end = num(), num(), num(), num(), num()
  local pr, ci, co = num(), num(), num()
  local check_cap = num()
  local periods = read_periods()
  if raw_now == 0 then raw_now = time_now() end
  local rec = redis.call('GET', KEYS[1])
  if rec then
    local r = rec_parse(rec)
    if r.m ~= member then return {'einval'} end
    return replay(r, raw_now, ml, ol, periods)
  end
  -- a cap period C computed for another instant (its clock, not Redis's)
  if check_cap ~= 0 and soft ~= 0 and (raw_now < cap_start or raw_now >= cap_end) then
    return {'period', raw_now, raw_now}
  end
  UNDO.on = true
  local m = E.load(2, layout(ml))
  local o = (org ~= '-') and E.load(4, layout(ol)) or nil
  E.bind(m, layout(ml), true)
  if o then E.bind(o, layout(ol), true) end
  local now = gather(m, o, raw_now)
  local din = make_din(m, o, model, weight, now, anchor, rid)
  set_periods(din, periods, true, true)
  local pn = period_needed(din, now)
  if pn then return {'period', raw_now, pn} end
  E.commit(m)
  if o then E.commit(o) end
  if soft ~= 0 then
    din.soft, din.price, din.cap, din.cap_end = soft, price, cap, cap_end
    din.spent = spent_in(m, cap_start)
  end
  local out = {}
  local rc = D.decide(din, out)
  if din.spent then m.h.sp = U.fmt(din.spent.v) end
  if rc ~= RC_OK then
    local reply = {'err', rc}
    put_undo(reply, flush_all(m, o, now))
    return reply
  end
  if out.outcome == 1 then
    local r = {m = member, o = org, t0 = now, exp = now + lease_ttl,
               res = weight, act = 0, chg = weight, anchor = anchor,
               model = model, pr = pr, ci = ci, co = co,
               head = out.headroom, price = out.price, cost = out.cost,
               capstart = cap_start, state = 1, status = 0, late = 0}
    redis.call('SET', KEYS[1], rec_pack(r), 'PX', rid_ttl)
  end
  local spent = tonumber(m.h.sp or '0')
  local mv, ov = flush_all(m, o, now)
  local reply = {'ok'}
  put_decision(reply, out, 0, now, spent, m, o)
  put_undo(reply, mv, ov)
  return reply
end

-- The weight of the reported tokens (weights.c), in bignums; over the
-- bound it is AMAX + 1 (the settle charges the bound).
local function weight_milli(pr, ci, co, it, ot)
  local nano = BN.add(BN.mul(BN.new(it), BN.new(ci)), BN.mul(BN.new(ot), BN.new(co)))
  local q, r = BN.divmod(nano, 1000000)
  if q == math.huge then return AMAX + 1 end
  if r > 0 then q = q + 1 end
  q = q + pr
  return q > AMAX and AMAX + 1 or q
end

local function settle_reply(r, replayed)
  return {'ok', replayed, r.late, r.res, r.act, r.chg, r.t0, r.status,
          D.overage_of(r.chg, r.head), r.cost}
end

function OPS.settle()
  local now, status, it, ot, weight = num(), num(), num(), num(), num()
  local no_charge, has_member, member = num(), num(), arg()
  local keys_member, keys_org, rid = arg(), arg(), arg()
  local rec = redis.call('GET', KEYS[1])
  if not rec then return {'notfound'} end
  local r = rec_parse(rec)
  if has_member ~= 0 and r.m ~= member then return {'einval'} end
  if r.m ~= keys_member or r.o ~= keys_org then return {'moved', r.m, r.o} end
  if r.state == 2 then return settle_reply(r, 1) end
  if now == 0 then now = time_now() end
  local actual
  if no_charge ~= 0 then
    actual = 0
  elseif r.pr >= 0 then
    actual = weight_milli(r.pr, r.ci, r.co, it, ot)
    if actual > AMAX then actual = AMAX end
  else
    actual = weight >= 0 and weight or r.res
  end
  local delta = actual - r.res
  local late = now >= r.exp
  -- a reservation whose lease expired is final: never refunded
  if late and delta < 0 then delta = 0 end
  local cost = D.overage_cost(D.overage_of(r.res + delta, r.head), r.price)
  local m = E.load(2)
  local o = (r.o ~= '-') and E.load(4) or nil
  local lm, lo = E.stored_layout(m), o and E.stored_layout(o)
  if m.exists and not lm then return {'layout'} end
  if o and o.exists and not lo then return {'layout'} end
  if lm then E.bind(m, lm, false) end
  if lo then E.bind(o, lo, false) end
  local tnow = gather(m, o, now)
  local din = make_din(m, o, r.model, r.res, tnow, r.anchor, rid)
  E.commit(m)
  if o then E.commit(o) end
  D.settle(din, r.t0, delta)
  spent_adjust(m, r.capstart, cost - r.cost)
  r.cost = cost
  r.act = actual
  r.chg = r.res + delta
  r.status = status
  r.state = 2
  r.late = late and 1 or 0
  redis.call('SET', KEYS[1], rec_pack(r), 'KEEPTTL')
  flush_all(m, o, tnow)
  return settle_reply(r, 0)
end

function OPS.usage()
  local now, ml, ol, anchor, cap_start = num(), num(), num(), num(), num()
  local periods = read_periods()
  if now == 0 then now = time_now() end
  local m = E.load(2, layout(ml))
  local o = (ol > 0) and E.load(4, layout(ol)) or nil
  E.bind(m, layout(ml), true)
  if o then E.bind(o, layout(ol), true) end
  now = gather(m, o, now)
  local din = make_din(m, o, -1, 0, now, anchor, '')
  set_periods(din, periods, true, true)
  local pn = period_needed(din, now)
  if pn then return {'period', now, pn} end
  E.commit(m)
  if o then E.commit(o) end
  local out = {}
  D.views(din, out, true)
  local spent = 0
  if cap_start >= 0 and tonumber(m.h.ss or '0') == cap_start then
    spent = tonumber(m.h.sp or '0')
  end
  flush_all(m, o, now)
  local reply = {'ok', spent}
  put_views(reply, m, o, out.views)
  return reply
end

function OPS.restore()
  local at, charged, reserved, model = num(), num(), num(), num()
  local ml, ol, anchor = num(), num(), num()
  local settled, status, head, price, cost, cap_start = num(), num(), num(), num(), num(), num()
  local charge_only, rid, member, org = num(), arg(), arg(), arg()
  local lease_ttl, rid_ttl = num(), num()
  local pr, ci, co = num(), num(), num()
  local periods = read_periods()
  if charge_only == 0 and redis.call('EXISTS', KEYS[1]) == 1 then
    return {'ok', RC_OK}          -- already restored
  end
  local m = E.load(2, layout(ml))
  local o = (org ~= '-') and E.load(4, layout(ol)) or nil
  E.bind(m, layout(ml), true)
  if o then E.bind(o, layout(ol), true) end
  local now = gather(m, o, at)
  local din = make_din(m, o, model, charged, now, anchor, rid)
  set_periods(din, periods, true, true)
  local pn = period_needed(din, now)
  if pn then return {'period', at, pn} end
  E.commit(m)
  if o then E.commit(o) end
  local rc = RC_OK
  for i = 1, din.n do
    local w = din.w[i]
    -- a settled request no longer holds a concurrency slot
    if U.applies(w, model) and not (w.type == 5 and settled ~= 0) then
      rc = W[w.type].charge(w, din.st[i], din.ctx[din.org[i]], U.amount(w, charged))
      if rc ~= RC_OK then break end
    end
  end
  if rc == RC_OK and cost > 0 then
    spent_in(m, cap_start)
    spent_adjust(m, cap_start, cost)
  end
  flush_all(m, o, now)
  if rc == RC_OK and charge_only == 0 then
    local r = {m = member, o = org, t0 = now, exp = now + lease_ttl,
               res = reserved, act = 0, chg = charged, anchor = anchor,
               model = model, pr = pr, ci = ci, co = co, head = head,
               price = price, cost = cost, capstart = cap_start, state = 1,
               status = 0, late = 0}
    if settled ~= 0 then
      r.state = 2
      r.act = charged
      r.status = status
    end
    redis.call('SET', KEYS[1], rec_pack(r), 'PX', rid_ttl)
  end
  return {'ok', rc}
end

function OPS.lookup()
  local now, member = num(), arg()
  local rec = redis.call('GET', KEYS[1])
  if not rec then return {'absent'} end
  local r = rec_parse(rec)
  if r.m ~= member then return {'einval'} end
  if now == 0 then now = time_now() end
  return replay(r, now, nil, nil, nil)
end

-- Apply an undo log (check's reply: entries of four) in reverse.
local function apply_undo(list, n)
  for i = n - 3, 1, -4 do
    local op, k, a, b = tonumber(list[i]), tonumber(list[i + 1]), list[i + 2], list[i + 3]
    if op == 1 then redis.call('HSET', KEYS[k], a, b)
    elseif op == 2 then redis.call('HDEL', KEYS[k], a)
    elseif op == 3 then redis.call('ZADD', KEYS[k], a, b)
    else redis.call('ZREM', KEYS[k], b) end
  end
end

function OPS.void()
  local mv, ov, n, rid = num(), num(), num(), arg()
  local list = {}
  for i = 1, 4 * n do list[i] = arg() end
  local rec = redis.call('GET', KEYS[1])
  local has_org = #KEYS == 5
  local cm = tonumber(redis.call('HGET', KEYS[2], 'v') or '0')
  local co = has_org and tonumber(redis.call('HGET', KEYS[4], 'v') or '0') or 0
  if cm == mv and co == ov then
    -- nothing touched these entities since: restore them exactly
    apply_undo(list, 4 * n)
    if redis.call('EXISTS', KEYS[2]) == 1 then redis.call('HSET', KEYS[2], 'v', U.fmt(mv + 1)) end
    if has_org and redis.call('EXISTS', KEYS[4]) == 1 then
      redis.call('HSET', KEYS[4], 'v', U.fmt(ov + 1))
    end
    redis.call('DEL', KEYS[1])
    return {'ok', 1}
  end
  -- a refusal: what it changed was looking (pruning, clamping), and
  -- others have looked since
  if not rec then return {'ok', 0} end
  local r = rec_parse(rec)
  -- others decided meanwhile: take the charge back as decide.c's
  -- rollback does (every window by its amount, the lease freed)
  local m = E.load(2)
  local o = has_org and E.load(4) or nil
  local lm, lo = E.stored_layout(m), o and E.stored_layout(o)
  if lm then E.bind(m, lm, false) end
  if lo then E.bind(o, lo, false) end
  local now = gather(m, o, r.t0)
  local din = make_din(m, o, r.model, r.res, now, r.anchor, rid)
  E.commit(m)
  if o then E.commit(o) end
  for i = 1, din.n do
    local w = din.w[i]
    if U.applies(w, r.model) then
      local ctx = din.ctx[din.org[i]]
      if w.type == 5 then CONC.release(w, din.st[i], ctx)
      else
        local d = -U.amount(w, r.res)
        if d ~= 0 then W[w.type].adjust(w, din.st[i], ctx, r.t0, d) end
      end
    end
  end
  spent_adjust(m, r.capstart, -r.cost)
  flush_all(m, o, now)
  redis.call('DEL', KEYS[1])
  return {'ok', 2}
end

local op = ARGV[1]
if not OPS[op] or not ARGV[2] then
  return redis.error_reply('qg: unknown operation ' .. tostring(op))
end
A.v = {struct.unpack('>' .. string.rep('d', #ARGV[2] / 8), ARGV[2])}
return OPS[op]()

-- bignum.lua - exact non-negative integers of any size, for the Redis
-- store's scripts (docs/redis-store.md, "Exactness").
--
-- Redis runs Lua 5.1, whose only number type is a double: integers are
-- exact below 2^53 and nothing wider exists.  The memory store forms some
-- products in 128 bits (GCRA's scaled time in win_rate.c, weights from
-- token counts in weights.c, overage prices in decide.c); the scripts form
-- them here instead, as arrays of base-2^24 limbs, least significant
-- first, with the limb count in field n (no leading zero limbs; zero has
-- n = 0).  Every intermediate a limb operation forms stays below 2^53
-- (a limb product is below 2^48), so every step is exact.
--
-- Division is by a double divisor d < 2^53 only (a limit, a period, 10^6,
-- 1000): the quotient is estimated in floating point and corrected with
-- the exact remainder until 0 <= r < d, so it is exact too.  A quotient of
-- 2^53 or more is reported as math.huge: the callers clamp such results
-- at a bound (an instant past the end of time, a used amount past the
-- amount bound) exactly where the memory store clamps.
--
-- Redis runs a script's whole body at every call, and a function costs
-- its closure each time: the library is built on first use (BN's
-- metatable), which most calls never reach.
local function bignum_lib()
local BN = {}
local BASE = 16777216            -- 2^24
local TWO53 = 9007199254740992   -- 2^53

-- x: an integer-valued double, 0 <= x < 2^53.
function BN.new(x)
  local t = {n = 0}
  while x > 0 do
    local l = x % BASE
    t.n = t.n + 1
    t[t.n] = l
    x = (x - l) / BASE
  end
  return t
end

local function trim(t)
  while t.n > 0 and t[t.n] == 0 do
    t[t.n] = nil
    t.n = t.n - 1
  end
  return t
end

-- -1, 0, 1 as a <, =, > b.
function BN.cmp(a, b)
  if a.n ~= b.n then return a.n < b.n and -1 or 1 end
  for i = a.n, 1, -1 do
    if a[i] ~= b[i] then return a[i] < b[i] and -1 or 1 end
  end
  return 0
end

function BN.add(a, b)
  local r, carry = {n = 0}, 0
  local n = a.n > b.n and a.n or b.n
  for i = 1, n do
    local v = (a[i] or 0) + (b[i] or 0) + carry
    if v >= BASE then r[i] = v - BASE; carry = 1 else r[i] = v; carry = 0 end
  end
  r.n = n
  if carry > 0 then r.n = n + 1; r[n + 1] = carry end
  return r
end

-- a - b for a >= b.
function BN.sub(a, b)
  local r, borrow = {n = a.n}, 0
  for i = 1, a.n do
    local v = a[i] - (b[i] or 0) - borrow
    if v < 0 then r[i] = v + BASE; borrow = 1 else r[i] = v; borrow = 0 end
  end
  return trim(r)
end

function BN.mul(a, b)
  local r = {n = 0}
  if a.n == 0 or b.n == 0 then return r end
  for k = 1, a.n + b.n do r[k] = 0 end
  for i = 1, a.n do
    local carry, ai = 0, a[i]
    for j = 1, b.n do
      -- < 2^24 + 2^48 + 2^25: exact
      local v = r[i + j - 1] + ai * b[j] + carry
      local l = v % BASE
      r[i + j - 1] = l
      carry = (v - l) / BASE
    end
    local k = i + b.n
    while carry > 0 do
      local v = r[k] + carry
      local l = v % BASE
      r[k] = l
      carry = (v - l) / BASE
      k = k + 1
    end
  end
  r.n = a.n + b.n
  return trim(r)
end

-- The value as a double: exact below 2^53, the nearest double beyond.
function BN.tonum(a)
  local v = 0
  for i = a.n, 1, -1 do v = v * BASE + a[i] end
  return v
end

-- floor(a / d) and a mod d, d an integer double in [1, 2^53).  Returns
-- math.huge, 0 when the quotient is 2^53 or more.
function BN.divmod(a, d)
  local D = BN.new(d)
  local q = math.floor(BN.tonum(a) / d)
  for _ = 1, 64 do
    if q >= TWO53 then return math.huge, 0 end
    if q < 0 then q = 0 end
    local p = BN.mul(BN.new(q), D)
    if BN.cmp(a, p) >= 0 then
      local r = BN.sub(a, p)
      if BN.cmp(r, D) < 0 then return q, BN.tonum(r) end
      local step = math.floor(BN.tonum(r) / d)
      q = q + (step >= 1 and step or 1)
    else
      local step = math.floor(BN.tonum(BN.sub(p, a)) / d)
      q = q - (step >= 1 and step or 1)
    end
  end
  error('qg: bignum division did not converge')
end

-- ceil((a - b) / d) for bignums a, b and a divisor d as in divmod, with
-- either sign of a - b; math.huge when it is 2^53 or more.
function BN.ceil_diff_div(a, b, d)
  if BN.cmp(a, b) >= 0 then
    local q, r = BN.divmod(BN.sub(a, b), d)
    if q == math.huge then return q end
    return r > 0 and q + 1 or q
  end
  local q = BN.divmod(BN.sub(b, a), d)
  if q == math.huge then return -q end
  return -q
end

-- Decimal text, for state kept in Redis (exact whatever the size).
function BN.todec(a)
  if a.n == 0 then return '0' end
  local t, parts = {n = a.n}, {}
  for i = 1, a.n do t[i] = a[i] end
  while t.n > 0 do
    local rem = 0
    for i = t.n, 1, -1 do
      local v = rem * BASE + t[i]          -- < 10^7 * 2^24 < 2^53
      local q = math.floor(v / 10000000)
      rem = v - q * 10000000
      t[i] = q
    end
    trim(t)
    parts[#parts + 1] = rem
  end
  local s = string.format('%d', parts[#parts])
  for i = #parts - 1, 1, -1 do s = s .. string.format('%07d', parts[i]) end
  return s
end

function BN.fromdec(s)
  local t = {n = 0}
  local i = 1
  while i <= #s do
    local chunk = string.sub(s, i, i + 6)
    local mul, add = 10 ^ #chunk, tonumber(chunk)
    local carry = add
    for k = 1, t.n do
      local v = t[k] * mul + carry          -- < 2^24 * 10^7 + 2^24: exact
      local l = v % BASE
      t[k] = l
      carry = (v - l) / BASE
    end
    while carry > 0 do
      local l = carry % BASE
      t.n = t.n + 1
      t[t.n] = l
      carry = (carry - l) / BASE
    end
    i = i + 7
  end
  return trim(t)
end
return BN
end

local BN = setmetatable({}, {__index = function(t, k)
  for name, f in pairs(bignum_lib()) do rawset(t, name, f) end
  return rawget(t, k)
end})

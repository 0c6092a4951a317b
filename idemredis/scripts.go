package idemredis

import "github.com/redis/go-redis/v9"

// The Lua scripts are the store: each one reads and changes one record
// atomically, because Redis runs a script without interleaving any other
// command. Every key a script touches is passed in KEYS and carries the
// scope's hash tag, so the scripts also run on Redis Cluster.
//
// Times are microseconds since the Unix epoch. Lua numbers are doubles, which
// hold integers exactly up to 2^53: microsecond times fit until the year
// 2255, nanosecond times do not fit at all. Numbers are written to Redis
// through redis.call (which converts them exactly) or through str (Lua's
// tostring would print 1.8934567890123e+15).
//
// Each redis.call costs about a microsecond on top of the command, and every
// value crossing between Redis and Lua is copied twice, so the scripts read
// a record with one HMGET of the fields they need and return what they read
// rather than reading it again.

// recordFields are a record's hash fields, in the order the claim and get
// scripts return them (see parseRecord).
//
//	fingerprint   the claimant's fingerprint
//	state         "in_flight" or "completed"
//	token         the fencing token of the current or last holder
//	created_at    when the key was last claimed anew
//	lease_until   when the holder's lease ends
//	expires_at    when the record stops counting
//	completed_at  when it was completed (absent while in flight)
//	status, header (JSON), body, body_omitted ("1" or "0"): the response
const recordFields = `'fingerprint', 'state', 'token', 'created_at', 'lease_until', 'expires_at', 'completed_at', 'status', 'header', 'body', 'body_omitted'`

// Positions in recordFields, 1-based as in Lua.
const prelude = `
local F_FP, F_STATE, F_TOKEN, F_CREATED, F_LEASE, F_EXPIRES = 1, 2, 3, 4, 5, 6
` +
	// now_us reads the store's time from ARGV[1]: a number from
	// Config.Clock, or empty for the Redis server's clock. TIME is allowed
	// before writes because Redis (5 and later by default, 7 only)
	// replicates a script's effects, not the script.
	`
local function now_us(arg)
  if arg ~= '' then return tonumber(arg) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function str(n) return string.format('%.0f', n) end
` +
	// alive reports whether a record counts at now (its TTL has not passed
	// or a live lease holds it), and whether its lease is live.
	`
local function alive(state, lease_until, expires_at, now)
  local lease_live = state == 'in_flight' and now < tonumber(lease_until)
  return lease_live or now < tonumber(expires_at), lease_live
end
`

// claimScript claims a key or reports why it cannot.
//
// KEYS: record, token counter. ARGV: now, fingerprint, lease (µs), TTL (µs),
// change channel, eviction slack (ms).
//
// Returns {outcome, values}: outcome is "acquired", "took_over",
// "in_flight", "completed" or "mismatch"; values the record's recordFields
// in order, absent ones nil.
var claimScript = redis.NewScript(prelude + `
local rk, sk = KEYS[1], KEYS[2]
local now = now_us(ARGV[1])
local fp, lease, ttl = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local slack = tonumber(ARGV[6])

-- Tokens come from the scope's counter, which outlives every record, and
-- are at least the time in µs: they keep increasing after a record expires,
-- is released or purged, and, with the server's clock, even after Redis
-- restarts without persistence and loses the counter. SET ... GET writes the
-- common case (the clock is ahead of the counter) in one call.
local function next_token(floor)
  local tok = now
  local last = tonumber(redis.call('SET', sk, str(tok), 'GET') or '0')
  if tok <= last or tok <= floor then
    tok = math.max(last, floor) + 1
    redis.call('SET', sk, str(tok))
  end
  return tok
end

local floor = 0
local rec = redis.call('HMGET', rk, ` + recordFields + `)
if rec[F_FP] then
  local live, lease_live = alive(rec[F_STATE], rec[F_LEASE], rec[F_EXPIRES], now)
  if live then
    if rec[F_FP] ~= fp then
      return {'mismatch', rec}
    elseif rec[F_STATE] ~= 'in_flight' then
      return {'completed', rec}
    elseif lease_live then
      return {'in_flight', rec}
    end
    -- In flight under an ended lease, same request: take it over.
    rec[F_TOKEN] = str(next_token(tonumber(rec[F_TOKEN])))
    rec[F_LEASE] = str(now + lease)
    redis.call('HSET', rk, 'token', rec[F_TOKEN], 'lease_until', rec[F_LEASE])
    -- Keep the record in Redis until the new lease ends, if that is later
    -- than before; never shorten its life.
    local ms = math.ceil(lease / 1000) + slack
    if redis.call('PTTL', rk) < ms then
      redis.call('PEXPIRE', rk, ms)
    end
    redis.call('PUBLISH', ARGV[5], rk)
    return {'took_over', rec}
  end
  -- Dead by the store's clock but not yet evicted: replace it.
  floor = tonumber(rec[F_TOKEN]) or 0
  redis.call('DEL', rk)
end

local tok, lease_until, expires_at = str(next_token(floor)), str(now + lease), str(now + ttl)
redis.call('HSET', rk, 'fingerprint', fp, 'state', 'in_flight', 'token', tok,
  'created_at', str(now), 'lease_until', lease_until, 'expires_at', expires_at)
-- Let Redis evict the record by itself once nothing can need it. The TTL is
-- relative to the store's clock, so an injected clock far from real time
-- neither evicts at once nor never.
redis.call('PEXPIRE', rk, math.ceil(math.max(ttl, lease) / 1000) + slack)
return {'acquired', {fp, 'in_flight', tok, str(now), lease_until, expires_at}}
`)

// completeScript stores the response if the token holds the key.
//
// KEYS: record. ARGV: now, token, status, header, body, body_omitted, change
// channel.
//
// Returns 1 when the record is (now or already) completed under the token,
// 0 when the token does not hold the key.
var completeScript = redis.NewScript(prelude + `
local rk = KEYS[1]
local rec = redis.call('HMGET', rk, 'token', 'state')
if not rec[1] or rec[1] ~= ARGV[2] then
  return 0
end
if rec[2] == 'completed' then
  return 1
end
redis.call('HSET', rk,
  'state', 'completed',
  'completed_at', str(now_us(ARGV[1])),
  'status', ARGV[3],
  'header', ARGV[4],
  'body', ARGV[5],
  'body_omitted', ARGV[6])
redis.call('PUBLISH', ARGV[7], rk)
return 1
`)

// releaseScript deletes the record if the token holds it in flight.
//
// KEYS: record. ARGV: now (unused, kept for a uniform ARGV[1]), token,
// change channel.
//
// Returns 1 when the key is gone (released now, or absent), 0 when another
// token holds it or it was completed.
var releaseScript = redis.NewScript(prelude + `
local rk = KEYS[1]
local rec = redis.call('HMGET', rk, 'token', 'state')
if not rec[1] then
  return 1
end
if rec[1] ~= ARGV[2] or rec[2] ~= 'in_flight' then
  return 0
end
redis.call('DEL', rk)
redis.call('PUBLISH', ARGV[3], rk)
return 1
`)

// getScript returns the record's recordFields in order (absent ones nil),
// or an empty list when it is absent or dead by the store's clock.
//
// KEYS: record. ARGV: now.
var getScript = redis.NewScript(prelude + `
local rec = redis.call('HMGET', KEYS[1], ` + recordFields + `)
if not rec[F_FP] or not alive(rec[F_STATE], rec[F_LEASE], rec[F_EXPIRES], now_us(ARGV[1])) then
  return {}
end
return rec
`)

// leaseScript returns how many µs the key's lease has left when it is in
// flight under a live lease, and 0 otherwise: WaitChange waits only in the
// first case.
//
// KEYS: record. ARGV: now.
var leaseScript = redis.NewScript(prelude + `
local rec = redis.call('HMGET', KEYS[1], 'state', 'lease_until')
if rec[1] ~= 'in_flight' then
  return 0
end
local left = tonumber(rec[2]) - now_us(ARGV[1])
if left > 0 then
  return left
end
return 0
`)

// purgeScript deletes the record if its TTL has passed by the store's clock
// and no live lease holds it.
//
// KEYS: record. ARGV: now.
//
// Returns 1 when it deleted the record, 0 otherwise.
var purgeScript = redis.NewScript(prelude + `
local rk = KEYS[1]
local rec = redis.call('HMGET', rk, 'state', 'lease_until', 'expires_at')
if not rec[1] or alive(rec[1], rec[2], rec[3], now_us(ARGV[1])) then
  return 0
end
redis.call('DEL', rk)
return 1
`)

var allScripts = []*redis.Script{claimScript, completeScript, releaseScript, getScript, leaseScript, purgeScript}

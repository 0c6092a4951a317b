package idemredis

import (
	"strconv"
)

// The Lua scripts are the store's judges: each one reads and changes one
// record atomically, because Redis runs a script without interleaving any
// other command, and by Redis's own clock. A new key's claim, a replay and
// a Get need no judge and are native commands (store.go); what changes a
// record that exists (a takeover, a completion, a release, a purge) is a
// script, or on a server with SET … IFEQ a native compare-and-set. Every key a script touches is passed in KEYS and carries the
// scope's hash tag, so the scripts also run on Redis Cluster. The record's
// layout is described in record.go.
//
// What a script costs, measured on Redis 7 (see doc.go, "Cost"): each
// redis.call about a microsecond, each string.format or closure a fraction
// of one, and every value crossing between Redis and Lua is copied. So the
// common path of each script (a completion on a server without IFEQ)
// makes as few calls as it can, builds its strings by concatenation only,
// and leaves parsing and arithmetic to the rare paths and to the client.
//
// Times are microseconds since the Unix epoch. Where Lua does arithmetic on
// them it uses doubles, exact for integers up to 2^53: microsecond times fit
// until the year 2255. Numbers computed in Lua are written with
// string.format('%d'), which is exact in that range (tostring would print
// 1.8934567890123e+15).

// luaNow sets now to the store's time as a decimal string: ARGV[1] when
// a Clock gave it, else the Redis server's TIME (allowed before writes
// because Redis 7 replicates a script's effects, not the script), with its
// microseconds zero-padded to six digits so that the two parts concatenate
// without arithmetic.
const luaNow = `
local now = ARGV[1]
if now == '' then
  local t = redis.call('TIME')
  now = t[1] .. string.sub('000000', #t[2] + 1) .. t[2]
end
`

// luaNowNumber sets now to the store's time as a number.
const luaNowNumber = `
local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[1])
end
`

// luaParseRecord reads the header of the record v (see record.go) into
// locals, and sets live (its TTL has not passed or a live lease holds it)
// and leaseLive by the number now. An unreadable value is an error, not a
// record to overwrite; the callers handle tombstones ('r') before it.
const luaParseRecord = `
local state, token, created, leased, lease, ttl, fplen, fpstart =
  string.match(v, '^([ic])[-w](%d+) (%-?%d+) (%-?%d+) (%d+) (%d+) (%d+) ()')
if not state then
  return redis.error_reply('idemredis: ' .. KEYS[1] .. ' is not a record')
end
local leaseLive = state == 'i' and now < tonumber(leased) + tonumber(lease)
local live = leaseLive or now < tonumber(created) + tonumber(ttl)
`

// evictionSlackMs and tombstoneLifeMs are evictionSlack and tombstoneLife
// in the scripts' text.
var (
	evictionSlackMs = strconv.FormatInt(evictionSlack.Milliseconds(), 10)
	tombstoneLifeMs = strconv.FormatInt(tombstoneLife.Milliseconds(), 10)
)

// luaTombstone writes the tombstone of the record at rk, whose token is
// token (a string), in place of the record: it keeps Redis from forgetting
// the token until its clock has passed it by tombstoneLife, so that every
// later claim of the key gets a greater one (see doc.go, "Fencing
// tokens"). It needs now as a number.
var luaTombstone = `
local function tombstone(rk, token)
  local ms = math.ceil((tonumber(token) - now) / 1000)
  if ms < 0 then
    ms = 0
  end
  redis.call('SET', rk, 'r-' .. token, 'PX', ms + ` + tombstoneLifeMs + `)
end
`

// luaChannel is the store's change channel, "<prefix>:changes", taken from
// the record key KEYS[1] ("<prefix>:{<tag>}:<key>", whose first '{' is the
// tag's since a prefix holds no braces), so that no script needs it as an
// argument on the paths that do not publish.
const luaChannel = `string.sub(KEYS[1], 1, string.find(KEYS[1], '{', 1, true) - 2) .. ':changes'`

// luaWaited is true when a waiter flagged the record v (see leaseScript),
// so that a change to it must be published.
const luaWaited = `string.byte(v, 2) == 119` // 'w'

// claimScript claims a key that a native claim found taken (by a
// tombstone, a dead record, or an in-flight record whose lease looked
// ended), judging by the store's clock, or returns the record that stops
// it. It also claims a key that is absent, for the claims made while the
// process has no estimate of Redis's clock good enough to write a record
// by itself (see serverClock).
//
// KEYS: record. ARGV: now (empty for the server's clock), the rest of a
// new record after its times, " <lease> <ttl> <fplen> <fingerprint>" (µs),
// and the record's Redis lifetime (ms).
//
// Returns "a<token> <now>" when it claimed the key anew, "t" followed by
// the new record when it took an in-flight key over, or the record that
// stops the claim, unchanged (which starts with 'i' or 'c'): the client
// tells a mismatch, a completed key and an in-flight one apart itself.
//
// Tokens: a record written over a tombstone or a record gets a token above
// the time and above the one it replaces; Redis keeps each record and
// tombstone until its clock has passed the token by at least a second (the
// lifetime is stretched when a token is above the time), so a key that is
// absent has only ever had tokens below the time (see doc.go, "Fencing
// tokens").
var claimScript = newScript(luaNow + `
local rk = KEYS[1]
local v = redis.call('SET', rk, 'i-' .. now .. ' ' .. now .. ' ' .. now .. ARGV[2], 'NX', 'PX', ARGV[3], 'GET')
if not v then
  return 'a' .. now .. ' ' .. now
end

now = tonumber(now)
local nowS = string.format('%d', now)
-- The Redis lifetime (ms) of a record whose token is t: at least min, and
-- long enough for the clock to pass t by the slack.
local function lifetime(t, min)
  local ms = math.ceil((t - now) / 1000) + ` + evictionSlackMs + `
  if ms < min then
    return min
  end
  return ms
end
-- Claims the key anew with a token above prev (a string).
local function claimAnew(prev)
  local t = math.max(now, tonumber(prev) + 1)
  local s = string.format('%d', t)
  redis.call('SET', rk, 'i-' .. s .. ' ' .. nowS .. ' ' .. nowS .. ARGV[2], 'PX', lifetime(t, tonumber(ARGV[3])))
  return 'a' .. s .. ' ' .. nowS
end

if string.byte(v) == 114 then -- 'r': a tombstone
  local prev = string.match(v, '^r%-(%d+)$')
  if not prev then
    return redis.error_reply('idemredis: ' .. rk .. ' is not a record')
  end
  return claimAnew(prev)
end
` + luaParseRecord + `
if live then
  local reqLease, reqFp = string.match(ARGV[2], '^ (%d+) %d+ %d+ ()')
  reqFp = string.sub(ARGV[2], reqFp)
  if state == 'c' or leaseLive or string.sub(v, fpstart, fpstart + fplen - 1) ~= reqFp then
    return v
  end
  -- In flight under an ended lease, same request: take it over. The record
  -- keeps its creation and TTL; the lease starts now.
  local t = math.max(now, tonumber(token) + 1)
  local nv = 'i-' .. string.format('%d', t) .. ' ' .. created .. ' ' .. nowS .. ' ' .. reqLease .. ' ' .. ttl .. ' ' ..
    fplen .. ' ' .. reqFp
  redis.call('SET', rk, nv, 'KEEPTTL')
  -- Keep the record in Redis until the new lease ends, if that is later
  -- than before; never shorten its life.
  local ms = lifetime(t, math.ceil(tonumber(reqLease) / 1000) + ` + evictionSlackMs + `)
  if redis.call('PTTL', rk) < ms then
    redis.call('PEXPIRE', rk, ms)
  end
  redis.call('PUBLISH', ` + luaChannel + `, rk)
  return 't' .. nv
end

-- Dead by the store's clock but not yet expired by Redis: replace it.
return claimAnew(token)
`)

// completeScript stores the response if the token holds the key.
//
// KEYS: record. ARGV: now (the completion time: the injected clock's, the
// process's estimate of Redis's, or empty for TIME), "<token> ", the
// response as record.go lays it out after the completion time.
//
// Returns 1 when the record is (now or already) completed under the token,
// 0 when the token does not hold the key.
var completeScript = newScript(`
local rk = KEYS[1]
local v = redis.call('GET', rk)
if not v or string.byte(v) == 114 then -- absent, or 'r': released
  return 0
end
local p = ARGV[2]
if string.sub(v, 3, #p + 2) ~= p then
  return 0
end
if string.byte(v) ~= 105 then -- not 'i': completed under this token already
  return 1
end
` + luaNow + `
redis.call('SET', rk, 'c' .. string.sub(v, 2) .. ' ' .. now .. ARGV[3], 'KEEPTTL')
if ` + luaWaited + ` then
  redis.call('PUBLISH', ` + luaChannel + `, rk)
end
return 1
`)

// releaseScript replaces the record with its tombstone if the token holds
// it in flight, so that the key's next claim runs the effect again, with a
// greater token whatever the clock does.
//
// KEYS: record. ARGV: now, token.
//
// Returns 1 when the key is gone (released now, or absent, or a
// tombstone), 0 when another token holds it or it was completed.
var releaseScript = newScript(`
local rk = KEYS[1]
local v = redis.call('GET', rk)
if not v or string.byte(v) == 114 then -- absent, or 'r': already released
  return 1
end
local p = ARGV[2] .. ' '
if string.byte(v) ~= 105 or string.sub(v, 3, #p + 2) ~= p then -- not 'i', or another token
  return 0
end
` + luaNowNumber + luaTombstone + `
tombstone(rk, ARGV[2])
if ` + luaWaited + ` then
  redis.call('PUBLISH', ` + luaChannel + `, rk)
end
return 1
`)

// getScript returns the record, or nil when it is absent, a tombstone, or
// dead by the store's clock. Get uses it only while the process has no
// usable estimate of Redis's clock; otherwise it judges a plain GET itself.
//
// KEYS: record. ARGV: now.
var getScript = newScript(`
local v = redis.call('GET', KEYS[1])
if not v or string.byte(v) == 114 then
  return false
end
` + luaNowNumber + luaParseRecord + `
if not live then
  return false
end
return v
`)

// leaseScript returns how many µs the key's lease has left when it is in
// flight under a live lease, and 0 otherwise: WaitChange waits only in the
// first case. Before it returns a wait, it flags the record (its second
// byte becomes 'w'), so that the completion, release or takeover that ends
// the wait publishes it; changes to records nobody waits on are not
// published at all.
//
// KEYS: record. ARGV: now.
var leaseScript = newScript(`
local v = redis.call('GET', KEYS[1])
if not v or string.byte(v) ~= 105 then -- absent, or not 'i'
  return 0
end
` + luaNowNumber + luaParseRecord + `
if not leaseLive then
  return 0
end
if not (` + luaWaited + `) then
  redis.call('SETRANGE', KEYS[1], 1, 'w')
end
return tonumber(leased) + tonumber(lease) - now
`)

// purgeScript replaces the record with its tombstone if its TTL has passed
// by the store's clock and no live lease holds it (see releaseScript).
//
// KEYS: record. ARGV: now.
//
// Returns 1 when it purged the record, 0 otherwise (including when the key
// holds a tombstone or something that is not a record).
var purgeScript = newScript(`
local rk = KEYS[1]
local v = redis.pcall('GET', rk)
if type(v) ~= 'string' or not string.match(v, '^[ic][-w]%d+ ') then
  return 0 -- absent, not a string, a tombstone, or not a record
end
` + luaNowNumber + luaParseRecord + luaTombstone + `
if live then
  return 0
end
tombstone(rk, token)
return 1
`)

// renewScript starts a new lease of the key at now if the token holds it
// in flight (see Store.Renew): the record's lease begins now and lasts
// ARGV[3], its TTL is stretched to end no earlier than that lease, and Redis
// keeps it at least that long; the waiter flag and everything after the
// TTL are kept.
//
// KEYS: record. ARGV: now, token, lease (µs).
//
// Returns the renewed record, or nil when the token does not hold the key
// in flight.
var renewScript = newScript(`
local rk = KEYS[1]
local v = redis.call('GET', rk)
if not v or string.byte(v) ~= 105 then -- absent, or not 'i'
  return false
end
local p = ARGV[2] .. ' '
if string.sub(v, 3, #p + 2) ~= p then
  return false
end
` + luaNowNumber + `
local head, created, ttl, rest = string.match(v, '^(i[-w]%d+ (%-?%d+) )%-?%d+ %d+ (%d+) ()')
if not head then
  return redis.error_reply('idemredis: ' .. rk .. ' is not a record')
end
local lease = tonumber(ARGV[3])
local t = tonumber(ttl)
if now + lease > tonumber(created) + t then
  t = now + lease - tonumber(created)
end
local nv = head .. string.format('%d', now) .. ' ' .. ARGV[3] .. ' ' .. string.format('%d', t) .. ' ' .. string.sub(v, rest)
redis.call('SET', rk, nv, 'KEEPTTL')
local ms = math.ceil(lease / 1000) + ` + evictionSlackMs + `
if redis.call('PTTL', rk) < ms then
  redis.call('PEXPIRE', rk, ms)
end
return nv
`)

var allScripts = []*script{claimScript, completeScript, releaseScript, getScript, leaseScript, purgeScript, renewScript}

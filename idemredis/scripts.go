package idemredis

import (
	"strconv"

	"github.com/redis/go-redis/v9"
)

// The Lua scripts are the store: each one reads and changes one record
// atomically, because Redis runs a script without interleaving any other
// command. Every key a script touches is passed in KEYS and carries the
// scope's hash tag, so the scripts also run on Redis Cluster. The record's
// layout is described in record.go.
//
// What a script costs, measured on Redis 7 (see doc.go, "Cost"): each
// redis.call about a microsecond, each string.format or closure a fraction
// of one, and every value crossing between Redis and Lua is copied. So the
// common path of each script (a new key's claim, a completion, a replay)
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
// record to overwrite.
const luaParseRecord = `
local state, token, created, leased, lease, ttl, fplen, fpstart =
  string.match(v, '^([ic])[-w](%d+) (%-?%d+) (%-?%d+) (%d+) (%d+) (%d+) ()')
if not state then
  return redis.error_reply('idemredis: ' .. KEYS[1] .. ' is not a record')
end
local leaseLive = state == 'i' and now < tonumber(leased) + tonumber(lease)
local live = leaseLive or now < tonumber(created) + tonumber(ttl)
`

// evictionSlackMs is evictionSlack in the scripts' text.
var evictionSlackMs = strconv.FormatInt(evictionSlack.Milliseconds(), 10)

// luaChannel is the store's change channel, "<prefix>:changes", taken from
// the record key KEYS[1] ("<prefix>:{<tag>}:<key>", whose first '{' is the
// tag's since a prefix holds no braces), so that no script needs it as an
// argument on the paths that do not publish.
const luaChannel = `string.sub(KEYS[1], 1, string.find(KEYS[1], '{', 1, true) - 2) .. ':changes'`

// luaWaited is true when a waiter flagged the record v (see leaseScript),
// so that a change to it must be published.
const luaWaited = `string.byte(v, 2) == 119` // 'w'

// claimScript claims a key or returns the record that stops it.
//
// KEYS: record, scope's token floor. ARGV: now (empty for the server's
// clock), the rest of a new record after its times, " <lease> <ttl>
// <fplen> <fingerprint>" (µs), and the record's Redis lifetime (ms).
//
// Returns "a<token> <now>" when it claimed the key anew, "t" followed by
// the new record when it took an in-flight key over, or the record that
// stops the claim, unchanged (which starts with 'i' or 'c'): the client
// tells a mismatch, a completed key and an in-flight one apart itself.
//
// Tokens: a new record's token is the store's time, unless the scope's floor
// (raised by Release and Purge to the token of each record they delete, and
// by any token issued above the time) is not below it; a replaced or taken
// over record's token is also above the previous one. So tokens increase
// per key across releases, purges, clock steps, and Redis's own expiry of
// a record, which happens only once the time has passed the record's end
// (see doc.go, "Fencing tokens").
var claimScript = redis.NewScript(luaNow + `
local rk, sk = KEYS[1], KEYS[2]
local v = redis.call('SET', rk, 'i-' .. now .. ' ' .. now .. ' ' .. now .. ARGV[2], 'NX', 'PX', ARGV[3], 'GET')
if not v then
  local floor = tonumber(redis.call('GET', sk) or '0')
  if floor < tonumber(now) then
    return 'a' .. now .. ' ' .. now
  end
  -- The floor is ahead of the clock (a clock stepped back, or a release in
  -- the same microsecond): issue the next token and raise the floor to it.
  local token = string.format('%d', floor + 1)
  redis.call('SET', sk, token)
  redis.call('SET', rk, 'i-' .. token .. ' ' .. now .. ' ' .. now .. ARGV[2], 'KEEPTTL')
  return 'a' .. token .. ' ' .. now
end

now = tonumber(now)
` + luaParseRecord + `
-- The next token: above the time, the floor and the record's token. One
-- issued above the time goes into the floor, so that it is not forgotten
-- when Redis expires the record.
local function nextToken()
  local floor = tonumber(redis.call('GET', sk) or '0')
  local t = math.max(now, floor + 1, tonumber(token) + 1)
  local s = string.format('%d', t)
  if t > now then
    redis.call('SET', sk, s)
  end
  return s
end
local nowS = string.format('%d', now)

if live then
  local reqLease, reqFp = string.match(ARGV[2], '^ (%d+) %d+ %d+ ()')
  reqFp = string.sub(ARGV[2], reqFp)
  if state == 'c' or leaseLive or string.sub(v, fpstart, fpstart + fplen - 1) ~= reqFp then
    return v
  end
  -- In flight under an ended lease, same request: take it over. The record
  -- keeps its creation and TTL; the lease starts now.
  local nv = 'i-' .. nextToken() .. ' ' .. created .. ' ' .. nowS .. ' ' .. reqLease .. ' ' .. ttl .. ' ' ..
    fplen .. ' ' .. reqFp
  redis.call('SET', rk, nv, 'KEEPTTL')
  -- Keep the record in Redis until the new lease ends, if that is later
  -- than before; never shorten its life.
  local ms = math.ceil(tonumber(reqLease) / 1000) + ` + evictionSlackMs + `
  if redis.call('PTTL', rk) < ms then
    redis.call('PEXPIRE', rk, ms)
  end
  redis.call('PUBLISH', ` + luaChannel + `, rk)
  return 't' .. nv
end

-- Dead by the store's clock but not yet expired by Redis: replace it.
local token = nextToken()
redis.call('SET', rk, 'i-' .. token .. ' ' .. nowS .. ' ' .. nowS .. ARGV[2], 'PX', ARGV[3])
return 'a' .. token .. ' ' .. nowS
`)

// completeScript stores the response if the token holds the key.
//
// KEYS: record. ARGV: now, "<token> ", the response as record.go lays it
// out after the completion time.
//
// Returns 1 when the record is (now or already) completed under the token,
// 0 when the token does not hold the key.
var completeScript = redis.NewScript(`
local rk = KEYS[1]
local v = redis.call('GET', rk)
if not v then
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

// releaseScript deletes the record if the token holds it in flight, and
// raises the scope's token floor to the token, so that the key's next claim
// gets a greater one whatever the clock does.
//
// KEYS: record, scope's token floor. ARGV: token.
//
// Returns 1 when the key is gone (released now, or absent), 0 when another
// token holds it or it was completed.
var releaseScript = redis.NewScript(`
local rk, sk = KEYS[1], KEYS[2]
local v = redis.call('GET', rk)
if not v then
  return 1
end
local p = ARGV[1] .. ' '
if string.byte(v) ~= 105 or string.sub(v, 3, #p + 2) ~= p then -- not 'i', or another token
  return 0
end
redis.call('DEL', rk)
local floor = redis.call('GET', sk)
if not floor or tonumber(floor) < tonumber(ARGV[1]) then
  redis.call('SET', sk, ARGV[1])
end
if ` + luaWaited + ` then
  redis.call('PUBLISH', ` + luaChannel + `, rk)
end
return 1
`)

// getScript returns the record, or nil when it is absent or dead by the
// store's clock.
//
// KEYS: record. ARGV: now.
var getScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v then
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
var leaseScript = redis.NewScript(`
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

// purgeScript deletes the record if its TTL has passed by the store's clock
// and no live lease holds it, raising the scope's token floor to its token
// (see releaseScript).
//
// KEYS: record, scope's token floor. ARGV: now.
//
// Returns 1 when it deleted the record, 0 otherwise (including when the key
// holds something that is not a record).
var purgeScript = redis.NewScript(`
local rk, sk = KEYS[1], KEYS[2]
local v = redis.pcall('GET', rk)
if type(v) ~= 'string' or not string.match(v, '^[ic][-w]%d+ ') then
  return 0 -- absent, not a string, or not a record
end
` + luaNowNumber + luaParseRecord + `
if live then
  return 0
end
redis.call('DEL', rk)
local floor = redis.call('GET', sk)
if not floor or tonumber(floor) < tonumber(token) then
  redis.call('SET', sk, token)
end
return 1
`)

var allScripts = []*redis.Script{claimScript, completeScript, releaseScript, getScript, leaseScript, purgeScript}

-- The load scripts/serve-load drives `idem serve` with, as a wrk script:
--   wrk -t1 -c64 -d10s -s scripts/serve-load.lua URL/v1/payments -- ACCOUNTS API_KEY [dup N]
-- ACCOUNTS is a file of account ids, one a line. Each request is a payment
-- of 1 KRW under a key of its own; the payment's account follows from its
-- key's number, so a key sent again carries the same body. With `dup N`
-- the keys cycle through N per thread, so that after a first pass every
-- request is a replay.
-- At the end it prints one line for the caller to parse:
--   WRK,<requests>,<duration_us>,<p50_us>,<p90_us>,<p99_us>,<answers of 400 and above>,<socket errors>

local accounts = {}
local token = ""
local cycle = 0
local n = 0
local run = tostring(os.time()) .. "-" .. tostring(math.random(1, 1000000000))

function init(args)
	for line in io.lines(args[1]) do
		if line ~= "" then
			accounts[#accounts + 1] = line
		end
	end
	token = args[2]
	if args[3] == "dup" then
		cycle = tonumber(args[4])
		-- Replays must find the keys a warm-up run made: no run id then.
		run = "dup"
	end
	wrk.method = "POST"
	wrk.headers["Authorization"] = "Bearer " .. token
	wrk.headers["Content-Type"] = "application/json"
end

function request()
	n = n + 1
	local i = n
	if cycle > 0 then
		i = (n - 1) % cycle + 1
	end
	local account = accounts[(i - 1) % #accounts + 1]
	wrk.headers["Idempotency-Key"] = "load-" .. run .. "-" .. tostring(i)
	return wrk.format(nil, nil, nil, '{"account_id":"' .. account .. '","amount":1,"currency":"KRW"}')
end

function done(summary, latency)
	local e = summary.errors
	-- e.status counts the answers of status 400 and above.
	io.write(string.format("WRK,%d,%d,%d,%d,%d,%d,%d\n", summary.requests, summary.duration,
		latency:percentile(50), latency:percentile(90), latency:percentile(99),
		e.status, e.connect + e.read + e.write + e.timeout))
end

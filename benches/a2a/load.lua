-- The wrk script of `cargo xtask bench a2a`: one JSON-RPC request per call, each message with
-- its own messageId (a counter), and one machine-readable summary line when the run is done.
--
-- Arguments (after `--`): SCENARIO PREFIX [TASK_ID [RAMP_MS CONNECTIONS]]
--   SCENARIO  send | send-async | get | stream
--   PREFIX    makes this run's messageIds distinct from every other run's
--   TASK_ID   the task GetTask reads
--   RAMP_MS   the first CONNECTIONS requests (one per connection) each start at a random
--             moment within this many milliseconds instead of all at once

local counter = 0
local body = nil
local ramp_ms, ramped = 0, 0

local headers = {
  ["Content-Type"] = "application/json",
  ["A2A-Version"] = "1.0",
}

local function message_params(prefix, n, extra)
  return string.format(
    '{"message":{"messageId":"%s%d","role":"ROLE_USER","parts":[{"text":"hello, echo"}]}%s}',
    prefix, n, extra)
end

local function envelope(n, method, params)
  return string.format('{"jsonrpc":"2.0","id":%d,"method":"%s","params":%s}', n, method, params)
end

function init(args)
  local scenario, prefix, task_id = args[1], args[2] or "m-", args[3] or ""
  ramp_ms, ramped = tonumber(args[4] or "0") or 0, tonumber(args[5] or "0") or 0
  if scenario == "send" then
    body = function(n) return envelope(n, "SendMessage", message_params(prefix, n, "")) end
  elseif scenario == "send-async" then
    body = function(n)
      return envelope(n, "SendMessage",
        message_params(prefix, n, ',"configuration":{"returnImmediately":true}'))
    end
  elseif scenario == "get" then
    local params = string.format('{"id":"%s"}', task_id)
    body = function(n) return envelope(n, "GetTask", params) end
  elseif scenario == "stream" then
    headers["Accept"] = "text/event-stream"
    body = function(n) return envelope(n, "SendStreamingMessage", message_params(prefix, n, "")) end
  else
    error("unknown scenario " .. tostring(scenario))
  end
end

function delay()
  if ramped > 0 then
    ramped = ramped - 1
    return math.random(0, ramp_ms)
  end
  return 0
end

function request()
  counter = counter + 1
  return wrk.format("POST", "/", headers, body(counter))
end

-- No `response` function: with one, wrk would buffer and hand over every response body.

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "keel-bench: requests=%d duration_us=%d p50_us=%d p99_us=%d errors=%d\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.connect + e.read + e.write + e.status + e.timeout))
end

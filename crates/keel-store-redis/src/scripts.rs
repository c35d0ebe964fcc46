//! The Lua scripts: every check-then-write (and every multi-key write that needs a value
//! Redis computes, such as a counter) runs as one script, so it is atomic and one round trip.
//!
//! Conventions: scripts signal a refused write with a negative integer (never an error
//! reply), so the Rust side maps it to the precise [`keel_core::AgentError`]. A lease key holds
//! `<token>:<holder>`; `string.match(value, '^%d+')` is its token. Writes of many arguments
//! go in chunks because Lua's `unpack` has a stack limit of a few thousand values.

use std::sync::LazyLock;

use redis::Script;

/// Take a thread's lease when nobody holds a live one or, when reclaiming, when the same
/// holder does (a restarted process taking its own threads back), with a new token: the rule
/// of `keel_runtime::lease_blocks`.
///
/// KEYS: lease, token counter. ARGV: holder, ttl ms, `1` to reclaim (else `0`).
/// Returns false when it stays with its holder, else `{token, expires_at_ms}` (server clock).
pub(crate) static TAKE_LEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local current = redis.call('GET', KEYS[1])
if current and not (ARGV[3] == '1' and string.match(current, '^%d+:(.*)$') == ARGV[1]) then
  return false
end
-- The counter is never deleted, so tokens grow even across release and expiry.
local token = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], string.format('%d', token) .. ':' .. ARGV[1], 'PX', ARGV[2])
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
return {token, now_ms + tonumber(ARGV[2])}
",
    )
});

/// Extend a held lease.
///
/// KEYS: lease. ARGV: token, ttl ms. Returns -1 when lost, else the new expiry in ms.
pub(crate) static RENEW_LEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local current = redis.call('GET', KEYS[1])
if not current or string.match(current, '^%d+') ~= ARGV[1] then return -1 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local now = redis.call('TIME')
return tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) + tonumber(ARGV[2])
",
    )
});

/// Give a lease up, only if it is still the caller's.
///
/// KEYS: lease. ARGV: token. Returns 1 when released, 0 when it was not held.
pub(crate) static RELEASE_LEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local current = redis.call('GET', KEYS[1])
if not current or string.match(current, '^%d+') ~= ARGV[1] then return 0 end
return redis.call('DEL', KEYS[1])
",
    )
});

/// Append messages to a thread's history under its lease.
///
/// KEYS: lease, history list. ARGV: token, message... Returns -1 when the lease is lost,
/// else the history's length (the seq of the last entry).
pub(crate) static APPEND_HISTORY: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local current = redis.call('GET', KEYS[1])
if not current or string.match(current, '^%d+') ~= ARGV[1] then return -1 end
for i = 2, #ARGV, 1000 do
  redis.call('RPUSH', KEYS[2], unpack(ARGV, i, math.min(i + 999, #ARGV)))
end
return redis.call('LLEN', KEYS[2])
",
    )
});

/// The newest entries of a thread's history before a seq (see
/// [`ThreadHistory::read_history_before`](keel_runtime::ThreadHistory::read_history_before)):
/// the list's length and the range read in one atomic step, so that the seqs answered are
/// the entries'.
///
/// KEYS: history list. ARGV: before_seq (at most `i64::MAX`), limit. Returns the seq
/// before the first entry answered, then the entries.
pub(crate) static READ_HISTORY_BEFORE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local last = math.min(tonumber(ARGV[1]) - 1, redis.call('LLEN', KEYS[1]))
local first = math.max(last - tonumber(ARGV[2]), 0)
if last <= first then return {first, {}} end
return {first, redis.call('LRANGE', KEYS[1], first, last - 1)}
",
    )
});

/// One persist point of an engine step: history entries under the lease and the task's log
/// entries, in one round trip and atomically.
///
/// KEYS: lease, history list, task snapshot, task events list. ARGV: token, number of history
/// entries, history..., events... Returns -1 when the lease is lost, -2 for an unknown task,
/// else 0; nothing is written unless it returns 0.
pub(crate) static PERSIST_STEP: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local current = redis.call('GET', KEYS[1])
if not current or string.match(current, '^%d+') ~= ARGV[1] then return -1 end
if redis.call('EXISTS', KEYS[3]) == 0 then return -2 end
local n = tonumber(ARGV[2])
for i = 3, 2 + n do redis.call('RPUSH', KEYS[2], ARGV[i]) end
for i = 3 + n, #ARGV do redis.call('RPUSH', KEYS[4], ARGV[i]) end
return 0
",
    )
});

/// Remove acknowledged items from a thread's queue under its lease, and set the thread's
/// count in the tenant's queued-threads hash from what is left (deleted at zero).
///
/// KEYS: lease, queue zset, items hash, queued-threads hash. ARGV: token, thread, id...
/// Returns -1 when the lease is lost, else 0.
pub(crate) static ACK_QUEUE: LazyLock<Script> =
    LazyLock::new(|| Script::new(&format!("{ACK_BODY}return 0\n")));

/// [`ACK_QUEUE`], then the lease released in the same script (`StepStore::ack_and_release`:
/// the thread's last item is done). Under a lease that is no longer the caller's it returns
/// -1 and neither acknowledges nor releases anything, as the two calls would.
pub(crate) static ACK_AND_RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(&format!("{ACK_BODY}redis.call('DEL', KEYS[1])\nreturn 0\n")));

/// What [`ACK_QUEUE`] and [`ACK_AND_RELEASE`] share: the fence and the acknowledgement.
const ACK_BODY: &str = r"local current = redis.call('GET', KEYS[1])
if not current or string.match(current, '^%d+') ~= ARGV[1] then return -1 end
for i = 3, #ARGV, 1000 do
  local last = math.min(i + 999, #ARGV)
  redis.call('ZREM', KEYS[2], unpack(ARGV, i, last))
  redis.call('HDEL', KEYS[3], unpack(ARGV, i, last))
end
local left = redis.call('ZCARD', KEYS[2])
if left == 0 then
  redis.call('HDEL', KEYS[4], ARGV[2])
else
  redis.call('HSET', KEYS[4], ARGV[2], left)
end
";

/// Queue an item at the back, and set the thread's count in the tenant's queued-threads hash.
///
/// KEYS: seq counter, queue zset, items hash, queued-threads hash. ARGV: id, item, thread.
/// Returns the item's seq.
pub(crate) static PUSH_QUEUE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local seq = redis.call('INCR', KEYS[1])
redis.call('ZADD', KEYS[2], seq, ARGV[1])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[4], ARGV[3], redis.call('ZCARD', KEYS[2]))
return seq
",
    )
});

/// The front of a queue, without removing it.
///
/// KEYS: queue zset, items hash. ARGV: last index (limit - 1).
/// Returns `{{id, seq, item}, ...}`, oldest first.
pub(crate) static PEEK_QUEUE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local ids = redis.call('ZRANGE', KEYS[1], 0, ARGV[1], 'WITHSCORES')
local out = {}
for i = 1, #ids, 2 do
  out[#out + 1] = {ids[i], ids[i + 1], redis.call('HGET', KEYS[2], ids[i])}
end
return out
",
    )
});

/// Set a key-value entry unless that would exceed the thread's key count.
///
/// KEYS: kv hash. ARGV: field, value, max keys. Returns 1 when set, 0 when full.
pub(crate) static KV_SET: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0
   and redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[3]) then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
",
    )
});

/// Insert or replace a task snapshot, give a new task its creation seq, move the task
/// between the thread and state indexes (by creation and by status time), and append events
/// to its log (`save_task` passes none; `save_task_with_events` the ones that go with the
/// snapshot), all in one script.
///
/// KEYS: snapshot, meta hash, seq counter, tenant index, thread index, state index,
/// thread-state index, events list, then the tenant, thread, state and thread-state indexes
/// by status time. ARGV: snapshot, task id, thread, state, tenant key base, status time (µs),
/// event... Returns -1, having written nothing, when the events key holds something other
/// than a list (a script's writes before an error reply are not undone, so this is checked
/// first); else 1.
pub(crate) static SAVE_TASK: LazyLock<Script> =
    LazyLock::new(|| Script::new(&format!("local last = #ARGV\n{SAVE_TASK_BODY}return 1\n")));

/// [`SAVE_TASK`] and, in the same script, a run's record saved as `RunStore::save_run_text`
/// does: a run comes to rest with its report in one write (`StepStore::save_task_and_run`).
///
/// KEYS: [`SAVE_TASK`]'s twelve, then the run records hash and each of the record's index
/// sets. ARGV: [`SAVE_TASK`]'s, then the record's text, its run id and its time (µs).
/// Returns as [`SAVE_TASK`] does; -1 writes neither.
pub(crate) static SAVE_TASK_AND_RUN: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "local last = #ARGV - 3\n{SAVE_TASK_BODY}{}",
        r"
redis.call('HSET', KEYS[13], ARGV[last + 2], ARGV[last + 1])
for i = 14, #KEYS do redis.call('ZADD', KEYS[i], ARGV[last + 3], ARGV[last + 2]) end
return 1
"
    ))
});

/// What [`SAVE_TASK`] and [`SAVE_TASK_AND_RUN`] share: all of the task's save, its events
/// being `ARGV[7]` to `ARGV[last]`.
const SAVE_TASK_BODY: &str = r"local id, thread, state, base, updated = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
if last > 6 then
  local kind = redis.call('TYPE', KEYS[8]).ok
  if kind ~= 'none' and kind ~= 'list' then return -1 end
end
local seq = redis.call('HGET', KEYS[2], 'seq')
if seq then
  -- A re-save keeps its seq (its place in every listing) but may change state or thread.
  local old = redis.call('HMGET', KEYS[2], 'thread', 'state')
  if old[1] and old[2] and (old[1] ~= thread or old[2] ~= state) then
    redis.call('ZREM', base .. 'tasks-by-thread:' .. old[1], id)
    redis.call('ZREM', base .. 'tasks-by-state:' .. old[2], id)
    redis.call('ZREM', base .. 'tasks-by-thread-state:' .. old[2] .. ':' .. old[1], id)
    redis.call('ZREM', base .. 'tasks-by-update-thread:' .. old[1], id)
    redis.call('ZREM', base .. 'tasks-by-update-state:' .. old[2], id)
    redis.call('ZREM', base .. 'tasks-by-update-thread-state:' .. old[2] .. ':' .. old[1], id)
  end
else
  seq = redis.call('INCR', KEYS[3])
  redis.call('ZADD', KEYS[4], seq, id)
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[2], 'seq', seq, 'thread', thread, 'state', state)
redis.call('ZADD', KEYS[5], seq, id)
redis.call('ZADD', KEYS[6], seq, id)
redis.call('ZADD', KEYS[7], seq, id)
for i = 9, 12 do redis.call('ZADD', KEYS[i], updated, id) end
-- The same entries ADD_TASK_EVENT pushes, in order.
for i = 7, last, 1000 do
  redis.call('RPUSH', KEYS[8], unpack(ARGV, i, math.min(i + 999, last)))
end
";

/// One page of a task index with the total count, as a consistent snapshot.
///
/// KEYS: index zset. ARGV: exclusive lower seq, how many, snapshot key prefix.
/// Returns `{total, {{seq, snapshot}, ...}}`.
pub(crate) static LIST_TASKS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local total = redis.call('ZCARD', KEYS[1])
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. ARGV[1], '+inf',
  'WITHSCORES', 'LIMIT', 0, ARGV[2])
local page = {}
for i = 1, #ids, 2 do
  page[#page + 1] = {ids[i], ids[i + 1], redis.call('GET', ARGV[3] .. ids[i])}
end
return {total, page}
",
    )
});

/// One page of a by-status-time index, newest first, with the count since `min`, as a
/// consistent snapshot. Tasks saved before the index existed are not in it yet: while the
/// tenant's two whole indexes differ in size, nothing is listed and the caller fills it in.
///
/// KEYS: index zset, the tenant's creation index, the tenant's by-status-time index.
/// ARGV: cursor time (µs; `+inf` for the first page), cursor id (`''` for none), least time
/// (`-inf` for no bound), how many, snapshot key prefix.
/// Returns `{total, {{id, time, snapshot}, ...}}`, or `{-1, {}}` when the index is incomplete.
pub(crate) static LIST_TASKS_BY_UPDATE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('ZCARD', KEYS[2]) ~= redis.call('ZCARD', KEYS[3]) then return {-1, {}} end
-- Byte order, as a sorted set orders equal scores (Lua's `<` on strings follows the locale).
local function below(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end
local total = redis.call('ZCOUNT', KEYS[1], ARGV[3], '+inf')
local wanted = tonumber(ARGV[4])
local page, offset = {}, 0
-- Entries at the cursor's own time that come before it (ids not below the cursor's) are
-- skipped; there are rarely any, so this reads about one batch.
while #page < wanted do
  local ids = redis.call('ZREVRANGEBYSCORE', KEYS[1], ARGV[1], ARGV[3],
    'WITHSCORES', 'LIMIT', offset, wanted)
  if #ids == 0 then break end
  for i = 1, #ids, 2 do
    local id, time = ids[i], ids[i + 1]
    if #page < wanted and (ARGV[2] == '' or tonumber(time) < tonumber(ARGV[1]) or below(id, ARGV[2])) then
      page[#page + 1] = {id, time, redis.call('GET', ARGV[5] .. id)}
    end
  end
  offset = offset + wanted
end
return {total, page}
",
    )
});

/// Put a task stored before the by-status-time indexes into them, unless a save already has.
///
/// KEYS: the tenant's by-status-time index, task meta hash. ARGV: task id, status time (µs),
/// tenant key base. Returns 1 when added, 0 when it was there.
pub(crate) static INDEX_TASK_UPDATE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
local meta = redis.call('HMGET', KEYS[2], 'thread', 'state')
local id, time, base, thread, state = ARGV[1], ARGV[2], ARGV[3], meta[1], meta[2]
redis.call('ZADD', KEYS[1], time, id)
if thread and state then
  redis.call('ZADD', base .. 'tasks-by-update-thread:' .. thread, time, id)
  redis.call('ZADD', base .. 'tasks-by-update-state:' .. state, time, id)
  redis.call('ZADD', base .. 'tasks-by-update-thread-state:' .. state .. ':' .. thread, time, id)
end
return 1
",
    )
});

/// Append to a task's event log only if the task exists.
///
/// KEYS: snapshot, events list. ARGV: event. Returns -1 for an unknown task, else the
/// log's length.
pub(crate) static ADD_TASK_EVENT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
return redis.call('RPUSH', KEYS[2], ARGV[1])
",
    )
});

/// Register (or replace) a child under its parent, leaving a previous parent's list.
///
/// KEYS: child hash, parent's children zset. ARGV: record, status, parent, score, child id,
/// children key prefix.
pub(crate) static REGISTER_CHILD: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local old = redis.call('HGET', KEYS[1], 'parent')
if old and old ~= ARGV[3] then redis.call('ZREM', ARGV[6] .. old, ARGV[5]) end
redis.call('HSET', KEYS[1], 'record', ARGV[1], 'status', ARGV[2], 'parent', ARGV[3])
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[5])
return 1
",
    )
});

/// Update a registered child's status. KEYS: child hash. ARGV: status.
/// Returns 0 when the child is not registered.
pub(crate) static SET_CHILD_STATUS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'status', ARGV[1])
return 1
",
    )
});

/// A parent's children with their current status.
///
/// KEYS: children zset. ARGV: child key prefix. Returns `{{id, record, status}, ...}`.
pub(crate) static CHILDREN: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local ids = redis.call('ZRANGE', KEYS[1], 0, -1)
local out = {}
for i = 1, #ids do
  local fields = redis.call('HMGET', ARGV[1] .. ids[i], 'record', 'status')
  out[#out + 1] = {ids[i], fields[1], fields[2]}
end
return out
",
    )
});

/// Add a task record under a fresh seq and index it.
///
/// KEYS: seq counter, records hash, index zsets... ARGV: record, score.
pub(crate) static SAVE_TASK_RECORD: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local seq = redis.call('INCR', KEYS[1])
-- Zero-padded, so records with equal scores sort by save order.
local member = string.format('%020d', seq)
redis.call('HSET', KEYS[2], member, ARGV[1])
for i = 3, #KEYS do redis.call('ZADD', KEYS[i], ARGV[2], member) end
return seq
",
    )
});

/// Store a timer: its record hash and its place in the due index and the thread's index.
///
/// KEYS: the agent's due zset, timer hash, thread's timer zset. ARGV: id, due score (µs),
/// owner namespace, thread, body, agent.
pub(crate) static SCHEDULE_TIMER: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
redis.call('HSET', KEYS[2], 'owner', ARGV[3], 'thread', ARGV[4], 'body', ARGV[5], 'attempts', 0, 'agent', ARGV[6])
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[2], ARGV[1])
return 1
",
    )
});

/// Remove a timer, only for its owner (`ARGV[2]` set) or only under its claim (`ARGV[3]`
/// set); the thread index key and the agent's due zset are derived from the record (a timer
/// without an agent sits in the ownerless due zset, `timers-due`).
///
/// KEYS: timer hash. ARGV: id, owner namespace or '', claim token or '', system key base.
/// Returns 1 when removed, else 0.
pub(crate) static REMOVE_TIMER: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local owner = redis.call('HGET', KEYS[1], 'owner')
if not owner then return 0 end
if ARGV[2] ~= '' and owner ~= ARGV[2] then return 0 end
if ARGV[3] ~= '' and redis.call('HGET', KEYS[1], 'claim') ~= ARGV[3] then return 0 end
local thread = redis.call('HGET', KEYS[1], 'thread')
local agent = redis.call('HGET', KEYS[1], 'agent')
local due = ARGV[4] .. 'timers-due'
if agent and agent ~= '' then due = due .. ':' .. agent end
redis.call('DEL', KEYS[1])
redis.call('ZREM', due, ARGV[1])
redis.call('ZREM', ARGV[4] .. 'timers-of:' .. owner .. ':' .. thread, ARGV[1])
return 1
",
    )
});

/// Claim due timers of one agent and ownerless ones: each gets a claim token, one more
/// attempt, and moves in its due index to the claim's expiry, so it is claimable again only
/// once the claim lapses. The two indexes are merged by score, so the soonest are claimed
/// first whichever index holds them.
///
/// KEYS: the agent's due zset, the ownerless due zset (the same key for the empty agent).
/// ARGV: now (µs), limit, claim expiry (µs), system key base, token prefix.
/// Returns `{{id, body, attempts, token}, ...}`, soonest first.
pub(crate) static CLAIM_TIMERS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local limit = tonumber(ARGV[2])
local keys = {KEYS[1]}
if KEYS[2] ~= KEYS[1] then table.insert(keys, KEYS[2]) end
local due = {}
for _, k in ipairs(keys) do
  local r = redis.call('ZRANGEBYSCORE', k, '-inf', ARGV[1], 'WITHSCORES', 'LIMIT', 0, limit)
  for i = 1, #r, 2 do table.insert(due, {r[i], tonumber(r[i + 1]), k}) end
end
table.sort(due, function(a, b)
  if a[2] ~= b[2] then return a[2] < b[2] end
  return a[1] < b[1]
end)
local out = {}
for i = 1, math.min(#due, limit) do
  local id, index = due[i][1], due[i][3]
  local key = ARGV[4] .. 'timer:' .. id
  local body = redis.call('HGET', key, 'body')
  if body then
    local token = ARGV[5] .. ':' .. i
    local attempts = redis.call('HINCRBY', key, 'attempts', 1)
    redis.call('HSET', key, 'claim', token)
    redis.call('ZADD', index, ARGV[3], id)
    table.insert(out, {id, body, attempts, token})
  else
    redis.call('ZREM', index, id)
  end
end
return out
",
    )
});

/// A thread's timers, soonest first.
///
/// KEYS: thread's timer zset. ARGV: system key base. Returns `{{id, body, attempts}, ...}`.
pub(crate) static THREAD_TIMERS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local ids = redis.call('ZRANGE', KEYS[1], 0, -1)
local out = {}
for _, id in ipairs(ids) do
  local v = redis.call('HMGET', ARGV[1] .. 'timer:' .. id, 'body', 'attempts')
  if v[1] then table.insert(out, {id, v[1], tonumber(v[2])}) end
end
return out
",
    )
});

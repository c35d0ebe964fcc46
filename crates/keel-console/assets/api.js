// The console's only door to the server: the operator API (`/api/v1/...`) and the A2A
// routes of the server that serves this page, with the operator's API key when one is set.

const KEY = 'keel.apiKey';

/** The server's base URL: the console lives at `<base>/console/`. */
export const base = new URL('../', document.baseURI);

/** The API key the operator typed in, kept in this browser only. */
export function apiKey() {
  return localStorage.getItem(KEY) || '';
}

export function setApiKey(key) {
  if (key) localStorage.setItem(KEY, key);
  else localStorage.removeItem(KEY);
}

/** An answer that was not 2xx: its status and the server's `{"error": {code, message}}`. */
export class ApiError extends Error {
  constructor(status, code, message) {
    super(message || `HTTP ${status}`);
    this.status = status;
    this.code = code;
  }

  /** Whether this server has no such route yet (an older server, or a planned route):
   * the A2A fallback answers unknown paths with a numeric code, the operator API never. */
  get routeMissing() {
    return this.status === 405 || (this.status === 404 && typeof this.code !== 'string');
  }
}

function headers(extra) {
  const h = { Accept: 'application/json', ...extra };
  const key = apiKey();
  if (key) h['X-API-Key'] = key;
  return h;
}

/** `fetch` a path under the server's base, JSON in and out; throws an `ApiError`. */
export async function api(path, { method = 'GET', body, query, extra } = {}) {
  const url = new URL(path.replace(/^\//, ''), base);
  for (const [k, v] of Object.entries(query || {})) {
    if (v !== undefined && v !== null && v !== '') url.searchParams.set(k, v);
  }
  const init = { method, headers: headers({ ...(body ? { 'Content-Type': 'application/json' } : {}), ...extra }) };
  if (body) init.body = JSON.stringify(body);
  const response = await fetch(url, init);
  const text = await response.text();
  let json = null;
  try {
    json = text ? JSON.parse(text) : null;
  } catch {
    json = null;
  }
  if (!response.ok) {
    const error = (json && json.error) || {};
    const message = error.message || text || response.statusText;
    throw new ApiError(response.status, error.code, message);
  }
  return json;
}

let rpcId = 0;

/** One A2A v1.0 JSON-RPC call to the agent served at `agentPath` (`/` or `/agents/NAME/`). */
export async function a2a(agentPath, method, params) {
  const answer = await api(agentPath, {
    method: 'POST',
    body: { jsonrpc: '2.0', id: ++rpcId, method, params },
    extra: { 'A2A-Version': '1.0' },
  });
  if (answer && answer.error) {
    throw new ApiError(400, answer.error.code, answer.error.message);
  }
  return answer.result;
}

/** A fresh id for a message or a thread (`crypto.randomUUID` needs a secure context, which
 * a console on a plain-HTTP, non-loopback address is not). */
function newId() {
  if (crypto.randomUUID) return crypto.randomUUID();
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return [...bytes].map((b) => b.toString(16).padStart(2, '0')).join('');
}

/** Send `text` to the agent `agent` (the default one when not given) on `threadId`, or on a
 * new thread, without waiting for the run: answers the task's and thread's ids. */
export async function sendMessage(agent, text, threadId) {
  const thread = threadId || newId();
  try {
    const task = await api(`/api/v1/threads/${encodeURIComponent(thread)}/messages`, {
      method: 'POST',
      body: { text, agent: agent || undefined, return_immediately: true },
    });
    // An agent may answer with a message and start no task: then the thread is what to open.
    return { taskId: task && task.id, threadId: (task && task.thread_id) || thread };
  } catch (err) {
    if (!(err instanceof ApiError) || !err.routeMissing) throw err;
  }
  // A server without the operator's message route: A2A's SendMessage.
  const message = { messageId: newId(), role: 'ROLE_USER', parts: [{ text }], contextId: thread };
  const result = await a2a((agent && agentPaths.get(agent)) || '/', 'SendMessage', {
    message,
    configuration: { returnImmediately: true },
  });
  const task = result.task || result;
  return { taskId: task.id, threadId: task.contextId };
}

/** Approve or deny the action `requestId` a task waits on: the operator route, or the A2A
 * approval part (docs/approvals.md) on a server without that route. */
export async function decide(task, requestId, decision, reason) {
  const path = `/api/v1/tasks/${encodeURIComponent(task.id)}/approvals/${encodeURIComponent(requestId)}`;
  try {
    return await api(path, { method: 'POST', body: { decision, reason: reason || undefined } });
  } catch (err) {
    if (!(err instanceof ApiError) || !err.routeMissing) throw err;
  }
  const approval = { requestId, decision };
  if (reason) approval.reason = reason;
  return a2a(agentPathOf(task), 'SendMessage', {
    message: { messageId: newId(), role: 'ROLE_USER', taskId: task.id, parts: [{ data: { approval } }] },
    configuration: { returnImmediately: true },
  });
}

/** Cancel a task (`409 task_not_cancelable` once it is finished). */
export function cancel(taskId, reason) {
  return api(`/api/v1/tasks/${encodeURIComponent(taskId)}/cancel`, {
    method: 'POST',
    body: reason ? { reason } : {},
  });
}

/** The A2A path of the agent that owns `task` (from its metadata), or the default agent's. */
export function agentPathOf(task) {
  const agent = task && task.metadata && task.metadata.agent;
  return agent && agentPaths.has(agent) ? agentPaths.get(agent) : '/';
}

/** Agent name -> its A2A path, learned when the agents are listed. */
export const agentPaths = new Map();

/**
 * Follow a server-sent event stream at `path` with the operator's credentials (an
 * `EventSource` cannot send headers, so this reads the stream through `fetch`). Each event's
 * `data` is parsed as JSON and handed to `onEvent(data, id)`. When the connection drops it
 * reconnects with `Last-Event-ID`, so the server resumes after the last event seen: no gap,
 * no duplicate. Answers a function that stops it; `onError(err)` hears a refusal (then it
 * stops: a missing route or a 404 does not get better by asking again).
 */
export function follow(path, onEvent, onError) {
  const controller = new AbortController();
  let lastId = null;
  let stopped = false;
  const run = async () => {
    let delay = 250;
    while (!stopped) {
      try {
        const h = headers({ Accept: 'text/event-stream' });
        if (lastId !== null) h['Last-Event-ID'] = lastId;
        const response = await fetch(new URL(path.replace(/^\//, ''), base), {
          headers: h,
          signal: controller.signal,
        });
        if (!response.ok) {
          let error = {};
          try {
            error = (await response.json()).error || {};
          } catch {
            error = {};
          }
          throw new ApiError(response.status, error.code, error.message);
        }
        delay = 250;
        const refused = await readStream(response.body, (data, id) => {
          if (id !== null) lastId = id;
          onEvent(data, id);
        });
        if (refused) throw new ApiError(500, refused.code, refused.message);
      } catch (err) {
        if (stopped || controller.signal.aborted) return;
        if (err instanceof ApiError) {
          onError(err);
          return;
        }
      }
      // The stream ended or broke: ask again from the last event seen.
      await new Promise((resolve) => setTimeout(resolve, delay));
      delay = Math.min(delay * 2, 5000);
    }
  };
  run();
  return () => {
    stopped = true;
    controller.abort();
  };
}

/** Reads SSE blocks from `body`, handing each `data:` (JSON) and `id:` to `deliver`, until
 * the stream ends (answers nothing) or sends an `event: error` (answers its `error`). */
async function readStream(body, deliver) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return null;
    buffer += value;
    let end;
    while ((end = buffer.search(/\r?\n\r?\n/)) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end).replace(/^\r?\n\r?\n/, '');
      const data = [];
      let id = null;
      let name = 'message';
      for (const line of block.split(/\r?\n/)) {
        if (line.startsWith('data:')) data.push(line.slice(5).replace(/^ /, ''));
        else if (line.startsWith('id:')) id = line.slice(3).trim();
        else if (line.startsWith('event:')) name = line.slice(6).trim();
      }
      if (data.length === 0) continue;
      let parsed;
      try {
        parsed = JSON.parse(data.join('\n'));
      } catch {
        continue;
      }
      if (name === 'error') return (parsed && parsed.error) || { message: 'the event stream failed' };
      deliver(parsed, id);
    }
  }
}

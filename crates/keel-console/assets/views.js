// The console's pages: agents, threads, one thread's tasks, one task (its conversation,
// artifacts, pending approval and run), pending approvals, and the chat box.

import { agentPaths, api, ApiError, cancel, decide, follow, sendMessage } from './api.js';
import { h, json, when } from './dom.js';
import { analyze, fromTaskEvent, narrowBudget, renderRun } from './run.js';

const TERMINAL = ['completed', 'failed', 'canceled', 'rejected'];

function stateBadge(state) {
  return h('span', { class: `state ${state || ''}`, 'data-state': state || '' }, state || '?');
}

function localTime(ts) {
  return ts ? new Date(ts).toLocaleString() : '';
}

function errorBox(err) {
  if (err instanceof ApiError && err.status === 401) {
    return h('p', { class: 'error', 'data-error': 'unauthorized' }, 'This server needs an API key: type it in at the top right.');
  }
  return h('p', { class: 'error' }, err.message || String(err));
}

/** A list that pages on the server: `load(token)` answers `{items, next}`. */
function pager(load, renderItem, empty) {
  const list = h('div', { class: 'list' });
  const more = h('button', { class: 'more', type: 'button', hidden: true }, 'More');
  let next = null;
  const fetchPage = async (token) => {
    more.disabled = true;
    try {
      const page = await load(token);
      if (!token && page.items.length === 0) list.append(h('p', { class: 'empty' }, empty));
      for (const item of page.items) list.append(renderItem(item));
      next = page.next;
      more.hidden = !next;
    } catch (err) {
      list.append(errorBox(err));
    } finally {
      more.disabled = false;
    }
  };
  more.addEventListener('click', () => fetchPage(next));
  fetchPage(null);
  return h('div', {}, [list, more]);
}

/** The served agents: `GET /api/v1/agents`, or the default agent's card on an older server. */
export async function agents() {
  try {
    const answer = await api('/api/v1/agents');
    const list = Array.isArray(answer) ? answer : answer.agents || [];
    for (const a of list) agentPaths.set(a.name, a.default ? '/' : `/agents/${encodeURIComponent(a.name)}/`);
    return list;
  } catch (err) {
    if (!(err instanceof ApiError) || !err.routeMissing) throw err;
  }
  const card = await api('/.well-known/agent-card.json');
  agentPaths.set(card.name, '/');
  return [{ ...card, path: '/' }];
}

export async function agentsView() {
  const list = await agents();
  return h('section', {}, [
    h('h2', {}, 'Agents'),
    h('div', { class: 'cards' }, list.map((a) => h('article', { class: 'card', 'data-agent': a.name }, [
      h('h3', {}, a.name),
      h('p', {}, a.description || ''),
      when(a.version, () => h('p', { class: 'muted' }, `version ${a.version}`)),
      when((a.skills || []).length, () => h('div', {}, [h('h4', {}, 'Skills'), h('ul', {}, a.skills.map((s) => h('li', {}, [h('strong', {}, s.name || s.id), ' ', s.description || ''])))])),
      when((a.tools || []).length, () => h('div', {}, [h('h4', {}, 'Tools'), h('ul', { class: 'tools-list' }, a.tools.map((t) => h('li', {}, [h('code', {}, t.name || t), ' ', t.description || ''])))])),
      when(Object.keys(a.budget || {}).length, () => h('div', { class: 'limits' }, [h('h4', {}, 'Run limits'), h('ul', {}, Object.entries(a.budget).map(([k, v]) => h('li', { 'data-limit': k }, [h('code', {}, k), ' ', String(v)])))])),
      h('a', { class: 'button', href: `#/chat/${encodeURIComponent(a.name)}` }, 'Chat'),
    ]))),
  ]);
}

export function threadsView() {
  const load = async (token) => {
    try {
      const page = await api('/api/v1/threads', { query: { page_size: 25, page_token: token } });
      return { items: page.threads || [], next: page.next_page_token };
    } catch (err) {
      if (!(err instanceof ApiError) || !err.routeMissing) throw err;
    }
    // A server without the threads list: the threads of the latest tasks.
    const page = await api('/api/v1/tasks', { query: { page_size: 100, page_token: token } });
    const seen = new Map();
    for (const t of page.tasks) if (!seen.has(t.thread_id)) seen.set(t.thread_id, { thread_id: t.thread_id, agent: t.metadata && t.metadata.agent, updated_at: t.status && t.status.timestamp });
    return { items: [...seen.values()], next: page.next_page_token };
  };
  const row = (t) => {
    const id = t.thread_id || t.id;
    return h('a', { class: 'item', href: `#/thread/${encodeURIComponent(id)}`, 'data-thread': id }, [
      h('code', {}, id),
      h('span', { class: 'muted' }, [t.agent || '', ' ', localTime(t.updated_at || t.created_at)]),
      when(t.task_count !== undefined, () => h('span', { class: 'muted' }, `${t.task_count} tasks`)),
    ]);
  };
  return h('section', {}, [h('h2', {}, 'Threads'), pager(load, row, 'No threads yet: start one from Chat.')]);
}

function taskRow(t) {
  return h('a', { class: 'item', href: `#/thread/${encodeURIComponent(t.thread_id)}/task/${encodeURIComponent(t.id)}`, 'data-task': t.id }, [
    stateBadge(t.status && t.status.state),
    h('code', {}, t.id),
    h('span', { class: 'muted' }, [(t.metadata && t.metadata.agent) || '', ' ', localTime(t.created_at)]),
  ]);
}

export function threadView(threadId) {
  const load = async (token) => {
    const page = await api('/api/v1/tasks', { query: { thread_id: threadId, page_size: 20, page_token: token } });
    return { items: page.tasks, next: page.next_page_token };
  };
  // Its family and queue: the parent that started it as a subagent, its subagents' threads.
  const family = h('div', { class: 'family' });
  api(`/api/v1/threads/${encodeURIComponent(threadId)}`).then((detail) => {
    const link = (id, text) => h('a', { href: `#/thread/${encodeURIComponent(id)}` }, text || id);
    family.replaceChildren(...[
      when(detail.parent_thread_id, () => h('p', {}, ['Subagent of thread ', link(detail.parent_thread_id)])),
      when(detail.terminated_at, () => h('p', { class: 'muted' }, `Terminated ${localTime(detail.terminated_at)}`)),
      when(detail.queued, () => h('p', { class: 'muted' }, `${detail.queued} queued`)),
      when((detail.children || []).length, () => h('div', { class: 'children' }, [
        h('h4', {}, 'Subagents'),
        h('ul', {}, detail.children.map((c) => h('li', {}, [link(c.thread_id, c.name), ` ${c.agent} · ${c.status}`]))),
      ])),
    ].filter(Boolean));
  }).catch(() => {});
  return h('section', {}, [
    h('h2', {}, ['Thread ', h('code', {}, threadId)]),
    family,
    chatBox({ threadId }),
    h('h3', {}, 'Tasks'),
    pager(load, taskRow, 'No tasks on this thread.'),
  ]);
}

/** The chat box: send a message to an agent (on a thread when given) and open its task. */
export function chatBox({ agent, threadId, agentNames }) {
  const text = h('textarea', { name: 'message', rows: 3, placeholder: 'Message the agent…', required: true });
  const pick = agentNames && agentNames.length > 1
    ? h('select', { name: 'agent' }, agentNames.map((n) => h('option', { value: n, selected: n === agent }, n)))
    : null;
  const status = h('span', { class: 'muted' });
  const form = h('form', { class: 'chat' }, [
    pick,
    text,
    h('button', { type: 'submit' }, 'Send'),
    status,
  ]);
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    const name = pick ? pick.value : agent;
    status.textContent = 'sending…';
    try {
      const sent = await sendMessage(name, text.value, threadId);
      text.value = '';
      status.textContent = '';
      const thread = `#/thread/${encodeURIComponent(sent.threadId)}`;
      location.hash = sent.taskId ? `${thread}/task/${encodeURIComponent(sent.taskId)}` : thread;
    } catch (err) {
      status.textContent = err.message;
    }
  });
  return form;
}

export async function chatView(agent) {
  const list = await agents();
  const names = list.map((a) => a.name);
  const chosen = agent && names.includes(agent) ? agent : names[0];
  return h('section', {}, [
    h('h2', {}, 'Chat'),
    h('p', { class: 'muted' }, 'A new thread: the run opens live once the message is sent.'),
    chatBox({ agent: chosen, agentNames: names }),
  ]);
}

/** The task: `GET /api/v1/tasks/{id}`, or found in its thread's list on an older server. */
async function loadTask(threadId, taskId) {
  try {
    const answer = await api(`/api/v1/tasks/${encodeURIComponent(taskId)}`);
    return answer.task || answer;
  } catch (err) {
    if (!(err instanceof ApiError) || !err.routeMissing) throw err;
  }
  let token = null;
  do {
    const page = await api('/api/v1/tasks', { query: { thread_id: threadId, page_size: 100, page_token: token } });
    const found = page.tasks.find((t) => t.id === taskId);
    if (found) return found;
    token = page.next_page_token;
  } while (token);
  throw new ApiError(404, 'task_not_found', `no task ${taskId}`);
}

function partsOf(parts) {
  return (parts || []).map((p) => {
    if (p.text !== undefined) return h('p', { class: 'text' }, p.text);
    if (p.type === 'file' || p.file || p.uri) {
      const uri = p.uri || (p.file && p.file.uri);
      const name = p.name || (p.file && p.file.name) || uri || 'file';
      return uri ? h('a', { href: uri, target: '_blank', rel: 'noopener' }, name) : h('span', {}, name);
    }
    return json(p.data ?? p);
  });
}

function conversation(messages) {
  return h('div', { class: 'conversation' }, messages.map(({ message: m }) => {
    const calls = (m.tool_calls || []).map((c) => h('div', { class: 'call' }, [h('code', {}, c.name), json(c.arguments)]));
    const body = m.role === 'tool'
      ? [h('code', {}, m.tool_name || 'tool'), json(m.content)]
      : [m.content ? h('p', { class: 'text' }, m.content) : null, ...calls];
    return h('div', { class: `message ${m.role}` }, [h('span', { class: 'role' }, m.role), h('div', {}, body)]);
  }));
}

function approvalCard(task, onDone) {
  const pending = task.metadata && task.metadata.pending_approval;
  if (!pending) return null;
  const action = pending.action || {};
  const reason = h('input', { type: 'text', name: 'reason', placeholder: 'reason (optional)' });
  const status = h('span', { class: 'muted' });
  const act = (decision) => async () => {
    status.textContent = `${decision === 'approve' ? 'approving' : 'denying'}…`;
    try {
      await decide(task, pending.request_id || pending.id, decision, reason.value);
      status.textContent = decision === 'approve' ? 'approved' : 'denied';
      onDone();
    } catch (err) {
      status.textContent = err.message;
    }
  };
  return h('div', { class: 'approval', 'data-request': pending.request_id }, [
    h('h4', {}, ['Waiting for approval: ', h('code', {}, action.name || action.kind)]),
    when(action.description, () => h('p', { class: 'muted' }, action.description)),
    json(action.payload),
    h('p', {}, pending.reason || ''),
    h('div', { class: 'actions' }, [
      reason,
      h('button', { type: 'button', class: 'approve', onclick: act('approve') }, 'Approve'),
      h('button', { type: 'button', class: 'deny', onclick: act('deny') }, 'Deny'),
      status,
    ]),
  ]);
}

/** One task, live: its state, approval, conversation, artifacts and its run's timeline.
 * Answers the element and a function that stops following it. */
export function taskView(threadId, taskId, chosenRun) {
  const root = h('section', { class: 'task', 'data-task': taskId });
  const header = h('div', { class: 'task-head' });
  const approval = h('div');
  const talk = h('div');
  const artifacts = h('div');
  const runBox = h('div');
  const runsBox = h('p', { class: 'runs muted' });
  root.append(
    h('p', {}, h('a', { href: `#/thread/${encodeURIComponent(threadId)}` }, '← thread')),
    header, approval, runsBox, runBox, h('h3', {}, 'Conversation'), talk, artifacts, chatBox({ threadId }),
  );
  let task = null;
  let runId = null;
  let report = null;
  // The limits of the task's agent, read once: a run's figures are shown against them.
  let agentBudget = null;
  // The run's events from its report, and what the task's live events tell of it since.
  const events = new Map();
  const live = new Map();
  // The run's model calls as they happen (`event: run` on the task's stream, from the
  // process that runs it), until its report has them.
  const liveRun = new Map();
  let stopped = false;
  let stopFollow = () => {};
  let timer = null;
  let frame = null;

  const draw = () => {
    frame = null;
    if (!task) return;
    const state = task.status && task.status.state;
    root.dataset.state = state || '';
    header.replaceChildren(...[
      h('h2', {}, ['Task ', h('code', {}, task.id), ' ', stateBadge(state)]),
      h('p', { class: 'muted' }, [(task.metadata && task.metadata.agent) || '', ' · created ', localTime(task.created_at)]),
      when(!TERMINAL.includes(state), () => h('button', { type: 'button', class: 'cancel', onclick: onCancel }, 'Cancel')),
      when(task.status && task.status.message, () => h('div', { class: 'status-message' }, partsOf(task.status.message.parts))),
    ].filter(Boolean));
    approval.replaceChildren(...[approvalCard(task, refresh)].filter(Boolean));
    const list = task.artifacts || [];
    artifacts.replaceChildren(...(list.length ? [h('h3', {}, 'Artifacts'), ...list.map((a) => h('div', { class: 'artifact', 'data-artifact': a.name || a.id }, [h('h4', {}, a.name || a.id), ...partsOf(a.parts)]))] : []));
    const reported = [...events.values()].filter((e) => !runId || e.run_id === runId || !e.run_id);
    const since = reported.reduce((latest, e) => Math.max(latest, Date.parse(e.timestamp)), 0);
    // The task's live events belong to its latest run, not to an earlier one chosen.
    const newer = chosenRun ? [] : [...live.values()].flat().filter((e) => Date.parse(e.timestamp) > since);
    const pending = !chosenRun && task.metadata && task.metadata.pending_approval;
    if (pending && !reported.some((e) => e.type === 'approval.required')) {
      const callId = pending.action && pending.action.metadata && pending.action.metadata.call_id;
      newer.push({ type: 'approval.required', sequence: 2e9, timestamp: pending.requested_at, action_id: callId, payload: { request: pending } });
    }
    const calls = chosenRun ? [] : [...liveRun.values()].filter((e) => (!runId || e.run_id === runId) && !events.has(e.sequence));
    const run = analyze([...reported, ...newer, ...calls], Date.now());
    const limits = narrowBudget(task.metadata && task.metadata.run_context && task.metadata.run_context.budget, agentBudget);
    runBox.replaceChildren(renderRun(run, { runId, report, limits }));
  };
  const redraw = () => {
    if (frame === null) frame = requestAnimationFrame(draw);
  };
  const loadConversation = async () => {
    // The task's own entries, read on the server back from the thread's end: on a long
    // thread a page or two, not the thread's first messages.
    const answer = await api(`/api/v1/tasks/${encodeURIComponent(taskId)}/messages`);
    talk.replaceChildren(conversation(answer.messages || []));
  };
  const loadAgentBudget = async () => {
    if (agentBudget !== null) return;
    const name = task.metadata && task.metadata.agent;
    const list = await agents().catch(() => []);
    const agent = list.find((a) => a.name === name) || list.find((a) => a.default);
    agentBudget = (agent && agent.budget) || {};
  };
  const loadRuns = async () => {
    // A task resumed by another process, or after a restart, has several runs: link them all.
    const page = await api('/api/v1/runs', { query: { task_id: taskId, page_size: 20 } }).catch(() => null);
    const runs = (page && page.runs) || [];
    runsBox.replaceChildren(...(runs.length > 1 ? ['Runs: ', ...runs.flatMap((r, i) => [
      i ? ', ' : '',
      h('a', { href: `#/thread/${encodeURIComponent(threadId)}/task/${encodeURIComponent(taskId)}/run/${encodeURIComponent(r.run_id)}`, class: r.run_id === runId ? 'current' : '' }, h('code', {}, r.run_id.slice(-8))),
    ])] : []));
  };
  const loadRun = async () => {
    if (!runId) return;
    try {
      const record = await api(`/api/v1/runs/${encodeURIComponent(runId)}`);
      report = record.report || record;
      for (const e of report.events || []) events.set(e.sequence, e);
    } catch (err) {
      // A run still in its first segment has no report yet: its events come live.
      if (!(err instanceof ApiError) || err.status !== 404) throw err;
    }
  };
  async function refresh() {
    try {
      task = await loadTask(threadId, taskId);
      const current = chosenRun || (task.metadata && ((task.metadata.run_context || {}).run_id || task.metadata.run_id)) || null;
      if (current !== runId) {
        runId = current;
        events.clear();
      }
      await Promise.all([loadRun(), loadConversation(), loadRuns(), loadAgentBudget()]);
      // A finished task's stream has ended: stop asking for it again.
      if (TERMINAL.includes(task.status && task.status.state)) stopFollow();
      redraw();
    } catch (err) {
      header.replaceChildren(errorBox(err));
    }
  }
  async function onCancel() {
    try {
      await cancel(taskId, 'canceled from the console');
    } catch (err) {
      if (!(err instanceof ApiError) || err.code !== 'task_not_cancelable') header.append(errorBox(err));
    }
    refresh();
  }
  const poll = () => {
    // Without the live route: read the task and its run again until it rests.
    timer = setTimeout(async () => {
      if (stopped) return;
      await refresh();
      const state = task && task.status && task.status.state;
      if (!TERMINAL.includes(state)) poll();
    }, 1000);
  };
  let refreshing = null;
  const onEvent = (data) => {
    if (data && data.run_event) {
      // A model call's start or end: drawn at once, nothing to read again.
      const e = data.run_event;
      liveRun.set(`${e.run_id}:${e.sequence}`, e);
      redraw();
      return;
    }
    if (!data || !data.event || data.seq === undefined) return;
    live.set(data.seq, fromTaskEvent(data.seq, data.event));
    // The task's state, approval, messages and artifacts, and the run's report when it rests:
    // read them again once a burst of events settles.
    clearTimeout(refreshing);
    refreshing = setTimeout(refresh, 100);
    redraw();
  };
  refresh().then(() => {
    if (stopped || (task && TERMINAL.includes(task.status && task.status.state))) return;
    stopFollow = follow(`/api/v1/tasks/${encodeURIComponent(taskId)}/events`, onEvent, (err) => {
      if (err.routeMissing) poll();
      else header.append(errorBox(err));
    });
  });
  const ticker = setInterval(() => {
    if (task && !TERMINAL.includes(task.status && task.status.state)) redraw();
  }, 500);
  const stop = () => {
    stopped = true;
    stopFollow();
    clearTimeout(timer);
    clearTimeout(refreshing);
    clearInterval(ticker);
  };
  return { node: root, stop };
}

export function approvalsView() {
  const load = async (token) => {
    const page = await api('/api/v1/approvals', { query: { page_size: 25, page_token: token } });
    return { items: page.approvals || [], next: page.next_page_token };
  };
  const row = (p) => {
    const task = { id: p.task_id, thread_id: p.thread_id, metadata: { pending_approval: p.request, agent: p.agent } };
    const card = approvalCard(task, () => {
      card.replaceWith(h('p', { class: 'muted' }, `Decided: task ${p.task_id}`));
    });
    return h('div', { class: 'pending' }, [
      h('p', {}, h('a', { href: `#/thread/${encodeURIComponent(p.thread_id)}/task/${encodeURIComponent(p.task_id)}` }, ['task ', h('code', {}, p.task_id)])),
      card,
    ]);
  };
  return h('section', {}, [h('h2', {}, 'Pending approvals'), pager(load, row, 'Nothing waits for a decision.')]);
}

// A run read from its events (the persisted report's, then the live stream's): its steps,
// model calls, tool calls with policy and approvals, budget, children; and its view.

import { duration, timeline, tokenChart } from './charts.js';
import { h, json, when } from './dom.js';

const ms = (e) => Date.parse(e.timestamp);

/** What a run's events say, in the shapes the view draws. `now` closes what is still open. */
export function analyze(events, now) {
  const sorted = [...events].sort((a, b) => a.sequence - b.sequence);
  const root = sorted.find((e) => !e.parent_span_id);
  const runSpan = root ? root.span_id : null;
  const stepOfSpan = new Map();
  for (const e of sorted) {
    if (e.step && e.parent_span_id === runSpan) stepOfSpan.set(e.span_id, e.step);
  }
  const stepOf = (e) => e.step || stepOfSpan.get(e.parent_span_id) || null;
  const steps = new Map();
  const models = new Map();
  const tools = new Map();
  const toolOfAction = new Map();
  const children = [];
  let state = null;
  let finished = null;
  const usage = { steps: 0, llm_calls: 0, tool_calls: 0, input_tokens: 0, output_tokens: 0 };
  const tool = (e, action) => {
    const callId = action && action.metadata && action.metadata.call_id;
    const key = toolOfAction.get(e.action_id) || callId || e.action_id;
    toolOfAction.set(e.action_id, key);
    if (!tools.has(key)) tools.set(key, { key, step: stepOf(e), name: action ? action.name : '?', args: action ? action.payload : undefined });
    return tools.get(key);
  };
  for (const e of sorted) {
    const t = ms(e);
    const step = stepOf(e);
    if (step) {
      const s = steps.get(step) || { step, start: t, end: t, input: 0, output: 0 };
      s.start = Math.min(s.start, t);
      s.end = Math.max(s.end, t);
      steps.set(step, s);
    }
    const p = e.payload || {};
    switch (e.type) {
      case 'context.prepared':
        models.set(e.span_id, { ...(models.get(e.span_id) || {}), manifest: p.manifest });
        break;
      case 'llm.call.started':
        models.set(e.span_id, { ...(models.get(e.span_id) || {}), step, start: t, model: p.model, provider: p.provider, estimated: p.estimated_input_tokens });
        break;
      case 'llm.call.completed': {
        const m = models.get(e.span_id) || { step, start: t };
        Object.assign(m, { end: t, input: p.input_tokens || 0, output: p.output_tokens || 0, latency: p.latency_ms, finish: p.finish_reason, model: p.model || m.model });
        models.set(e.span_id, m);
        usage.llm_calls += 1;
        usage.input_tokens += m.input;
        usage.output_tokens += m.output;
        if (step && steps.has(step)) {
          steps.get(step).input += m.input;
          steps.get(step).output += m.output;
        }
        break;
      }
      case 'action.requested':
        tool(e, p.action).requested = t;
        break;
      case 'action.policy':
        tool(e).policy = { decision: p.decision, reason: p.reason };
        break;
      case 'approval.required': {
        const entry = tool(e, p.request && p.request.action);
        entry.approval = { requestId: p.request && p.request.request_id, start: t, reason: p.request && p.request.reason };
        break;
      }
      case 'approval.decided': {
        const entry = tool(e);
        const d = p.decision || {};
        entry.approval = { ...(entry.approval || { start: t }), end: t, outcome: d.outcome, reason: d.reason, by: d.decided_by };
        break;
      }
      case 'action.started':
        tool(e, p.action).start = t;
        usage.tool_calls += 1;
        break;
      case 'action.completed':
      case 'action.failed':
      case 'action.denied': {
        const entry = tool(e);
        entry.end = t;
        entry.outcome = e.type.slice('action.'.length);
        if ('output' in p) entry.output = p.output;
        if (p.error !== undefined) entry.error = p.error;
        if (p.reason !== undefined) entry.reason = p.reason;
        if (p.duration_ms !== undefined) entry.durationMs = p.duration_ms;
        if (entry.start === undefined) entry.start = entry.requested ?? t;
        break;
      }
      case 'task.status':
        if (p.state) state = p.state;
        if (e.final && ['completed', 'failed', 'canceled', 'rejected'].includes(p.state)) finished = t;
        break;
      default:
        break;
    }
    for (const key of ['child_thread_id', 'child_task_id', 'child_run_id']) {
      if (p[key]) children.push({ type: e.type, name: p.name || p.subagent || p.agent, thread: p.child_thread_id, task: p.task_id || p.child_task_id, run: p.child_run_id });
    }
  }
  usage.steps = steps.size;
  const start = sorted.length ? ms(sorted[0]) : now;
  const last = sorted.length ? ms(sorted[sorted.length - 1]) : now;
  // Until the run's final status, it is open: a run waiting for an approval or for input
  // keeps growing too, so the wait shows for as long as it lasts.
  const open = finished === null;
  const end = finished ?? Math.max(now, last);
  const seen = new Set();
  return {
    events: sorted,
    state,
    start,
    end,
    open,
    steps: [...steps.values()].sort((a, b) => a.step - b.step),
    models: [...models.values()].filter((m) => m.start !== undefined),
    tools: [...tools.values()],
    children: children.filter((c) => {
      const k = `${c.thread}/${c.task}/${c.run}`;
      return !seen.has(k) && seen.add(k);
    }),
    usage,
  };
}

/** What a task's live event (`GET /api/v1/tasks/{id}/events`: `{seq, event}`) tells of its
 * run, in the shape of the run's own events, so that the timeline grows while the run goes on
 * (the run's report, with every step, is read when the run rests). Tool calls and results
 * are matched by their call id, as the report's actions are. */
export function fromTaskEvent(seq, event) {
  const sequence = 1e9 + seq;
  if (event.type === 'status_update') {
    const status = event.status || {};
    return [{ type: 'task.status', sequence, timestamp: status.timestamp, final: event.final, payload: { state: status.state } }];
  }
  if (event.type !== 'message' || !event.message) return [];
  const m = event.message;
  return (m.parts || []).flatMap((p, i) => {
    const base = { sequence: sequence + i / 100, timestamp: m.timestamp, action_id: p.call_id };
    if (p.type === 'tool_call') {
      const action = { name: p.tool_name, payload: p.args, metadata: { call_id: p.call_id } };
      return [{ ...base, type: 'action.started', payload: { action } }];
    }
    if (p.type === 'tool_output') {
      return [{ ...base, type: p.is_error ? 'action.failed' : 'action.completed', payload: p.is_error ? { error: p.output } : { output: p.output } }];
    }
    return [];
  });
}

/** The timeline's rows: the run, then each step with its model calls, approvals and tools. */
export function rows(run) {
  const out = [{ label: 'run', kind: 'run', start: run.start, end: run.end, open: run.open }];
  for (const s of run.steps) {
    out.push({ label: `step ${s.step}`, kind: 'step', start: s.start, end: Math.max(s.end, run.open ? run.end : s.end), open: run.open && s === run.steps[run.steps.length - 1] });
    const inner = [];
    for (const m of run.models.filter((m) => m.step === s.step)) {
      inner.push({ label: `model ${m.model || ''}`, kind: 'model', start: m.start, end: m.end ?? run.end, open: m.end === undefined, title: `${m.model}: ${m.input ?? '?'} in / ${m.output ?? '?'} out tokens` });
    }
    for (const t of run.tools.filter((t) => t.step === s.step)) {
      if (t.approval) {
        inner.push({ label: `approval ${t.name}`, kind: 'approval', start: t.approval.start, end: t.approval.end ?? run.end, open: t.approval.end === undefined, title: t.approval.outcome ? `${t.approval.outcome} by ${t.approval.by}` : 'waiting for a decision' });
      }
      if (t.start !== undefined) {
        inner.push({ label: `tool ${t.name}`, kind: t.outcome === 'failed' || t.outcome === 'denied' ? 'failed' : 'tool', start: t.start, end: t.end ?? run.end, open: t.end === undefined, title: `${t.name} ${t.outcome || 'running'}` });
      }
    }
    inner.sort((a, b) => a.start - b.start);
    out.push(...inner.map((r) => ({ ...r, indent: true })));
  }
  // Calls known only from the task's live events, before the run's report names their step.
  for (const t of run.tools.filter((t) => !t.step && t.start !== undefined)) {
    out.push({ label: `tool ${t.name}`, kind: t.outcome === 'failed' ? 'failed' : 'tool', start: t.start, end: t.end ?? run.end, open: t.end === undefined, title: `${t.name} ${t.outcome || 'running'}` });
  }
  return out;
}

/**
 * The limits a run works under: its caller's budget (`run_context.budget`) narrowed by its
 * agent's (`GET /api/v1/agents`), limit by limit, as the engine narrows them.
 */
export function narrowBudget(caller, agent) {
  const out = { ...(agent || {}) };
  for (const [k, v] of Object.entries(caller || {})) {
    if (v !== null && v !== undefined) out[k] = out[k] === undefined || out[k] === null ? v : Math.min(out[k], v);
  }
  return out;
}

/** The figures of a budget: what the run used against its limits (`max_*`), as meters. */
function budget(used, limits) {
  const pairs = [
    ['steps', 'max_steps'],
    ['llm_calls', 'max_llm_calls'],
    ['tool_calls', 'max_tool_calls'],
    ['input_tokens', 'max_input_tokens'],
    ['output_tokens', 'max_output_tokens'],
    // Time and cost show only against a limit.
    ['runtime_seconds', 'max_runtime_seconds', true],
    ['cost_micros', 'max_cost_micros', true],
  ].filter(([, max, limitedOnly]) => !limitedOnly || (limits && limits[max]));
  return h('div', { class: 'budget' }, pairs.map(([k, max]) => {
    const limit = limits && limits[max];
    const raw = used[k] ?? 0;
    const value = k === 'runtime_seconds' ? Math.round(raw * 10) / 10 : raw;
    const meter = limit ? h('meter', { min: 0, max: limit, value, high: limit * 0.8, optimum: 0 }) : null;
    return h('div', { class: 'figure', 'data-figure': k }, [
      h('span', { class: 'name' }, k.replace('_', ' ')),
      h('strong', {}, limit ? `${value} / ${limit}` : String(value)),
      meter,
    ]);
  }));
}

/** Where a fork (`keel replay RUN --fork-at N`) came from, as its report's metadata says. */
function forkedFrom(report) {
  const source = report && report.metadata && report.metadata['keel.forked_from'];
  if (!source || !source.run_id) return null;
  return h('p', { class: 'forked', 'data-forked-from': source.run_id }, [
    'Forked from run ', h('code', {}, source.run_id), ` at model call ${source.step}: the calls before it were served from that run's recording.`,
  ]);
}

/** The run view: figures, budget, the timeline, token use, tool and model calls, events. */
export function renderRun(run, { runId, report, limits }) {
  const used = { ...run.usage, ...((report && report.budget && report.budget.usage) || {}) };
  const tools = run.tools.map((t) =>
    h('tr', { class: `tool ${t.outcome || 'pending'}`, 'data-tool': t.name }, [
      h('td', {}, String(t.step ?? '')),
      h('td', {}, h('code', {}, t.name)),
      h('td', {}, json(t.args)),
      h('td', {}, t.policy ? `${t.policy.decision}` : ''),
      h('td', {}, t.approval ? (t.approval.outcome ? `${t.approval.outcome} (${t.approval.by || ''})` : 'waiting') : ''),
      h('td', { class: 'result' }, t.error !== undefined ? json(t.error) : t.output !== undefined ? json(t.output) : t.reason || ''),
      h('td', {}, t.durationMs !== undefined ? duration(t.durationMs) : t.end !== undefined && t.start !== undefined ? duration(t.end - t.start) : ''),
    ]));
  const models = run.models.map((m) =>
    h('tr', {}, [
      h('td', {}, String(m.step ?? '')),
      h('td', {}, m.model || ''),
      h('td', {}, m.manifest ? `~${m.manifest.total_estimated_tokens}` : ''),
      h('td', {}, String(m.input ?? '')),
      h('td', {}, String(m.output ?? '')),
      h('td', {}, m.end !== undefined ? duration(m.end - m.start) : 'running'),
      h('td', {}, m.finish || ''),
    ]));
  return h('section', { class: 'run', 'data-run': runId, 'data-state': run.state || '' }, [
    h('h3', {}, ['Run ', h('code', {}, runId || ''), ' ', h('span', { class: `state ${run.state || ''}` }, run.state || '…')]),
    forkedFrom(report),
    h('p', { class: 'figures' }, `${duration(run.end - run.start)} · ${run.steps.length} steps · ${used.llm_calls} model calls · ${used.input_tokens} in / ${used.output_tokens} out tokens · ${used.tool_calls} tool calls`),
    budget(used, limits),
    h('div', { class: 'pictures' }, [
      h('figure', { class: 'timeline-figure' }, [timeline({ start: run.start, end: run.end, rows: rows(run) }), h('figcaption', {}, 'Timeline: a bar per step, model call, approval and tool call')]),
      when(run.steps.length, () => h('figure', { class: 'tokens-figure' }, [tokenChart(run.steps), h('figcaption', {}, [h('span', { class: 'swatch input' }), ' input ', h('span', { class: 'swatch output' }), ' output tokens per step'])])),
    ]),
    when(run.tools.length, () => h('table', { class: 'tools' }, [
      h('thead', {}, h('tr', {}, ['step', 'tool', 'arguments', 'policy', 'approval', 'result', 'took'].map((c) => h('th', {}, c)))),
      h('tbody', {}, tools),
    ])),
    when(run.models.length, () => h('table', { class: 'models' }, [
      h('thead', {}, h('tr', {}, ['step', 'model', 'context', 'in', 'out', 'took', 'finish'].map((c) => h('th', {}, c)))),
      h('tbody', {}, models),
    ])),
    when(run.children.length, () => h('div', { class: 'children' }, [
      h('h4', {}, 'Child runs'),
      h('ul', {}, run.children.map((c) => h('li', {}, h('a', { href: c.task ? `#/thread/${c.thread}/task/${c.task}` : `#/thread/${c.thread}` }, `${c.name || c.type} → ${c.task || c.thread}`)))),
    ])),
    h('details', { class: 'events' }, [
      h('summary', {}, `${run.events.length} events`),
      h('ol', {}, run.events.map((e) => h('li', { value: e.sequence, class: e.severity || '' }, [h('code', {}, e.type), ' ', e.summary || '']))),
    ]),
  ]);
}

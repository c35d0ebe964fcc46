// The console's entry: the API key form, the page for the location's hash, and the count of
// pending approvals in the header.

import { api, apiKey, setApiKey } from './api.js';
import { h } from './dom.js';
import { agentsView, approvalsView, chatView, taskView, threadsView, threadView } from './views.js';

const view = document.getElementById('view');
const notice = document.getElementById('notice');
let stopCurrent = () => {};
// Counts route changes: a page whose data arrives after the location moved on is dropped, so a
// slow first page never paints over the one the user (or a link) went to meanwhile.
let routed = 0;

function show(message) {
  notice.textContent = message;
  notice.hidden = !message;
}

/** The page for `#/...`: agents, threads, a thread, a task (and one of its runs:
 * `#/thread/T/task/K/run/R`), approvals or the chat box. */
async function route() {
  const mine = ++routed;
  stopCurrent();
  stopCurrent = () => {};
  const parts = location.hash.replace(/^#\/?/, '').split('/').map(decodeURIComponent);
  const [page = 'agents'] = parts;
  for (const link of document.querySelectorAll('[data-nav]')) {
    link.classList.toggle('active', link.dataset.nav === page || (page === 'thread' && link.dataset.nav === 'threads'));
  }
  show('');
  try {
    let node;
    if (page === 'thread' && parts[2] === 'task' && parts[3]) {
      const opened = taskView(parts[1], parts[3], parts[4] === 'run' ? parts[5] : undefined);
      stopCurrent = opened.stop;
      node = opened.node;
    } else if (page === 'thread' && parts[1]) {
      node = threadView(parts[1]);
    } else if (page === 'threads') {
      node = threadsView();
    } else if (page === 'approvals') {
      node = approvalsView();
    } else if (page === 'chat') {
      node = await chatView(parts[1]);
    } else {
      node = await agentsView();
    }
    if (mine !== routed) return;
    view.replaceChildren(node);
  } catch (err) {
    if (mine !== routed) return;
    view.replaceChildren(h('p', { class: 'error' }, err.status === 401 ? 'This server needs an API key: type it in at the top right.' : err.message));
  }
}

async function countApprovals() {
  const badge = document.getElementById('approval-count');
  try {
    const page = await api('/api/v1/approvals', { query: { page_size: 1 } });
    const count = page.total_size ?? (page.approvals || []).length;
    badge.textContent = String(count);
    badge.hidden = !count;
  } catch {
    badge.hidden = true;
  }
}

const form = document.getElementById('key-form');
const keyInput = document.getElementById('api-key');
keyInput.value = apiKey();
form.addEventListener('submit', (event) => {
  event.preventDefault();
  setApiKey(keyInput.value.trim());
  route();
  countApprovals();
});

window.addEventListener('hashchange', route);
route();
countApprovals();
setInterval(countApprovals, 5000);

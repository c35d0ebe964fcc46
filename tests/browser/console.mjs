// Drives Keel's web console in headless Chromium (Debian's, through playwright-core) against
// real `keel serve` processes started by tests/console_browser.rs. One scenario per run:
//
//   node console.mjs approve URL      chat box -> approval appears live -> Approve -> completed,
//                                     the tool's result in the run's timeline
//   node console.mjs cancel URL       chat box -> a long tool runs -> Cancel -> canceled
//   node console.mjs replica URL_A URL_B
//                                     chat on A's console, watch the same run on B's console
//   node console.mjs fork URL ROUTE   a forked run's page (ROUTE: `#/thread/T/task/K/run/R`)
//                                     names the run and model call it forked from
//
// Environment: KEEL_CHROMIUM (the browser, default /usr/bin/chromium), KEEL_SCREENSHOTS (the
// directory for screenshots), KEEL_API_KEY (typed into the console's key field when set). Prints one JSON line of what it saw; exits non-zero, saying
// which step failed, when a step does not happen (a screenshot of that moment is saved).

import { chromium } from 'playwright-core';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';

const [scenario, url, otherUrl] = process.argv.slice(2);
const shots = process.env.KEEL_SCREENSHOTS || 'screenshots';
const executablePath = process.env.KEEL_CHROMIUM || '/usr/bin/chromium';
// Generous: CI machines are slow; a step that happens returns as soon as it does.
const WAIT = 30000;
mkdirSync(shots, { recursive: true });

const browser = await chromium.launch({ executablePath, args: ['--no-sandbox'] });
const context = await browser.newContext({ viewport: { width: 1280, height: 900 }, deviceScaleFactor: 1 });
const page = await context.newPage();
const problems = [];
page.on('pageerror', (err) => problems.push(`page error: ${err.message}`));
page.on('console', (msg) => {
  if (msg.type() === 'error') problems.push(`console error: ${msg.text()}`);
});

let current = 'start';
async function step(name, action) {
  current = name;
  return action();
}

/** Screenshot the page, or one part of it named by a selector. A selector, not an element
 * handle: the console re-renders as events arrive, and a locator finds the part again. */
async function shot(name, selector) {
  const target = selector ? page.locator(selector).first() : page;
  // The run's section is drawn again when a refresh lands; an element replaced while it is
  // photographed is found again and taken anew.
  for (let attempt = 1; ; attempt++) {
    try {
      return await target.screenshot({ path: join(shots, `${scenario}-${name}.png`) });
    } catch (err) {
      if (attempt >= 5 || !/not attached/.test(err.message)) throw err;
    }
  }
}

/** Open the server's URL as a browser does and land on the console. */
async function openConsole(base) {
  await page.goto(base);
  await page.waitForURL(/\/console\/(#.*)?$/, { timeout: WAIT });
  if (process.env.KEEL_API_KEY) {
    // The server needs a key: typed in once, the console sends it with every call.
    await page.fill('#api-key', process.env.KEEL_API_KEY);
    await page.click('#key-form button[type="submit"]');
  }
}

/** Send `text` from the chat box and wait for its task's page. */
async function chat(text) {
  await page.click('nav a[data-nav="chat"]');
  await page.fill('form.chat textarea', text);
  await page.click('form.chat button[type="submit"]');
  await page.waitForSelector('section.task', { timeout: WAIT });
  return page.$eval('section.task', (el) => el.dataset.task);
}

const stateIs = (state) => page.waitForSelector(`section.task[data-state="${state}"]`, { timeout: WAIT });

const seen = { scenario };
try {
  if (scenario === 'approve') {
    await step('open the console at /', () => openConsole(url));
    await step('see the agent card', () => page.waitForSelector('article.card[data-agent="careful"]', { timeout: WAIT }));
    seen.task = await step('send a message from the chat box', () =>
      chat('/run_code {"source": "export default 6 * 7", "language": "javascript"}'));
    await step('see the approval appear live', async () => {
      await stateIs('input-required');
      await page.waitForSelector('.approval button.approve', { timeout: WAIT });
      await page.waitForSelector('svg.timeline g.row.approval', { timeout: WAIT });
    });
    seen.waiting_for = await page.$eval('.approval h4 code', (el) => el.textContent);
    await shot('waiting');
    await step('approve it', () => page.click('.approval button.approve'));
    await step('see the task complete', () => stateIs('completed'));
    await step("see the tool's result in the timeline", async () => {
      await page.waitForSelector('tr.tool.completed[data-tool="run_code"] td.result', { timeout: WAIT });
      await page.waitForSelector('svg.timeline g.row.tool', { timeout: WAIT });
    });
    current = 'read the finished task';
    seen.result = await page.$eval('tr.tool.completed[data-tool="run_code"] td.result', (el) => el.textContent.trim());
    seen.approval = await page.$eval('tr.tool[data-tool="run_code"] td:nth-child(5)', (el) => el.textContent.trim());
    seen.state = await page.$eval('section.task', (el) => el.dataset.state);
    seen.timeline_rows = await page.$$eval('svg.timeline g.row', (rows) => rows.map((r) => r.dataset.kind));
    current = 'take the screenshots';
    await shot('completed');
    await shot('timeline', 'section.run');
  } else if (scenario === 'cancel') {
    await step('open the console at /', () => openConsole(url));
    seen.task = await step('send a message from the chat box', () => chat('/sleep {"seconds": 300}'));
    await step('see the long tool running', async () => {
      await stateIs('working');
      // The model's call of the tool, persisted before the tool runs, and its open bar.
      await page.waitForSelector('.message.assistant .call code:text-is("sleep")', { timeout: WAIT });
      await page.waitForSelector('tr.tool.pending[data-tool="sleep"]', { timeout: WAIT });
      await page.waitForSelector('svg.timeline g.row.tool', { timeout: WAIT });
    });
    await shot('working');
    await step('cancel it', () => page.click('section.task button.cancel'));
    await step('see the task canceled', () => stateIs('canceled'));
    seen.state = await page.$eval('section.task', (el) => el.dataset.state);
    seen.cancel_button = await page.$$eval('section.task button.cancel', (b) => b.length);
    await shot('canceled');
  } else if (scenario === 'replica') {
    await step('open the console of replica A', () => openConsole(url));
    seen.task = await step('send a message from A', () => chat('/sleep {"seconds": 1}'));
    const hash = new URL(page.url()).hash;
    await step('open the same task on replica B', async () => {
      await page.goto(new URL(`console/${hash}`, otherUrl).href);
      await page.waitForSelector(`section.task[data-task="${seen.task}"]`, { timeout: WAIT });
    });
    await step('see the run complete on B', async () => {
      await stateIs('completed');
      await page.waitForSelector('tr.tool.completed[data-tool="sleep"]', { timeout: WAIT });
    });
    seen.state = await page.$eval('section.task', (el) => el.dataset.state);
    seen.result = await page.$eval('tr.tool.completed[data-tool="sleep"] td.result', (el) => el.textContent.trim());
    seen.served_by = new URL(page.url()).origin;
    await shot('on-b');
  } else if (scenario === 'fork') {
    await step('open the console', () => openConsole(url));
    await step('open the forked run', async () => {
      await page.goto(new URL(`console/${otherUrl}`, url).href);
      await page.waitForSelector('p.forked', { timeout: WAIT });
    });
    seen.forked_from = await page.$eval('p.forked', (el) => el.dataset.forkedFrom);
    seen.text = await page.$eval('p.forked', (el) => el.textContent.trim());
    await shot('forked', 'section.run');
  } else {
    throw new Error(`unknown scenario ${scenario}`);
  }
  seen.problems = problems;
  console.log(JSON.stringify(seen));
  await browser.close();
} catch (err) {
  await shot('failed').catch(() => {});
  console.error(`console ${scenario}: the step "${current}" failed: ${err.message}`);
  if (problems.length) console.error(problems.join('\n'));
  const body = await page.$eval('main', (el) => el.innerText).catch(() => '');
  console.error(`the page showed:\n${body.slice(0, 2000)}`);
  await browser.close();
  process.exit(1);
}

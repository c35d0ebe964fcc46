// Pictures of a run, drawn as plain SVG: the run as a timeline (a bar per step and call, by
// duration) and its token use per step.

const SVG = 'http://www.w3.org/2000/svg';

function el(name, attrs, text) {
  const node = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

/** "12 ms", "3.4 s", "2 min 5 s". */
export function duration(ms) {
  if (!Number.isFinite(ms)) return '';
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(ms < 10000 ? 2 : 1)} s`;
  return `${Math.floor(ms / 60000)} min ${Math.round((ms % 60000) / 1000)} s`;
}

/**
 * The run's timeline: one row per bar (`{label, kind, start, end, title, open}` with times
 * in ms), laid out on one time axis from `start` to `end`. A bar too short to see is drawn
 * a few pixels wide; an open bar (still running) is drawn to `end` and striped.
 */
export function timeline({ start, end, rows }) {
  const width = 900;
  const label = 190;
  const rowHeight = 22;
  const top = 24;
  const span = Math.max(end - start, 1);
  const height = top + rows.length * rowHeight + 8;
  const x = (t) => label + ((t - start) / span) * (width - label - 10);
  const svg = el('svg', {
    class: 'timeline',
    viewBox: `0 0 ${width} ${height}`,
    width: '100%',
    role: 'img',
    'aria-label': 'Run timeline',
  });
  const defs = el('defs');
  const stripes = el('pattern', { id: 'open', width: 8, height: 8, patternUnits: 'userSpaceOnUse', patternTransform: 'rotate(45)' });
  stripes.append(el('rect', { width: 4, height: 8, fill: 'rgba(255,255,255,0.45)' }));
  defs.append(stripes);
  svg.append(defs);
  for (let i = 0; i <= 4; i += 1) {
    const t = start + (span * i) / 4;
    svg.append(el('line', { x1: x(t), x2: x(t), y1: top - 6, y2: height, class: 'grid' }));
    const anchor = i === 0 ? 'start' : i === 4 ? 'end' : 'middle';
    svg.append(el('text', { x: x(t), y: 12, 'text-anchor': anchor, class: 'axis' }, `+${duration(t - start)}`));
  }
  rows.forEach((row, i) => {
    const y = top + i * rowHeight;
    const group = el('g', { class: `row ${row.kind}`, 'data-kind': row.kind });
    group.append(el('text', { x: row.indent ? 16 : 4, y: y + 15, class: 'label' }, row.label));
    const x0 = x(row.start);
    const w = Math.max(x(row.end) - x0, 3);
    const bar = el('rect', { x: x0, y: y + 4, width: w, height: rowHeight - 8, rx: 3, class: 'bar' });
    bar.append(el('title', {}, row.title || row.label));
    group.append(bar);
    if (row.open) group.append(el('rect', { x: x0, y: y + 4, width: w, height: rowHeight - 8, rx: 3, fill: 'url(#open)' }));
    const note = duration(row.end - row.start);
    const textX = x0 + w + 4 > width - 60 ? x0 - 4 : x0 + w + 4;
    const anchor = textX < x0 ? 'end' : 'start';
    group.append(el('text', { x: textX, y: y + 15, class: 'note', 'text-anchor': anchor }, note));
    svg.append(group);
  });
  return svg;
}

/** Token use per step: a bar per step, input tokens below output tokens, to one scale. */
export function tokenChart(steps) {
  const width = 260;
  const height = 170;
  const left = 36;
  const bottom = 22;
  const max = Math.max(1, ...steps.map((s) => s.input + s.output));
  const band = (width - left - 8) / Math.max(steps.length, 1);
  const barWidth = Math.min(40, band * 0.7);
  const y = (v) => height - bottom - (v / max) * (height - bottom - 10);
  const svg = el('svg', { class: 'tokens', viewBox: `0 0 ${width} ${height}`, width: '100%', role: 'img', 'aria-label': 'Tokens per step' });
  svg.append(el('line', { x1: left, x2: width, y1: y(0), y2: y(0), class: 'grid' }));
  svg.append(el('text', { x: left - 4, y: y(max) + 4, 'text-anchor': 'end', class: 'axis' }, String(max)));
  svg.append(el('text', { x: left - 4, y: y(0), 'text-anchor': 'end', class: 'axis' }, '0'));
  steps.forEach((s, i) => {
    const cx = left + band * i + (band - barWidth) / 2;
    const input = el('rect', { x: cx, y: y(s.input), width: barWidth, height: y(0) - y(s.input), class: 'input' });
    input.append(el('title', {}, `step ${s.step}: ${s.input} input tokens`));
    const output = el('rect', { x: cx, y: y(s.input + s.output), width: barWidth, height: y(s.input) - y(s.input + s.output), class: 'output' });
    output.append(el('title', {}, `step ${s.step}: ${s.output} output tokens`));
    svg.append(input, output);
    svg.append(el('text', { x: cx + barWidth / 2, y: height - 6, 'text-anchor': 'middle', class: 'axis' }, `step ${s.step}`));
  });
  return svg;
}

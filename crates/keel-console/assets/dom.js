// Building the page's elements without a framework.

/** An element: `h('a', {href}, [children])`; strings become text, null is skipped. */
export function h(tag, attrs, children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? '' : v);
  }
  for (const child of [].concat(children ?? [])) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

/** `build()` when `condition` holds, else nothing. */
export function when(condition, build) {
  return condition ? build() : null;
}

/** A value as indented JSON in a `<pre>`. */
export function json(value) {
  if (value === undefined) return '';
  return h('pre', { class: 'json' }, typeof value === 'string' ? value : JSON.stringify(value, null, 2));
}

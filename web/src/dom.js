// Building DOM nodes, and the formats every page writes numbers in.

/**
 * An element: `attrs` sets properties (`on*` functions become listeners, `dataset` and `style`
 * objects are merged, `class` sets the class, other strings become attributes), `children` are
 * nodes or text (null and false are skipped, arrays are flattened).
 */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs ?? {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") {
      el.addEventListener(key.slice(2), value);
    } else if (key === "dataset" || key === "style") {
      Object.assign(el[key], value);
    } else if (key === "class") {
      el.className = value;
    } else if (key in el && typeof value !== "string") {
      el[key] = value;
    } else {
      el.setAttribute(key, value === true ? "" : String(value));
    }
  }
  append(el, children);
  return el;
}

/** Replaces `el`'s children with `children` (as `h` takes them: null and false skipped). */
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else el.append(child instanceof Node ? child : String(child));
  }
}

/** A link to a route of the app. */
export function link(route, ...children) {
  return h("a", { href: `#${route}` }, ...children);
}

/** A message in place of (or beside) a page's content; `kind` is "error" or "note". */
export function message(kind, text, id) {
  return h("div", { class: `message ${kind}`, id, role: kind === "error" ? "alert" : null }, text);
}

const integer = new Intl.NumberFormat("en-US", { maximumFractionDigits: 0 });

/** A count with thousands separated. */
export function count(n) {
  return n === null || n === undefined ? "–" : integer.format(n);
}

/** Bytes in decimal units, as lake's command line prints them. */
export function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "kB", "MB", "GB", "TB", "PB"];
  let i = 0;
  let v = n;
  while (v >= 1000 && i < units.length - 1) {
    v /= 1000;
    i += 1;
  }
  return i === 0 ? `${n} B` : `${v.toFixed(1)} ${units[i]}`;
}

/** Seconds as `1 h 02 min`, `3 min 05 s` or `4.2 s`. */
export function duration(seconds) {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return "–";
  if (seconds < 60) return `${seconds.toFixed(1)} s`;
  const s = Math.round(seconds);
  const pad = (x) => String(x).padStart(2, "0");
  if (s < 3600) return `${Math.floor(s / 60)} min ${pad(s % 60)} s`;
  return `${Math.floor(s / 3600)} h ${pad(Math.floor((s % 3600) / 60))} min`;
}

/** A number for a table cell: integers whole, other values to 6 significant digits. */
export function num(v) {
  if (v === null || v === undefined) return "–";
  if (typeof v !== "number") return String(v);
  if (Number.isInteger(v)) return String(v);
  return Number(v.toPrecision(6)).toString();
}

/** A JSON value as a table cell's text (null shows as NULL). */
export function cell(v) {
  if (v === null || v === undefined) return "NULL";
  if (typeof v === "object") return JSON.stringify(v);
  return String(v);
}

/** A failure the page explains in words of its own (shown as its message, without more). */
export class PageError extends Error {
  constructor(message) {
    super(message);
    this.name = "PageError";
  }
}

// Per-feature statistics drawn from the exact statistics lake stores: for each dimension its
// range (min to max), the q01–q99 and q10–q90 spans, the median, and mean ± std.

import { h, num, svg } from "./dom.js";

const QUANTILES = ["min", "q01", "q10", "q50", "q90", "q99", "max", "mean", "std"];

/** A value list flattened (image statistics are nested per channel). */
function flat(v) {
  if (v === null || v === undefined) return [];
  return Array.isArray(v) ? v.flat(Infinity) : [v];
}

/**
 * A feature's dimension names from info.json's `names`: a list (nested lists flattened), a map of
 * lists such as `{"motors": [...]}`, or null; `dim 0…n-1` when they are missing or do not count `n`.
 */
export function dimensionNames(feature, n, key) {
  const out = [];
  const walk = (v) => {
    if (v === null || v === undefined || typeof v === "boolean") return;
    if (Array.isArray(v)) v.forEach(walk);
    else if (typeof v === "object") Object.values(v).forEach(walk);
    else out.push(String(v));
  };
  walk(feature?.names);
  if (out.length === n) return out;
  if (n === 1 && key) return [key];
  return Array.from({ length: n }, (_, i) => `dim ${i}`);
}

/** Round tick values over [lo, hi]: steps of 1, 2 or 5 times a power of ten. */
export function ticks(lo, hi, wanted = 6) {
  const span = hi - lo;
  if (!(span > 0)) return [lo];
  const raw = span / wanted;
  const power = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * power).find((s) => s >= raw);
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(Math.abs(v) < step * 1e-9 ? 0 : v);
  return out;
}

/**
 * The statistics section: one plot per numeric feature of `stats` (in info.json's order),
 * cameras left out; `features` is info.json's `features`.
 */
export function statsSection(features, stats) {
  if (!stats) return h("p", { class: "muted" }, "This version holds no statistics.");
  const keys = Object.keys(stats).sort((a, b) => order(features, a) - order(features, b));
  const shown = keys.filter((k) => !["video", "image"].includes(features?.[k]?.dtype) && flat(stats[k].min).length > 0);
  if (shown.length === 0) return h("p", { class: "muted" }, "No numeric feature has statistics.");
  return h(
    "div",
    { id: "stats" },
    legend(),
    shown.map((k) => featurePlot(k, features?.[k], stats[k])),
  );
}

function order(features, key) {
  const keys = Object.keys(features ?? {});
  const i = keys.indexOf(key);
  return i < 0 ? keys.length : i;
}

function legend() {
  const w = 460;
  const g = svg("svg", { viewBox: `0 0 ${w} 24`, class: "stats-legend", role: "img", "aria-label": "legend" });
  let x = 0;
  const item = (mark, text) => {
    g.append(mark(x), svg("text", { x: x + 26, y: 16 }, text));
    x += 26 + text.length * 6.5 + 14;
  };
  item((x0) => svg("line", { x1: x0, x2: x0 + 20, y1: 12, y2: 12, class: "range" }), "min–max");
  item((x0) => svg("rect", { x: x0, y: 6, width: 20, height: 12, class: "q01" }), "q01–q99");
  item((x0) => svg("rect", { x: x0, y: 6, width: 20, height: 12, class: "q10" }), "q10–q90");
  item((x0) => svg("line", { x1: x0 + 10, x2: x0 + 10, y1: 4, y2: 20, class: "median" }), "median");
  item(
    (x0) =>
      svg(
        "g",
        null,
        svg("line", { x1: x0, x2: x0 + 20, y1: 12, y2: 12, class: "std" }),
        svg("circle", { cx: x0 + 10, cy: 12, r: 3, class: "mean" }),
      ),
    "mean ± std",
  );
  return g;
}

function featurePlot(key, feature, s) {
  const values = Object.fromEntries(QUANTILES.map((q) => [q, flat(s[q])]));
  const n = values.min.length;
  const counted = flat(s.count)[0];
  const names = dimensionNames(feature, n, key);
  const lows = values.min.filter(Number.isFinite);
  const highs = values.max.filter(Number.isFinite);
  let lo = Math.min(...lows);
  let hi = Math.max(...highs);
  if (!Number.isFinite(lo) || !Number.isFinite(hi)) {
    lo = 0;
    hi = 1;
  }
  if (hi === lo) {
    const pad = Math.abs(lo) > 0 ? Math.abs(lo) * 0.1 : 1;
    lo -= pad;
    hi += pad;
  }
  const label = 170;
  const width = 760;
  const row = 20;
  const top = 6;
  const axis = 22;
  const height = top + n * row + axis;
  const plotW = width - label - 16;
  const x = (v) => label + ((Math.min(hi, Math.max(lo, v)) - lo) / (hi - lo)) * plotW;
  const ok = (v) => Number.isFinite(v);
  const plot = svg("svg", { viewBox: `0 0 ${width} ${height}`, class: "stats-plot", role: "img", "aria-label": `statistics of ${key}` });
  for (const t of ticks(lo, hi)) {
    plot.append(
      svg("line", { x1: x(t), x2: x(t), y1: top, y2: top + n * row, class: "grid" }),
      svg("text", { x: x(t), y: top + n * row + 15, class: "tick" }, num(t)),
    );
  }
  for (let i = 0; i < n; i++) {
    const y = top + i * row + row / 2;
    const v = (q) => values[q][i];
    const g = svg("g", { class: "dim", "data-dim": i });
    g.append(
      svg(
        "title",
        null,
        `${names[i]}\n${QUANTILES.filter((q) => v(q) !== undefined)
          .map((q) => `${q} ${num(v(q))}`)
          .join("\n")}`,
      ),
    );
    g.append(svg("text", { x: label - 8, y: y + 4, class: "name" }, names[i]));
    if (ok(v("min")) && ok(v("max"))) g.append(svg("line", { x1: x(v("min")), x2: x(v("max")), y1: y, y2: y, class: "range" }));
    if (ok(v("q01")) && ok(v("q99")))
      g.append(svg("rect", { x: x(v("q01")), y: y - 5, width: Math.max(1, x(v("q99")) - x(v("q01"))), height: 10, class: "q01" }));
    if (ok(v("q10")) && ok(v("q90")))
      g.append(svg("rect", { x: x(v("q10")), y: y - 5, width: Math.max(1, x(v("q90")) - x(v("q10"))), height: 10, class: "q10" }));
    if (ok(v("q50"))) g.append(svg("line", { x1: x(v("q50")), x2: x(v("q50")), y1: y - 7, y2: y + 7, class: "median" }));
    if (ok(v("mean"))) {
      if (ok(v("std")))
        g.append(svg("line", { x1: x(v("mean") - v("std")), x2: x(v("mean") + v("std")), y1: y + 8, y2: y + 8, class: "std" }));
      g.append(svg("circle", { cx: x(v("mean")), cy: y + 8, r: 2.5, class: "mean" }));
    }
    plot.append(g);
  }
  return h(
    "figure",
    { class: "feature-stats", dataset: { feature: key } },
    h(
      "figcaption",
      null,
      h("span", { class: "mono" }, key),
      h("span", { class: "muted" }, ` · ${n} dimension${n === 1 ? "" : "s"}${counted === undefined ? "" : ` · ${counted} values`}`),
    ),
    plot,
    h("details", null, h("summary", null, "numbers"), numbersTable(names, values, n)),
  );
}

function numbersTable(names, values, n) {
  return h(
    "div",
    { class: "scroll" },
    h(
      "table",
      { class: "grid compact" },
      h(
        "thead",
        null,
        h(
          "tr",
          null,
          h("th", null, "dimension"),
          QUANTILES.map((q) => h("th", null, q)),
        ),
      ),
      h(
        "tbody",
        null,
        Array.from({ length: n }, (_, i) =>
          h(
            "tr",
            null,
            h("td", null, names[i]),
            QUANTILES.map((q) => h("td", { class: "num" }, num(values[q][i]))),
          ),
        ),
      ),
    ),
  );
}

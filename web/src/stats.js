// Per-feature statistics drawn from the exact statistics lake stores, one uPlot chart per numeric
// feature: for each dimension (x, labelled with info.json's names) its range (min to max), the
// q01–q99 and q10–q90 spans, the median, and mean ± std. The legend beside a chart names each mark
// and, while the mouse is over a dimension, shows that dimension's name and values.
//
// Each chart's figure is `figure.feature-stats[data-feature=KEY]`; its `data-names` is the JSON
// list of the dimension names the x axis is labelled with.

import uPlot from "uplot";

import { h, num } from "./dom.js";

const QUANTILES = ["min", "q01", "q10", "q50", "q90", "q99", "max", "mean", "std"];

/** Height of the plotting area (the x axis' labels come on top of it), in CSS pixels. */
const PLOT_HEIGHT = 200;
/** The least width a dimension gets when there is room (more when its label needs it), and the narrowest chart. */
const SLOT = 64;
const MIN_WIDTH = 300;
/** The legend beside a chart and the gap before it (app.css: `.stats-chart .u-legend`). */
const LEGEND_WIDTH = 250;
/** Horizontal room a label needs on a rotated (45°) axis before labels are thinned out. */
const ROTATED_PITCH = 18;
/** Dimension names longer than this are shortened with an ellipsis on the axis. */
const LABEL_CHARS = 24;

const NAME_FONT = '11px ui-monospace, "SFMono-Regular", "DejaVu Sans Mono", Menlo, Consolas, monospace';
const VALUE_FONT = "11px system-ui, sans-serif";
const NAME_PX = 11;

const COLOURS = { range: "#8a94a6", q01: "#c6dbef", q10: "#6a9fd4", median: "#1d2330", mean: "#d9480f" };

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

/**
 * The statistics section: one chart per numeric feature of `stats` (in info.json's order),
 * cameras left out; `features` is info.json's `features`. The charts fit the section's width as it
 * changes; `onLeave` is given the function that removes them.
 */
export function statsSection(features, stats, onLeave) {
  if (!stats) return h("p", { class: "muted" }, "This version holds no statistics.");
  const keys = Object.keys(stats).sort((a, b) => order(features, a) - order(features, b));
  const shown = keys.filter((k) => !["video", "image"].includes(features?.[k]?.dtype) && flat(stats[k].min).length > 0);
  if (shown.length === 0) return h("p", { class: "muted" }, "No numeric feature has statistics.");
  const charts = shown.map((k) => featureChart(k, features?.[k], stats[k]));
  const section = h(
    "div",
    { id: "stats" },
    charts.map((c) => c.figure),
  );
  // Until the section is laid out, each chart takes the width it would like.
  const observer = new ResizeObserver(() => {
    const width = section.clientWidth;
    if (width > 0) for (const c of charts) c.fit(width - LEGEND_WIDTH);
  });
  observer.observe(section);
  onLeave?.(() => {
    observer.disconnect();
    for (const c of charts) c.plot.destroy();
  });
  return section;
}

function order(features, key) {
  const keys = Object.keys(features ?? {});
  const i = keys.indexOf(key);
  return i < 0 ? keys.length : i;
}

let measurer = null;

/** The width of `text` drawn in `font`, in CSS pixels. */
function textWidth(text, font) {
  measurer ??= document.createElement("canvas").getContext("2d");
  measurer.font = font;
  return measurer.measureText(text).width;
}

function shorten(name) {
  return name.length > LABEL_CHARS ? `${name.slice(0, LABEL_CHARS - 1)}…` : name;
}

/** The y range: every value drawn, padded, rounded outwards. */
function valueRange(v, n) {
  let lo = Infinity;
  let hi = -Infinity;
  const take = (x) => {
    if (Number.isFinite(x)) {
      lo = Math.min(lo, x);
      hi = Math.max(hi, x);
    }
  };
  for (let i = 0; i < n; i++) {
    for (const q of ["min", "q01", "q10", "q50", "q90", "q99", "max", "mean"]) take(v[q][i]);
    if (Number.isFinite(v.std[i])) {
      take(v.mean[i] - v.std[i]);
      take(v.mean[i] + v.std[i]);
    }
  }
  if (!Number.isFinite(lo)) return [0, 1];
  return uPlot.rangeNum(lo, hi, 0.06, true);
}

/** A vertical line at `x` from `top` to `bottom` with a cap `cap` wide each side at both ends. */
function whisker(path, x, top, bottom, cap) {
  path.moveTo(x, top);
  path.lineTo(x, bottom);
  for (const at of [top, bottom]) {
    path.moveTo(x - cap, at);
    path.lineTo(x + cap, at);
  }
}

/** A layer of a CSS background: a rectangle of `colour`, `size` large, at `position`. */
function patch(colour, position, size) {
  return `linear-gradient(${colour},${colour}) ${position}/${size} no-repeat`;
}

/**
 * The marks, drawn in this order: each has a legend label, the statistics it needs, its colours
 * (a CSS background draws its legend swatch), the value the legend shows for dimension `i`, and
 * how it is drawn for one dimension into `stroke` and `fill` (Path2D, canvas pixels).
 */
const MARKS = [
  {
    label: "min – max",
    needs: ["min", "max"],
    stroke: COLOURS.range,
    width: 1,
    swatch: [patch(COLOURS.range, "50% 0", "1px 100%"), patch(COLOURS.range, "50% 0", "8px 1px"), patch(COLOURS.range, "50% 100%", "8px 1px")].join(),
    value: (v, i) => `${num(v.min[i])} – ${num(v.max[i])}`,
    draw: ({ stroke }, g, y, v, i) => {
      whisker(stroke, g.center, y(v.max[i]), y(v.min[i]), g.bar / 4);
    },
  },
  span("q01", "q99", COLOURS.q01),
  span("q10", "q90", COLOURS.q10),
  {
    label: "median",
    needs: ["q50"],
    stroke: COLOURS.median,
    width: 2,
    swatch: patch(COLOURS.median, "50% 50%", "100% 2px"),
    value: (v, i) => num(v.q50[i]),
    draw: ({ stroke }, g, y, v, i) => {
      const at = y(v.q50[i]);
      stroke.moveTo(g.center - g.bar / 2, at);
      stroke.lineTo(g.center + g.bar / 2, at);
    },
  },
  {
    label: "mean ± std",
    needs: ["mean"],
    stroke: COLOURS.mean,
    fill: COLOURS.mean,
    width: 1.5,
    swatch: `radial-gradient(circle, ${COLOURS.mean} 0 3px, transparent 3.5px), ${patch(COLOURS.mean, "50% 0", "1.5px 100%")}`,
    value: (v, i) => (Number.isFinite(v.std[i]) ? `${num(v.mean[i])} ± ${num(v.std[i])}` : num(v.mean[i])),
    draw: ({ stroke, fill }, g, y, v, i) => {
      const at = y(v.mean[i]);
      if (Number.isFinite(v.std[i])) {
        whisker(stroke, g.whisker, y(v.mean[i] + v.std[i]), y(v.mean[i] - v.std[i]), g.px * 3);
      }
      const r = g.px * 3;
      fill.moveTo(g.whisker + r, at);
      fill.arc(g.whisker, at, r, 0, 2 * Math.PI);
    },
  },
];

/** A bar from quantile `lo` to quantile `hi`. */
function span(lo, hi, colour) {
  return {
    label: `${lo} – ${hi}`,
    needs: [lo, hi],
    fill: colour,
    stroke: colour,
    width: 0,
    swatch: colour,
    value: (v, i) => `${num(v[lo][i])} – ${num(v[hi][i])}`,
    draw: ({ fill }, g, y, v, i) => {
      const top = y(v[hi][i]);
      const height = Math.max(g.px, y(v[lo][i]) - top);
      fill.rect(g.center - g.bar / 2, top, g.bar, height);
    },
  };
}

/** A mark's uPlot paths: its drawing for every dimension that has the statistics it needs. */
function markPaths(mark, v) {
  return (u) => {
    const stroke = new Path2D();
    const fill = new Path2D();
    const x0 = u.valToPos(0, "x", true);
    const slot = u.valToPos(1, "x", true) - x0;
    const px = slot / (u.valToPos(1, "x") - u.valToPos(0, "x"));
    const bar = Math.min(slot * 0.5, 40 * px);
    const gap = Math.max(3 * px, bar * 0.3);
    const y = (value) => u.valToPos(value, "y", true);
    for (let i = 0; i < v.min.length; i++) {
      if (!mark.needs.every((q) => Number.isFinite(v[q][i]))) continue;
      // The bar and the mean's whisker beside it, centred on the dimension together.
      const center = Math.round(x0 + i * slot - gap / 2);
      mark.draw({ stroke, fill }, { px, bar, center, whisker: Math.round(center + bar / 2 + gap) }, y, v, i);
    }
    return { stroke, fill, clip: null, flags: 0 };
  };
}

/**
 * Where the x axis' labels go at a chart `width` pixels wide: whether labels are rotated and which
 * are shown (every `every`-th), the axis' height and the left padding a rotated label needs.
 */
function xLayout(width, n, labelWidths, yAxis) {
  const slot = (width - yAxis - 12) / n;
  const widest = Math.max(...labelWidths);
  if (widest + 8 <= slot) return { rotate: false, every: 1, size: 30, left: 0 };
  const every = Math.max(1, Math.ceil(ROTATED_PITCH / slot));
  const diagonal = Math.SQRT1_2;
  let left = 0;
  labelWidths.forEach((w, i) => {
    if (i % every === 0) left = Math.max(left, w * diagonal + NAME_PX - (yAxis + slot * (i + 0.5)));
  });
  return { rotate: true, every, size: Math.ceil(widest * diagonal + NAME_PX + 12), left: Math.ceil(left) };
}

function featureChart(key, feature, s) {
  const v = Object.fromEntries(QUANTILES.map((q) => [q, flat(s[q])]));
  const n = v.min.length;
  const counted = flat(s.count)[0];
  const names = dimensionNames(feature, n, key);
  const labels = names.map(shorten);
  const labelWidths = labels.map((l) => textWidth(l, NAME_FONT));
  const [lo, hi] = valueRange(v, n);
  const yAxis = Math.ceil(Math.max(textWidth(num(lo), VALUE_FONT), textWidth(num(hi), VALUE_FONT)) + 22);
  const marks = MARKS.filter((m) => m.needs.some((q) => v[q].some(Number.isFinite)));
  // Wide enough for horizontal labels; where the section is narrower, they turn (xLayout).
  const wanted = Math.max(MIN_WIDTH, yAxis + 12 + n * Math.max(SLOT, Math.ceil(Math.max(...labelWidths)) + 12));
  let width = wanted;
  let layout = xLayout(width, n, labelWidths, yAxis);

  const hover = h("div", { class: "stats-hover" });
  const opts = {
    width,
    height: PLOT_HEIGHT + layout.size,
    padding: [12, 12, 0, () => layout.left],
    scales: {
      x: { time: false, range: () => [-0.5, n - 0.5] },
      y: { range: () => [lo, hi] },
    },
    series: [
      { label: "dimension", value: (u, x, si, i) => (i === null ? "" : names[i]) },
      ...marks.map((m) => ({
        label: m.label,
        stroke: m.stroke,
        fill: m.fill,
        width: m.width,
        paths: markPaths(m, v),
        points: { show: false },
        value: (u, x, si, i) => (i === null ? "" : m.value(v, i)),
      })),
    ],
    axes: [
      {
        font: NAME_FONT,
        stroke: COLOURS.median,
        splits: () => names.map((_, i) => i),
        values: (u, splits) => splits.map((i) => (i % layout.every === 0 ? labels[i] : null)),
        rotate: () => (layout.rotate ? 45 : 0),
        size: () => layout.size,
        gap: 4,
        ticks: { size: 4, stroke: "#dde1e7" },
        grid: { show: false },
      },
      {
        font: VALUE_FONT,
        stroke: "#667085",
        size: (u, values) => (values ? Math.ceil(Math.max(...values.map((t) => textWidth(String(t ?? ""), VALUE_FONT))) + 16) : yAxis),
        ticks: { show: false },
        grid: { stroke: "#eef0f3", width: 1 },
      },
    ],
    legend: {
      markers: { show: true, width: () => 0, stroke: () => "", dash: () => "solid", fill: (u, i) => marks[i - 1]?.swatch ?? "" },
    },
    cursor: { x: false, y: false, points: { show: false }, drag: { x: false, y: false, setScale: false } },
    hooks: {
      setCursor: [
        (u) => {
          const i = u.cursor.idx;
          figure.classList.toggle("hovering", i !== null && i !== undefined);
          if (i === null || i === undefined) return;
          const left = u.valToPos(i - 0.5, "x");
          hover.style.left = `${left}px`;
          hover.style.width = `${u.valToPos(i + 0.5, "x") - left}px`;
        },
      ],
    },
  };
  const holder = h("div", { class: "stats-chart", role: "img", "aria-label": `statistics of ${key} per dimension` });
  const figure = h(
    "figure",
    { class: "feature-stats", dataset: { feature: key, names: JSON.stringify(names) } },
    h(
      "figcaption",
      null,
      h("span", { class: "mono" }, key),
      h("span", { class: "muted" }, ` · ${n} dimension${n === 1 ? "" : "s"}${counted === undefined ? "" : ` · ${counted} values`}`),
    ),
    holder,
    h("details", null, h("summary", null, "numbers"), numbersTable(names, v, n)),
  );
  // The marks draw from `v`; the series' own values only have to be there for the cursor.
  const data = [names.map((_, i) => i), ...marks.map(() => names.map(() => 0))];
  const plot = new uPlot(opts, data, holder);
  plot.over.append(hover);
  return {
    figure,
    plot,
    /** Makes the chart its wanted width, or `room` pixels when that is less. */
    fit(room) {
      const w = Math.max(MIN_WIDTH, Math.min(wanted, Math.floor(room)));
      if (w === width) return;
      width = w;
      layout = xLayout(width, n, labelWidths, yAxis);
      plot.setSize({ width, height: PLOT_HEIGHT + layout.size });
    },
  };
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

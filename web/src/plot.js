// Charts drawn with uPlot: an episode's features over its steps (with a line at the current step
// that a click or drag moves), and a SQL answer's column against another.

import uPlot from "uplot";

import { h } from "./dom.js";

/** Series colours (Tableau 10), repeated past ten dimensions. */
export const PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"];

/** Resizes `plot` to its container's width whenever that changes; returns a function that stops it. */
function followWidth(plot, container, height) {
  const observer = new ResizeObserver(() => {
    const width = Math.floor(container.clientWidth);
    if (width > 0 && width !== plot.width) plot.setSize({ width, height });
  });
  observer.observe(container);
  return () => observer.disconnect();
}

/**
 * A feature's dimensions over an episode's steps. `xs` are the steps, `ys` one array per
 * dimension, `names` their labels; `onSeek(step)` is called for a click or drag on the plot.
 * The returned object's `setStep(step)` moves the step line (an element with class
 * `step-cursor`, its `data-step` the step and its `left` the step's position in the plot area)
 * and the legend's values to `step` (the legend follows the mouse while it is over the plot);
 * `destroy()` removes the plot.
 */
export function stepPlot(container, { key, xs, ys, names, height = 170, onSeek }) {
  let step = 0;
  let hovering = false;
  const cursor = h("div", { class: "step-cursor", dataset: { feature: key, step: "0" } });
  const place = (u) => {
    const left = u.valToPos(step, "x");
    cursor.style.left = `${Math.round(left * 100) / 100}px`;
    cursor.dataset.step = String(step);
  };
  const opts = {
    width: Math.max(300, Math.floor(container.clientWidth)),
    height,
    scales: { x: { time: false } },
    series: [
      { label: "step" },
      ...names.map((name, i) => ({ label: name, stroke: PALETTE[i % PALETTE.length], width: 1.25, points: { show: false } })),
    ],
    axes: [{ size: 36 }, { size: 64 }],
    cursor: { drag: { x: false, y: false, setScale: false }, points: { size: 5 } },
    legend: { live: true },
    hooks: {
      ready: [
        (u) => {
          u.over.append(cursor);
          place(u);
        },
      ],
      draw: [place],
      // Out of the plot, the legend shows the current step's values.
      setLegend: [(u) => !hovering && u.legend.idx !== step && u.setLegend({ idx: step }, false)],
    },
  };
  const plot = new uPlot(opts, [xs, ...ys], container);
  const stopFollowing = followWidth(plot, container, height);
  plot.over.addEventListener("mouseenter", () => (hovering = true));
  plot.over.addEventListener("mouseleave", () => {
    hovering = false;
    plot.setLegend({ idx: step }, false);
  });

  let pressed = false;
  const seekAt = (e) => {
    const rect = plot.over.getBoundingClientRect();
    const value = plot.posToVal(e.clientX - rect.left, "x");
    const target = Math.round(Math.min(xs[xs.length - 1], Math.max(xs[0], value)));
    onSeek(target);
  };
  plot.over.addEventListener("pointerdown", (e) => {
    if (e.button !== 0) return;
    pressed = true;
    plot.over.setPointerCapture(e.pointerId);
    seekAt(e);
  });
  plot.over.addEventListener("pointermove", (e) => pressed && seekAt(e));
  const release = () => (pressed = false);
  plot.over.addEventListener("pointerup", release);
  plot.over.addEventListener("pointercancel", release);

  return {
    plot,
    cursor,
    setStep(s) {
      step = s;
      place(plot);
      if (!hovering) plot.setLegend({ idx: s }, false);
    },
    destroy() {
      stopFollowing();
      plot.destroy();
    },
  };
}

/**
 * Column `y` against column `x` of `rows` as points (`mode` "scatter") or a line ("line"),
 * ordered by x; rows where either is not a number are left out. Returns `{plot, destroy, points}`.
 */
export function xyPlot(container, { rows, x, y, mode, height = 320 }) {
  const pairs = [];
  rows.forEach((r, i) => {
    const xv = x === null ? i : r[x];
    const yv = r[y];
    if (typeof xv === "number" && typeof yv === "number" && Number.isFinite(xv) && Number.isFinite(yv)) pairs.push([xv, yv]);
  });
  pairs.sort((a, b) => a[0] - b[0]);
  const xs = Float64Array.from(pairs, (p) => p[0]);
  const ys = Float64Array.from(pairs, (p) => p[1]);
  const scatter = mode === "scatter";
  const opts = {
    width: Math.max(300, Math.floor(container.clientWidth)),
    height,
    // Points keep a margin from the plot's edges.
    scales: { x: { time: false, range: (u, min, max) => uPlot.rangeNum(min, max, 0.05, false) } },
    series: [
      { label: x === null ? "row" : x },
      {
        label: y,
        stroke: PALETTE[0],
        width: scatter ? 0 : 1.5,
        paths: scatter ? () => null : undefined,
        points: scatter ? { show: true, size: 5, stroke: PALETTE[0], fill: PALETTE[0] } : { show: false },
      },
    ],
    axes: [{ label: x === null ? "row" : x }, { label: y, size: 64 }],
    cursor: { drag: { x: true, y: false } },
  };
  const plot = new uPlot(opts, [xs, ys], container);
  const stopFollowing = followWidth(plot, container, height);
  return {
    plot,
    points: pairs.length,
    destroy() {
      stopFollowing();
      plot.destroy();
    },
  };
}

// One episode: every camera's frame at the current step drawn on a canvas, playback at the
// dataset's fps with frames fetched ahead, a step slider and keys, the numeric features plotted
// over the steps with a line at the current step, the step's whole row, and the command that
// samples it.
//
// The container `#episode` carries the current step in `data-step` (and `data-playing`); each
// camera's canvas carries the step and LeRobot index of the frame it shows in `data-step` and
// `data-index`, set once that frame is drawn.

import { ApiError, getJson, path, request } from "./api.js";
import { PageError, h, link } from "./dom.js";
import { stepPlot } from "./plot.js";
import { datasetRoute, episodeRoute, replaceQuery } from "./route.js";
import { dimensionNames } from "./stats.js";

/** LeRobot's index columns: in the step's row, not plotted. */
const BOOKKEEPING = ["index", "frame_index", "episode_index", "task_index", "timestamp"];
/** Steps fetched ahead of the current one while playing, and while paused. */
const AHEAD_PLAYING = 24;
const AHEAD_PAUSED = 3;
/** Steps behind the current one fetched while paused (for stepping back). */
const BEHIND = 1;
/** Decoded frames kept beyond the steps wanted, behind and ahead, before they are dropped. */
const KEEP_BEHIND = 8;
const KEEP_AHEAD = 6;
/** Frame requests in flight at once (browsers open six connections per server). */
const IN_FLIGHT = 4;
/** Steps one frame request asks for. */
const STRIP = 8;

export async function episodePage(ctx) {
  const { main, signal } = ctx;
  const [name, episodeText] = ctx.params;
  if (!/^\d+$/.test(episodeText)) throw new PageError(`“${episodeText}” is not an episode index.`);
  main.append(h("p", { class: "muted" }, `Loading episode ${episodeText} of ${name}…`));
  const ep = await getJson(`/v1/datasets/${path(name)}/episodes/${episodeText}`, signal);
  const length = ep.length;
  const stepText = ctx.query.get("step");
  let start = 0;
  if (stepText !== null) {
    start = /^\d+$/.test(stepText) ? Number(stepText) : NaN;
    if (!(start < length)) {
      main.replaceChildren(
        h(
          "div",
          { class: "message error", id: "page-error", role: "alert" },
          `Episode ${ep.episode_index} of ${name} has steps 0 to ${length - 1}: there is no step ${stepText}.`,
        ),
        h(
          "p",
          null,
          link(episodeRoute(name, ep.episode_index, 0), "Go to its first step"),
          " · ",
          link(datasetRoute(name), `All episodes of ${name}`),
        ),
      );
      return;
    }
  }
  new Player(ctx, name, ep, start);
}

/** A value of the step's row as text (vectors are shown a dimension at a time). */
function text(v) {
  if (v === null || v === undefined) return "null";
  if (typeof v === "object") return JSON.stringify(v);
  return String(v);
}

function isNumeric(values) {
  const first = values.find((v) => v !== null && v !== undefined);
  if (typeof first === "number") return true;
  return Array.isArray(first) && first.length > 0 && first.every((x) => x === null || typeof x === "number");
}

/** `name` quoted for a POSIX shell when it holds anything but letters, digits and `._@-`. */
function shellWord(name) {
  return /^[A-Za-z0-9._@-]+$/.test(name) ? name : `'${name.replaceAll("'", `'\\''`)}'`;
}

/** The command that writes the sample of LeRobot index `index` of `name` to an Arrow file. */
export function sampleCommand(name, index) {
  return `lake sample ${shellWord(name)} --indices ${index} --out sample.arrow`;
}

/**
 * The frames of an episode's cameras, fetched ahead of the step shown and dropped behind it. A
 * request asks for a camera's frames at up to `STRIP` consecutive steps (`/frames`: the server
 * decodes only that camera, each GOP once, and encodes the PNGs in parallel).
 */
class Frames {
  constructor({ name, cameras, indexAt, signal, onDone }) {
    Object.assign(this, { name, cameras, indexAt, signal, onDone });
    /** Per camera, its strips: {camera, first, span, controller, done, bitmaps, error}. */
    this.strips = new Map(cameras.map((c) => [c, []]));
    this.wanted = [];
    this.length = 0;
    this.inFlight = 0;
  }

  strip(camera, step) {
    return this.strips.get(camera)?.find((s) => s.first <= step && step < s.first + s.span);
  }

  /** Camera `camera`'s frame at `step`: {done, bitmap, error}, or undefined before it is asked for. */
  entry(camera, step) {
    const s = this.strip(camera, step);
    if (!s) return undefined;
    return { camera, step, done: s.done, error: s.error, bitmap: s.bitmaps[step - s.first] ?? null };
  }

  /** Whether every camera's frame at `step` has arrived (or failed). */
  ready(step) {
    return this.cameras.every((c) => this.strip(c, step)?.done);
  }

  /** Wants the frames of `center` first, then `ahead` steps after it and `behind` before it (of `length`). */
  want(center, ahead, behind, length) {
    const steps = [center];
    for (let s = center + 1; s <= center + ahead && s < length; s++) steps.push(s);
    for (let s = center - 1; s >= center - behind && s >= 0; s--) steps.push(s);
    this.wanted = steps;
    this.length = length;
    const [low, high] = [center - behind - KEEP_BEHIND, center + ahead + KEEP_AHEAD];
    for (const [camera, strips] of this.strips) {
      const kept = strips.filter((s) => s.first + s.span > low && s.first <= high);
      for (const s of strips) if (!kept.includes(s)) this.drop(s);
      this.strips.set(camera, kept);
    }
    this.pump();
  }

  drop(strip) {
    strip.controller.abort();
    for (const b of strip.bitmaps) b?.close();
    strip.bitmaps = [];
  }

  pump() {
    if (this.signal.aborted) return;
    for (const step of this.wanted) {
      for (const camera of this.cameras) {
        if (this.inFlight >= IN_FLIGHT) return;
        if (this.strip(camera, step)) continue;
        // Up to the next strip asked for, the episode's end or a strip's worth of steps.
        const next = Math.min(this.length, ...this.strips.get(camera).filter((s) => s.first > step).map((s) => s.first));
        this.fetch(camera, step, Math.min(STRIP, next - step));
      }
    }
  }

  async fetch(camera, first, count) {
    const strip = { camera, first, span: count, controller: new AbortController(), done: false, bitmaps: [], error: null };
    this.strips.get(camera).push(strip);
    this.inFlight += 1;
    let bitmaps = [];
    let error = null;
    try {
      const url = `/v1/datasets/${path(this.name)}/frames?camera=${encodeURIComponent(camera)}&index=${this.indexAt(first)}&count=${count}`;
      const res = await request(url, { signal: AbortSignal.any([this.signal, strip.controller.signal]) });
      const sizes = (res.headers.get("Lake-Frame-Bytes") ?? "").split(",").map(Number);
      const blob = await res.blob();
      let at = 0;
      const parts = sizes.map((n) => blob.slice(at, (at += n)));
      if (!(sizes.length >= 1 && sizes.length <= count) || at !== blob.size) {
        throw new Error(`the server's frames do not add up (${sizes.length} frames, ${at} of ${blob.size} bytes)`);
      }
      // Each PNG has no colour profile and its pixels are drawn as they are (sRGB).
      const options = { colorSpaceConversion: "none", premultiplyAlpha: "none" };
      bitmaps = await Promise.all(parts.map((p) => createImageBitmap(p, options)));
    } catch (e) {
      error = e;
    }
    this.inFlight -= 1;
    const kept = this.strips.get(camera).includes(strip) && error?.name !== "AbortError";
    if (!kept) {
      for (const b of bitmaps) b.close();
      this.strips.set(camera, this.strips.get(camera).filter((s) => s !== strip));
    } else {
      // Fewer frames than asked for (the server bounds an answer's bytes): the rest is asked for next.
      Object.assign(strip, { done: true, bitmaps, error, span: error ? count : bitmaps.length });
      this.onDone(strip);
    }
    this.pump();
  }

  close() {
    for (const [camera, strips] of this.strips) {
      for (const s of strips) this.drop(s);
      this.strips.set(camera, []);
    }
  }
}

class Player {
  constructor(ctx, name, ep, start) {
    this.ctx = ctx;
    this.name = name;
    this.ep = ep;
    this.length = ep.length;
    this.fps = ep.fps > 0 ? ep.fps : 30;
    this.step = -1;
    this.playing = false;
    this.columns = ep.columns ?? {};
    this.cameras = (ep.cameras ?? []).map((c) => (typeof c === "string" ? { camera: c } : c));
    const index = this.columns.index;
    this.indexAt = (s) => (index ? index[s] : ep.from_index + s);
    this.frames = new Frames({
      name,
      cameras: this.cameras.map((c) => c.camera),
      indexAt: this.indexAt,
      signal: ctx.signal,
      onDone: (entry) => this.frameDone(entry),
    });
    this.build();
    this.seek(start);
    this.updateUrl();
    const onKey = (e) => this.key(e);
    document.addEventListener("keydown", onKey);
    ctx.onLeave(() => {
      this.pause(false);
      document.removeEventListener("keydown", onKey);
      clearTimeout(this.urlTimer);
      this.frames.close();
      for (const p of this.plots) p.destroy();
    });
  }

  build() {
    const { name, ep } = this;
    this.playButton = h("button", { type: "button", id: "play", title: "Play or pause (Space)", onclick: () => this.toggle() }, "▶ play");
    this.slider = h("input", {
      id: "step-slider",
      type: "range",
      min: "0",
      max: String(Math.max(0, this.length - 1)),
      value: "0",
      "aria-label": "step",
      oninput: () => this.seek(Number(this.slider.value)),
    });
    this.label = h("span", { id: "step-label", class: "mono" });
    this.buffering = h("span", { id: "buffering", class: "muted", hidden: true }, "loading frames…");
    this.figures = new Map();
    const cameras = h(
      "div",
      { class: "cameras", id: "cameras" },
      this.cameras.map((c) => {
        const canvas = h("canvas", { class: "frame", dataset: { camera: c.camera }, width: c.width ?? 1, height: c.height ?? 1 });
        if (c.width) canvas.style.width = `${Math.max(c.width, 320)}px`;
        const error = h("div", { class: "frame-error" });
        const figure = h(
          "figure",
          { class: "camera", dataset: { camera: c.camera } },
          canvas,
          h(
            "figcaption",
            null,
            h("span", { class: "mono" }, c.camera),
            c.width ? h("span", { class: "muted" }, ` ${c.width}×${c.height}`) : null,
          ),
          error,
        );
        this.figures.set(c.camera, { canvas, context: canvas.getContext("2d"), error, sized: Boolean(c.width) });
        return figure;
      }),
    );
    this.plots = [];
    const plotArea = h("div", { id: "plots" });
    this.row = this.rowTable();
    this.command = h("code", { id: "sample-command" });
    this.copied = h("span", { class: "muted", id: "copy-status" });
    this.container = h(
      "div",
      { id: "episode", dataset: { name, episode: ep.episode_index, length: this.length, fps: this.fps, step: "0", playing: "false" } },
      h("h1", null, link(datasetRoute(name), name), h("span", { class: "muted" }, ` · episode ${ep.episode_index}`)),
      h(
        "p",
        { class: "tasks" },
        (ep.tasks ?? []).map((t) => h("span", { class: "task" }, t)),
      ),
      h(
        "div",
        { class: "controls" },
        this.playButton,
        h("button", { type: "button", id: "step-back", title: "Previous step (←)", onclick: () => this.stepBy(-1) }, "‹"),
        h("button", { type: "button", id: "step-forward", title: "Next step (→)", onclick: () => this.stepBy(1) }, "›"),
        this.slider,
        this.label,
        this.buffering,
      ),
      this.cameras.length ? cameras : h("p", { class: "muted" }, "This dataset has no cameras."),
      h(
        "p",
        { class: "muted small" },
        `Keys: ← → a step, Space plays or pauses, Home and End the first and last step. Click or drag on a plot to go to a step. ${this.fps} fps.`,
      ),
      h("h2", null, "Features over the episode"),
      plotArea,
      h("h2", null, "This step"),
      h(
        "div",
        { class: "sample" },
        this.command,
        h("button", { type: "button", id: "copy-sample", onclick: () => this.copy() }, "copy"),
        this.copied,
      ),
      h("div", { class: "scroll" }, this.row.table),
    );
    this.ctx.main.replaceChildren(this.container);
    this.buildPlots(plotArea);
  }

  buildPlots(area) {
    const xs = Float64Array.from({ length: this.length }, (_, i) => i);
    const keys = Object.keys(this.columns).filter((k) => !BOOKKEEPING.includes(k) && isNumeric(this.columns[k]));
    if (keys.length === 0) {
      area.append(h("p", { class: "muted" }, "No numeric feature to plot."));
      return;
    }
    for (const key of keys) {
      const values = this.columns[key];
      const first = values.find((v) => v !== null && v !== undefined);
      const n = Array.isArray(first) ? first.length : 1;
      const ys = Array.isArray(first)
        ? Array.from({ length: n }, (_, d) => values.map((v) => v?.[d] ?? null))
        : [values.map((v) => v ?? null)];
      const names = this.ep.names?.[key]?.length === n ? this.ep.names[key].map(String) : dimensionNames(null, n, key);
      const holder = h("div", { class: "plot" });
      area.append(h("figure", { class: "feature-plot", dataset: { feature: key } }, h("figcaption", { class: "mono" }, key), holder));
      this.plots.push(stepPlot(holder, { key, xs, ys, names, onSeek: (s) => this.seek(s) }));
    }
  }

  rowTable() {
    const cells = [];
    const body = h("tbody");
    for (const [key, values] of Object.entries(this.columns)) {
      const first = values.find((v) => v !== null && v !== undefined);
      if (Array.isArray(first) && isNumeric(values)) {
        const names =
          this.ep.names?.[key]?.length === first.length ? this.ep.names[key].map(String) : dimensionNames(null, first.length, key);
        const spans = names.map(() => h("span", { class: "dim-value" }));
        body.append(
          h(
            "tr",
            { dataset: { key } },
            h("th", { class: "mono" }, key),
            h(
              "td",
              null,
              h(
                "div",
                { class: "dims" },
                names.map((n, i) => h("span", { class: "dim" }, h("span", { class: "dim-name" }, n), spans[i])),
              ),
            ),
          ),
        );
        cells.push((s) => {
          const v = values[s];
          spans.forEach((span, i) => (span.textContent = text(v?.[i])));
        });
      } else {
        const td = h("td", { class: "mono wrap" });
        body.append(h("tr", { dataset: { key } }, h("th", { class: "mono" }, key), td));
        cells.push((s) => (td.textContent = text(values[s])));
      }
    }
    return {
      table: h(
        "table",
        { class: "grid compact", id: "step-row" },
        h("thead", null, h("tr", null, h("th", null, "feature"), h("th", null, "value"))),
        body,
      ),
      cells,
    };
  }

  /** Shows `step` (clamped to the episode): frames, slider, plots' step lines, row and command. */
  seek(step) {
    const s = Math.max(0, Math.min(this.length - 1, Math.round(step)));
    if (s === this.step) return;
    this.step = s;
    this.container.dataset.step = String(s);
    this.slider.value = String(s);
    const ts = this.columns.timestamp?.[s];
    this.label.textContent = `step ${s} / ${this.length - 1} · index ${this.indexAt(s)}${typeof ts === "number" ? ` · ${ts.toFixed(3)} s` : ""}`;
    this.frames.want(s, this.playing ? AHEAD_PLAYING : AHEAD_PAUSED, this.playing ? 0 : BEHIND, this.length);
    for (const camera of this.figures.keys()) this.draw(camera, s);
    for (const p of this.plots) p.setStep(s);
    for (const update of this.row.cells) update(s);
    this.command.textContent = sampleCommand(this.name, this.indexAt(s));
    if (!this.playing) this.scheduleUrl();
  }

  stepBy(delta) {
    this.pause();
    this.seek(this.step + delta);
  }

  draw(camera, step) {
    const fig = this.figures.get(camera);
    const entry = this.frames.entry(camera, step);
    if (!entry?.done) return;
    if (entry.error) {
      if (entry.error instanceof ApiError && entry.error.status === 401) {
        this.ctx.fail(entry.error);
        return;
      }
      fig.error.textContent = `step ${step}: ${entry.error.message}`;
      fig.canvas.dataset.error = String(step);
      return;
    }
    const { bitmap } = entry;
    fig.error.textContent = "";
    delete fig.canvas.dataset.error;
    if (fig.canvas.width !== bitmap.width || fig.canvas.height !== bitmap.height) {
      fig.canvas.width = bitmap.width;
      fig.canvas.height = bitmap.height;
    }
    if (!fig.sized) {
      fig.canvas.style.width = `${Math.max(bitmap.width, 320)}px`;
      fig.sized = true;
    }
    fig.context.drawImage(bitmap, 0, 0);
    fig.canvas.dataset.step = String(step);
    fig.canvas.dataset.index = String(this.indexAt(step));
  }

  frameDone(strip) {
    if (strip.first <= this.step && this.step < strip.first + strip.span) this.draw(strip.camera, this.step);
  }

  toggle() {
    if (this.playing) this.pause();
    else this.play();
  }

  play() {
    if (this.playing || this.length < 2) return;
    if (this.step >= this.length - 1) this.seek(0);
    this.playing = true;
    this.container.dataset.playing = "true";
    this.playButton.textContent = "❚❚ pause";
    this.frames.want(this.step, AHEAD_PLAYING, 0, this.length);
    this.due = performance.now() + 1000 / this.fps;
    const tick = (now) => {
      if (!this.playing) return;
      if (now >= this.due) {
        const next = this.step + 1;
        if (next >= this.length) {
          this.pause();
          return;
        }
        if (this.frames.ready(next)) {
          this.buffering.hidden = true;
          this.seek(next);
          this.due += 1000 / this.fps;
          // After a wait for frames, play on from now rather than catch up.
          if (this.due < now) this.due = now + 1000 / this.fps;
        } else {
          this.buffering.hidden = false;
        }
      }
      this.frame = requestAnimationFrame(tick);
    };
    this.frame = requestAnimationFrame(tick);
  }

  pause(rememberStep = true) {
    if (!this.playing) return;
    this.playing = false;
    cancelAnimationFrame(this.frame);
    this.container.dataset.playing = "false";
    this.playButton.textContent = "▶ play";
    this.buffering.hidden = true;
    this.frames.want(this.step, AHEAD_PAUSED, BEHIND, this.length);
    if (rememberStep) this.scheduleUrl();
  }

  scheduleUrl() {
    clearTimeout(this.urlTimer);
    this.urlTimer = setTimeout(() => this.updateUrl(), 200);
  }

  updateUrl() {
    replaceQuery(new URLSearchParams({ step: String(this.step) }));
  }

  key(e) {
    if (e.defaultPrevented || e.altKey || e.ctrlKey || e.metaKey) return;
    const t = e.target;
    const typing =
      t instanceof HTMLElement &&
      (t.isContentEditable ||
        t.tagName === "TEXTAREA" ||
        t.tagName === "SELECT" ||
        (t.tagName === "INPUT" && !["range", "checkbox", "button"].includes(t.type)));
    if (typing) return;
    switch (e.key) {
      case "ArrowLeft":
        this.stepBy(-1);
        break;
      case "ArrowRight":
        this.stepBy(1);
        break;
      case " ":
        this.toggle();
        break;
      case "Home":
        this.pause();
        this.seek(0);
        break;
      case "End":
        this.pause();
        this.seek(this.length - 1);
        break;
      default:
        return;
    }
    e.preventDefault();
  }

  async copy() {
    const command = this.command.textContent;
    try {
      await navigator.clipboard.writeText(command);
      this.copied.textContent = "copied";
    } catch {
      // Without the clipboard API (a page not served over HTTPS or from localhost), select the
      // command for the browser's own copy.
      const range = document.createRange();
      range.selectNodeContents(this.command);
      const selection = getSelection();
      selection.removeAllRanges();
      selection.addRange(range);
      this.copied.textContent = document.execCommand("copy") ? "copied" : "selected: press Ctrl+C to copy";
    }
    clearTimeout(this.copiedTimer);
    this.copiedTimer = setTimeout(() => (this.copied.textContent = ""), 2500);
  }
}

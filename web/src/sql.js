// The SQL console: a query box (Ctrl/Cmd+Enter runs it), the queries run before (kept in
// localStorage), the answer as a paged table with a chart of one column against another, errors
// with a caret at their position, and saving the query as a view.

import { ApiError, getJson, postJson, request } from "./api.js";
import { cell, count, h, link, message } from "./dom.js";
import { xyPlot } from "./plot.js";
import { datasetRoute } from "./route.js";

/** Rows a query's answer keeps; one more is asked for, to know whether there were more. */
const MAX_ROWS = 10000;
const PAGE = 100;
const HISTORY_KEY = "lake.sql.history";
const HISTORY_SIZE = 50;
const DRAFT_KEY = "lake.sql.draft";
const EXAMPLE =
  "SELECT dataset, count(*) AS episodes, sum(length) AS steps, avg(length) AS mean_length\nFROM episodes\nGROUP BY dataset\nORDER BY dataset";

function loadHistory() {
  try {
    const list = JSON.parse(localStorage.getItem(HISTORY_KEY) ?? "[]");
    return Array.isArray(list) ? list.filter((q) => typeof q === "string") : [];
  } catch {
    return [];
  }
}

function remember(query) {
  const list = [query, ...loadHistory().filter((q) => q !== query)].slice(0, HISTORY_SIZE);
  localStorage.setItem(HISTORY_KEY, JSON.stringify(list));
}

/**
 * Where an SQL error points: `position` from the answer's JSON, else `Line: L, Column: C` in its
 * message; null when neither is there.
 */
export function errorPosition(error) {
  const p = error?.body?.position;
  if (p && Number.isInteger(p.line) && Number.isInteger(p.column)) return { line: p.line, column: p.column };
  const m = /Line: (\d+), Column: (\d+)/.exec(error?.message ?? "");
  return m ? { line: Number(m[1]), column: Number(m[2]) } : null;
}

export async function sqlPage(ctx) {
  const { main } = ctx;
  const box = h("textarea", {
    id: "sql-query",
    spellcheck: "false",
    rows: 8,
    "aria-label": "SQL query",
    oninput: () => localStorage.setItem(DRAFT_KEY, box.value),
    onkeydown: (e) => {
      if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) {
        e.preventDefault();
        run();
      }
    },
  });
  box.value = localStorage.getItem(DRAFT_KEY) ?? EXAMPLE;
  const runButton = h("button", { type: "button", id: "sql-run", class: "primary", onclick: () => run() }, "Run");
  const status = h("span", { id: "sql-status", class: "muted" });
  const errorArea = h("div", { id: "sql-error-area" });
  const results = h("div", { id: "sql-results" });
  const history = h("ol", { id: "sql-history", class: "history" });
  const viewName = h("input", { id: "view-name", type: "text", placeholder: "view name", spellcheck: "false" });
  const replace = h("input", { id: "view-replace", type: "checkbox" });
  const viewStatus = h("div", { id: "view-status" });
  const saveButton = h("button", { type: "button", id: "view-save", onclick: () => saveView() }, "Save as view");
  let running = null;
  let shown = null;
  ctx.onLeave(() => shown?.destroy());

  const showHistory = () => {
    const list = loadHistory();
    history.replaceChildren(
      ...(list.length
        ? list.map((q) =>
            h(
              "li",
              null,
              h(
                "button",
                {
                  type: "button",
                  class: "link mono",
                  title: q,
                  onclick: () => {
                    box.value = q;
                    localStorage.setItem(DRAFT_KEY, q);
                    box.focus();
                  },
                },
                q.length > 160 ? `${q.slice(0, 160)}…` : q,
              ),
            ),
          )
        : [h("li", { class: "muted empty" }, "Queries you run are listed here.")]),
    );
  };

  const run = async () => {
    const query = box.value;
    if (!query.trim()) return;
    running?.abort();
    const controller = new AbortController();
    running = controller;
    remember(query);
    showHistory();
    errorArea.replaceChildren();
    status.textContent = "running…";
    runButton.disabled = true;
    const started = performance.now();
    try {
      const res = await request(`/v1/sql?max_rows=${MAX_ROWS + 1}`, {
        method: "POST",
        body: query,
        signal: AbortSignal.any([ctx.signal, controller.signal]),
        headers: { Accept: "application/json", "Content-Type": "text/plain; charset=utf-8" },
      });
      const body = await res.text();
      let rows;
      try {
        rows = JSON.parse(body);
      } catch {
        throw new Error("the answer was cut short: the query failed while its rows were being sent (the server log says why)");
      }
      if (running !== controller) return;
      const more = rows.length > MAX_ROWS;
      if (more) rows = rows.slice(0, MAX_ROWS);
      const seconds = ((performance.now() - started) / 1000).toFixed(2);
      status.textContent = `${count(rows.length)} row${rows.length === 1 ? "" : "s"} in ${seconds} s`;
      shown?.destroy();
      shown = resultView(rows, more);
      results.replaceChildren(shown.element);
    } catch (e) {
      if (e.name === "AbortError" || running !== controller) return;
      if (e instanceof ApiError && e.status === 401) {
        ctx.fail(e);
        return;
      }
      status.textContent = "";
      errorArea.replaceChildren(errorView(query, e));
    } finally {
      if (running === controller) {
        runButton.disabled = false;
        running = null;
      }
    }
  };

  const saveView = async () => {
    const name = viewName.value.trim();
    if (!name) {
      viewStatus.replaceChildren(message("error", "Name the view first."));
      viewName.focus();
      return;
    }
    saveButton.disabled = true;
    viewStatus.replaceChildren(h("span", { class: "muted" }, "saving…"));
    try {
      const view = await postJson("/v1/views", { name, sql: box.value, replace: replace.checked }, ctx.signal);
      viewStatus.replaceChildren(
        message(
          "note",
          h("span", null, "Saved ", link(datasetRoute(view.name), `${view.name}@${view.version}`), `: ${count(view.episodes)} episodes.`),
          "view-saved",
        ),
      );
    } catch (e) {
      if (e.name === "AbortError") return;
      if (e instanceof ApiError && e.status === 401) {
        ctx.fail(e);
        return;
      }
      viewStatus.replaceChildren(message("error", e.message, "view-error"));
    } finally {
      saveButton.disabled = false;
    }
  };

  // A read-only server refuses views: say so in place of the form.
  const server = await getJson("/v1/server", ctx.signal);
  const saving = server.read_only
    ? [
        message(
          "note",
          h(
            "span",
            null,
            "This server serves its lake read-only (",
            h("code", null, "lake serve --read-only"),
            "): make views with ",
            h("code", null, 'lake view create NAME "SQL"'),
            ", or through a server that may write.",
          ),
          "view-read-only",
        ),
      ]
    : [h("div", { class: "row" }, viewName, h("label", null, replace, " replace an existing view"), saveButton), viewStatus];

  main.append(
    h("h1", null, "SQL"),
    h(
      "p",
      { class: "muted small" },
      'Tables: datasets, steps, episodes, tasks, feature_stats, findings, views, and each dataset\'s own as "NAME".steps and so on. Ctrl+Enter (⌘+Enter) runs the query.',
    ),
    h(
      "div",
      { class: "sql-layout" },
      h("div", { class: "sql-main" }, box, h("div", { class: "row" }, runButton, status), errorArea),
      h("aside", null, h("h3", null, "History"), history),
    ),
    results,
    h(
      "section",
      { class: "save-view" },
      h("h2", null, "Save as view"),
      h(
        "p",
        { class: "muted small" },
        "A view is a named training set: the query must answer episode_index (and dataset, when the lake holds several).",
      ),
      ...saving,
    ),
  );
  showHistory();
  box.focus();
}

function errorView(query, error) {
  const where = errorPosition(error);
  const parts = [h("div", { class: "message error", id: "sql-error", role: "alert" }, error.message)];
  if (where) {
    const line = query.split("\n")[where.line - 1];
    if (line !== undefined) {
      const caret = `${" ".repeat(Math.max(0, where.column - 1))}^`;
      parts.push(
        h("pre", { class: "caret", id: "sql-error-position", dataset: { line: where.line, column: where.column } }, `${line}\n${caret}`),
      );
    }
  }
  return h("div", null, parts);
}

function numericColumns(rows, columns) {
  return columns.filter((c) => rows.some((r) => typeof r[c] === "number") && rows.every((r) => r[c] === null || typeof r[c] === "number"));
}

/** A query's rows: a paged table, and a chart when two columns (or a column and the row) hold numbers. */
function resultView(rows, more) {
  const columns = [];
  for (const r of rows) for (const k of Object.keys(r)) if (!columns.includes(k)) columns.push(k);
  const pages = Math.max(1, Math.ceil(rows.length / PAGE));
  let page = 0;
  const body = h("tbody");
  const position = h("span", { id: "sql-page" });
  const prev = h("button", { type: "button", id: "sql-prev", onclick: () => show(page - 1) }, "‹ previous");
  const next = h("button", { type: "button", id: "sql-next", onclick: () => show(page + 1) }, "next ›");
  const show = (p) => {
    page = Math.max(0, Math.min(pages - 1, p));
    const slice = rows.slice(page * PAGE, (page + 1) * PAGE);
    body.replaceChildren(
      ...slice.map((r) =>
        h(
          "tr",
          null,
          columns.map((c) => {
            const v = r[c];
            return h("td", { class: v === null || v === undefined ? "null" : typeof v === "number" ? "num" : "" }, cell(v));
          }),
        ),
      ),
    );
    position.textContent = rows.length
      ? `rows ${count(page * PAGE + 1)}–${count(page * PAGE + slice.length)} of ${count(rows.length)}`
      : "no rows";
    prev.disabled = page === 0;
    next.disabled = page >= pages - 1;
  };
  show(0);
  const table = h(
    "table",
    { class: "grid", id: "sql-table", dataset: { rows: rows.length, more: more ? "true" : "false" } },
    h(
      "thead",
      null,
      h(
        "tr",
        null,
        columns.map((c) => h("th", null, c)),
      ),
    ),
    body,
  );
  const chart = chartView(rows, columns);
  return {
    element: h(
      "div",
      null,
      more
        ? message(
            "note",
            `The answer has more than ${count(MAX_ROWS)} rows: only the first ${count(MAX_ROWS)} are shown (add a LIMIT or an aggregate to see the rest).`,
            "sql-more",
          )
        : null,
      h("div", { class: "scroll" }, table),
      h("div", { class: "pager" }, prev, position, next),
      chart.element,
    ),
    destroy: chart.destroy,
  };
}

function chartView(rows, columns) {
  const numeric = numericColumns(rows, columns);
  if (rows.length === 0 || numeric.length === 0) return { element: null, destroy: () => {} };
  const ROW = "";
  const options = (list, chosen) => list.map((c) => h("option", { value: c, selected: c === chosen }, c === ROW ? "(row number)" : c));
  const xChoice = numeric.length > 1 ? numeric[0] : ROW;
  const yChoice = numeric.length > 1 ? numeric[1] : numeric[0];
  const xSelect = h("select", { id: "chart-x", onchange: () => draw() }, options([ROW, ...numeric], xChoice));
  const ySelect = h("select", { id: "chart-y", onchange: () => draw() }, options(numeric, yChoice));
  const modeSelect = h(
    "select",
    { id: "chart-mode", onchange: () => draw() },
    h("option", { value: "scatter" }, "points"),
    h("option", { value: "line" }, "line"),
  );
  const holder = h("div", { class: "plot", id: "sql-chart" });
  const note = h("span", { class: "muted small" });
  let plot = null;
  const draw = () => {
    plot?.destroy();
    holder.replaceChildren();
    const x = xSelect.value === ROW ? null : xSelect.value;
    plot = xyPlot(holder, { rows, x, y: ySelect.value, mode: modeSelect.value });
    note.textContent = `${count(plot.points)} points${plot.points < rows.length ? ` (${count(rows.length - plot.points)} rows without numbers left out)` : ""}`;
  };
  const element = h(
    "section",
    { class: "chart" },
    h("h2", null, "Chart"),
    h("div", { class: "row" }, h("label", null, "x ", xSelect), h("label", null, "y ", ySelect), h("label", null, "as ", modeSelect), note),
    holder,
  );
  // Drawn once in the page, where the holder has its width.
  requestAnimationFrame(() => element.isConnected && draw());
  return { element, destroy: () => plot?.destroy() };
}

// One dataset's page: its facts, tasks, episodes (filtered, sorted and paged by the server),
// per-feature statistics and ingest findings. A view's page shows what it selects.

import { ApiError, getJson, path } from "./api.js";
import { bytes, count, h, link, message } from "./dom.js";
import { frameTables, selects } from "./datasets.js";
import { findingsList } from "./findings.js";
import { episodeRoute, replaceQuery } from "./route.js";
import { statsSection } from "./stats.js";

const PAGE = 50;
const SORTS = ["episode_index", "length", "findings"];

export async function datasetPage(ctx) {
  const { main, signal } = ctx;
  const [name] = ctx.params;
  main.append(h("p", { class: "muted" }, `Loading ${name}…`));
  const d = await getJson(`/v1/datasets/${path(name)}?episodes=false`, signal);
  if (d.kind === "view") {
    main.replaceChildren(viewDetails(d));
    return;
  }
  const findings = h("div", { id: "findings" }, h("p", { class: "muted" }, "Loading findings…"));
  main.replaceChildren(
    h(
      "div",
      { id: "dataset", dataset: { name: d.name, version: d.version } },
      h("h1", null, d.name, h("span", { class: "muted" }, ` @${d.version}`)),
      facts(d),
    ),
    h("h2", null, "Episodes"),
    episodesTable(ctx, name),
    h("h2", null, "Tasks"),
    tasksList(d.tasks ?? []),
    h("h2", null, "Statistics"),
    statsSection(d.features, d.stats, ctx.onLeave),
    h("h2", null, "Ingest findings"),
    findings,
  );
  try {
    findings.replaceChildren(await findingsList(name, signal));
  } catch (e) {
    ctx.fail(e, findings);
  }
}

function facts(d) {
  const c = d.counts ?? {};
  const source = d.source ?? {};
  const rows = [
    ["fps", d.fps],
    ["episodes", count(c.episodes)],
    ["steps", count(c.steps)],
    ["tasks", count(c.tasks)],
    c.skipped_episodes ? ["skipped episodes", count(c.skipped_episodes)] : null,
    ["source", h("span", { class: "path" }, source.url ?? "–")],
    ["LeRobot format", source.codebase_version ?? "–"],
    source.bytes !== undefined ? ["source bytes", bytes(source.bytes)] : null,
  ].filter(Boolean);
  return h(
    "div",
    { class: "facts" },
    h(
      "dl",
      null,
      rows.map(([k, v]) => [h("dt", null, k), h("dd", null, v)]),
    ),
    h(
      "div",
      null,
      h("h3", null, "Cameras"),
      (d.cameras ?? []).length === 0
        ? h("p", { class: "muted" }, "none")
        : h(
            "table",
            { class: "grid compact", id: "cameras" },
            h(
              "thead",
              null,
              h(
                "tr",
                null,
                ["camera", "codec", "size", "longest GOP", "files"].map((t) => h("th", null, t)),
              ),
            ),
            h(
              "tbody",
              null,
              d.cameras.map((cam) =>
                h(
                  "tr",
                  null,
                  h("td", { class: "mono" }, cam.camera),
                  h("td", null, cam.codec ?? cam.kind ?? ""),
                  h("td", { class: "num" }, cam.width && cam.height ? `${cam.width}×${cam.height}` : ""),
                  h("td", { class: "num" }, cam.max_gop ?? ""),
                  h("td", { class: "num" }, cam.files ?? ""),
                ),
              ),
            ),
          ),
      h("h3", null, "Frame tables"),
      frameTables(d.frame_tables ?? []),
    ),
  );
}

/** Tasks listed before a "show all" button (datasets may have thousands). */
const TASKS_SHOWN = 100;

function tasksList(tasks) {
  if (tasks.length === 0) return h("p", { class: "muted" }, "No tasks.");
  const row = (t) => h("tr", null, h("td", { class: "num" }, t.task_index), h("td", { class: "wrap" }, t.task));
  const body = h("tbody", null, tasks.slice(0, TASKS_SHOWN).map(row));
  const more =
    tasks.length > TASKS_SHOWN
      ? h(
          "button",
          {
            type: "button",
            id: "tasks-all",
            onclick: (e) => {
              body.append(...tasks.slice(TASKS_SHOWN).map(row));
              e.currentTarget.remove();
            },
          },
          `show all ${count(tasks.length)} tasks`,
        )
      : null;
  return h(
    "div",
    null,
    h(
      "table",
      { class: "grid compact", id: "tasks" },
      h("thead", null, h("tr", null, h("th", null, "task_index"), h("th", null, "task"))),
      body,
    ),
    more,
  );
}

function viewDetails(v) {
  return h(
    "div",
    { id: "view", dataset: { name: v.name, version: v.version } },
    h("h1", null, v.name, h("span", { class: "muted" }, ` @${v.version} · view`)),
    h(
      "dl",
      { class: "facts" },
      h("dt", null, "episodes"),
      h("dd", null, count(v.episodes)),
      h("dt", null, "created"),
      h("dd", null, v.created_at ?? "–"),
    ),
    h("h2", null, "Selects"),
    selects(v.selects ?? []),
    h("h2", null, "SQL"),
    h("pre", { class: "sql" }, v.sql ?? ""),
  );
}

/** The filter and page state read from, and written back to, the URL's query. */
function readState(query) {
  const int = (k) => {
    const v = query.get(k);
    return v !== null && /^\d+$/.test(v) ? Number(v) : null;
  };
  return {
    offset: int("offset") ?? 0,
    sort: SORTS.includes(query.get("sort")) ? query.get("sort") : "episode_index",
    order: query.get("order") === "desc" ? "desc" : "asc",
    task: query.get("task") ?? "",
    min_length: int("min_length"),
    max_length: int("max_length"),
    with_findings: query.get("with_findings") === "true",
  };
}

function stateQuery(state) {
  const q = new URLSearchParams();
  if (state.offset) q.set("offset", state.offset);
  if (state.sort !== "episode_index") q.set("sort", state.sort);
  if (state.order !== "asc") q.set("order", state.order);
  if (state.task) q.set("task", state.task);
  if (state.min_length !== null) q.set("min_length", state.min_length);
  if (state.max_length !== null) q.set("max_length", state.max_length);
  if (state.with_findings) q.set("with_findings", "true");
  return q;
}

function episodesTable(ctx, name) {
  const state = readState(ctx.query);
  const total = h("span", { id: "episodes-total" });
  const body = h("tbody");
  const status = h("div", { id: "episodes-status" });
  let pending = null;
  let shown = 0;

  const load = async () => {
    replaceQuery(stateQuery(state));
    pending?.abort();
    const controller = new AbortController();
    pending = controller;
    const q = stateQuery(state);
    q.set("limit", PAGE);
    q.set("offset", state.offset);
    table.setAttribute("aria-busy", "true");
    try {
      const page = await getJson(`/v1/datasets/${path(name)}/episodes?${q}`, AbortSignal.any([ctx.signal, controller.signal]));
      if (page.total > 0 && page.offset >= page.total) {
        state.offset = Math.floor((page.total - 1) / PAGE) * PAGE;
        return load();
      }
      status.replaceChildren();
      render(page);
    } catch (e) {
      if (e.name === "AbortError") return;
      if (e instanceof ApiError && e.status === 400) status.replaceChildren(message("error", e.message));
      else ctx.fail(e, status);
    } finally {
      if (pending === controller) table.removeAttribute("aria-busy");
    }
  };

  const render = (page) => {
    shown = page.rows.length;
    const first = page.rows.length ? page.offset + 1 : 0;
    total.textContent =
      page.total === 0
        ? "No episode matches."
        : `${count(first)}–${count(page.offset + page.rows.length)} of ${count(page.total)} episodes`;
    total.dataset.total = page.total;
    body.replaceChildren(
      ...page.rows.map((e) =>
        h(
          "tr",
          { dataset: { episode: e.episode_index } },
          h("td", { class: "num" }, link(episodeRoute(name, e.episode_index), String(e.episode_index))),
          h("td", { class: "num" }, count(e.length)),
          h("td", { class: "wrap" }, e.tasks.join(" · ")),
          h("td", { class: "num" }, e.findings ? h("span", { class: "badge warning" }, e.findings) : "0"),
          h("td", { class: "num" }, count(e.from_index)),
        ),
      ),
    );
    prev.disabled = page.offset === 0;
    first_.disabled = page.offset === 0;
    next.disabled = page.offset + page.rows.length >= page.total;
    last.disabled = next.disabled;
    last.dataset.offset = Math.max(0, Math.floor((page.total - 1) / PAGE) * PAGE);
    for (const th of headers) {
      const on = th.dataset.sort === state.sort;
      th.setAttribute("aria-sort", on ? (state.order === "asc" ? "ascending" : "descending") : "none");
    }
  };

  const change = (fn) => {
    fn();
    state.offset = 0;
    load();
  };
  let typing = null;
  const debounced = (fn) => {
    clearTimeout(typing);
    typing = setTimeout(() => change(fn), 250);
  };
  ctx.onLeave(() => clearTimeout(typing));
  const lengthValue = (input) => (input.value === "" ? null : Math.max(0, Math.floor(Number(input.value))));

  const headers = [
    ["episode", "episode_index"],
    ["length", "length"],
    ["tasks", null],
    ["findings", "findings"],
    ["first index", null],
  ].map(([label, sort]) =>
    sort
      ? h(
          "th",
          {
            class: "sortable",
            dataset: { sort },
            tabindex: "0",
            onclick: () =>
              change(() => {
                if (state.sort === sort) state.order = state.order === "asc" ? "desc" : "asc";
                else [state.sort, state.order] = [sort, sort === "episode_index" ? "asc" : "desc"];
              }),
            onkeydown: (e) => {
              if (e.key === "Enter" || e.key === " ") {
                e.preventDefault();
                e.currentTarget.click();
              }
            },
          },
          label,
        )
      : h("th", null, label),
  );
  const table = h("table", { class: "grid", id: "episodes" }, h("thead", null, h("tr", null, headers)), body);
  const first_ = h(
    "button",
    {
      type: "button",
      id: "episodes-first",
      onclick: () => {
        state.offset = 0;
        load();
      },
    },
    "« first",
  );
  const prev = h(
    "button",
    {
      type: "button",
      id: "episodes-prev",
      onclick: () => {
        state.offset = Math.max(0, state.offset - PAGE);
        load();
      },
    },
    "‹ previous",
  );
  const next = h(
    "button",
    {
      type: "button",
      id: "episodes-next",
      onclick: () => {
        state.offset += shown;
        load();
      },
    },
    "next ›",
  );
  const last = h(
    "button",
    {
      type: "button",
      id: "episodes-last",
      onclick: () => {
        state.offset = Number(last.dataset.offset);
        load();
      },
    },
    "last »",
  );
  const filters = h(
    "div",
    { class: "filters" },
    h(
      "label",
      null,
      "task ",
      h("input", {
        id: "filter-task",
        type: "search",
        value: state.task,
        placeholder: "text in a task",
        oninput: (e) => debounced(() => (state.task = e.target.value.trim())),
      }),
    ),
    h(
      "label",
      null,
      "length ≥ ",
      h("input", {
        id: "filter-min",
        type: "number",
        min: "0",
        value: state.min_length ?? "",
        oninput: (e) => debounced(() => (state.min_length = lengthValue(e.target))),
      }),
    ),
    h(
      "label",
      null,
      "length ≤ ",
      h("input", {
        id: "filter-max",
        type: "number",
        min: "0",
        value: state.max_length ?? "",
        oninput: (e) => debounced(() => (state.max_length = lengthValue(e.target))),
      }),
    ),
    h(
      "label",
      null,
      h("input", {
        id: "filter-findings",
        type: "checkbox",
        checked: state.with_findings,
        onchange: (e) => change(() => (state.with_findings = e.target.checked)),
      }),
      " only with findings",
    ),
  );
  load();
  return h(
    "section",
    { id: "episodes-section" },
    filters,
    status,
    h("div", { class: "scroll" }, table),
    h("div", { class: "pager" }, first_, prev, total, next, last),
  );
}

// The datasets page: every dataset and view of the lake.

import { getJson } from "./api.js";
import { bytes, count, duration, fill, h, link, message } from "./dom.js";
import { findingBadges, findingsList } from "./findings.js";
import { datasetRoute } from "./route.js";

export async function datasetsPage(ctx) {
  const { main, signal } = ctx;
  main.append(h("p", { class: "muted" }, "Loading datasets…"));
  const lake = await getJson("/v1/datasets", signal);
  const panel = h("section", { id: "findings-panel", hidden: true });
  fill(
    main,
    h("h1", null, "Datasets"),
    lake.unreadable?.length ? unreadable(lake.unreadable) : null,
    lake.datasets.length === 0
      ? message("note", "The lake holds no datasets yet: add one with `lake ingest`.")
      : datasetsTable(lake.datasets, (name, button) => showFindings(ctx, panel, name, button)),
    panel,
    h("h2", null, "Views"),
    lake.views.length === 0
      ? h("p", { class: "muted" }, "No views (make one in the SQL console, or with `lake view create`).")
      : viewsTable(lake.views),
  );
}

function unreadable(list) {
  const names = list.map((u) => `${u.kind} ${u.name}${u.version ? `@${u.version}` : ""}`).join(", ");
  return message("error", `These cannot be read (files lost or damaged on disk): ${names}.`, "unreadable");
}

function datasetsTable(datasets, onFindings) {
  const columns = ["dataset", "version", "fps", "episodes", "steps", "duration", "cameras", "on disk", "frame tables", "tasks", "findings"];
  return h(
    "div",
    { class: "scroll" },
    h(
      "table",
      { class: "grid", id: "datasets" },
      h(
        "thead",
        null,
        h(
          "tr",
          null,
          columns.map((c) => h("th", null, c)),
        ),
      ),
      h(
        "tbody",
        null,
        datasets.map((d) =>
          h(
            "tr",
            { dataset: { name: d.name } },
            h("td", null, link(datasetRoute(d.name), d.name), d.robot_type ? h("div", { class: "muted small" }, d.robot_type) : null),
            h("td", { class: "num" }, d.version),
            h("td", { class: "num" }, d.fps),
            h("td", { class: "num" }, count(d.episodes)),
            h("td", { class: "num" }, count(d.steps)),
            h("td", { class: "num" }, duration(d.duration_s)),
            h("td", null, cameraList(d.camera_list ?? [])),
            h("td", { class: "num" }, bytes(d.bytes)),
            h("td", null, frameTables(d.frame_tables ?? [])),
            h("td", { class: "num" }, count(d.tasks)),
            h(
              "td",
              null,
              Object.values(d.findings ?? {}).some((n) => n > 0)
                ? h(
                    "button",
                    { type: "button", class: "link findings-open", onclick: (e) => onFindings(d.name, e.currentTarget) },
                    findingBadges(d.findings),
                  )
                : findingBadges(d.findings),
            ),
          ),
        ),
      ),
    ),
  );
}

function cameraList(cameras) {
  if (cameras.length === 0) return h("span", { class: "muted" }, "none");
  return h(
    "ul",
    { class: "plain" },
    cameras.map((c) =>
      h(
        "li",
        null,
        h("span", { class: "mono" }, c.camera),
        " ",
        h("span", { class: "muted" }, [c.codec, c.width && c.height ? `${c.width}×${c.height}` : null].filter(Boolean).join(" · ")),
      ),
    ),
  );
}

/** A frame table as `lake cache` made it: size, storage, frames and bytes (and damage, if any). */
export function frameTables(tables) {
  if (tables.length === 0) return h("span", { class: "muted" }, "none");
  return h(
    "ul",
    { class: "plain" },
    tables.map((t) => {
      const size = t.size ? `${t.size.width}×${t.size.height}` : "as recorded";
      const facts = [
        size,
        t.storage ?? "unreadable",
        t.frames === null || t.frames === undefined ? null : `${count(t.frames)} frames`,
        bytes(t.bytes),
      ];
      return h("li", null, facts.filter(Boolean).join(" · "), t.damage ? h("div", { class: "badge error" }, t.damage) : null);
    }),
  );
}

async function showFindings(ctx, panel, name, button) {
  if (!panel.hidden && panel.dataset.name === name) {
    panel.hidden = true;
    return;
  }
  panel.hidden = false;
  panel.dataset.name = name;
  const body = h("div", null, h("p", { class: "muted" }, "Loading findings…"));
  panel.replaceChildren(h("h2", null, `Findings of ${name}`), body);
  button.blur();
  try {
    body.replaceChildren(await findingsList(name, ctx.signal));
  } catch (e) {
    ctx.fail(e, body);
  }
}

function viewsTable(views) {
  return h(
    "div",
    { class: "scroll" },
    h(
      "table",
      { class: "grid", id: "views" },
      h(
        "thead",
        null,
        h(
          "tr",
          null,
          ["view", "version", "episodes", "selects", "SQL", "created"].map((c) => h("th", null, c)),
        ),
      ),
      h(
        "tbody",
        null,
        views.map((v) =>
          h(
            "tr",
            { dataset: { name: v.name } },
            h("td", null, link(datasetRoute(v.name), v.name)),
            h("td", { class: "num" }, v.version),
            h("td", { class: "num" }, count(v.episodes)),
            h("td", null, selects(v.selects ?? [])),
            h("td", null, h("code", { class: "sql" }, v.sql ?? "")),
            h("td", { class: "small" }, v.created_at ? v.created_at.replace("T", " ").replace(/\.\d+Z$/, "Z") : ""),
          ),
        ),
      ),
    ),
  );
}

/** What a view selects: per dataset version (linked to that version's page), its episodes and weight. */
export function selects(list) {
  return h(
    "ul",
    { class: "plain" },
    list.map((s) => {
      const episodes = s.episodes?.length ?? 0;
      return h(
        "li",
        null,
        link(datasetRoute(s.dataset), s.dataset),
        ` · ${count(episodes)} episode${episodes === 1 ? "" : "s"} · weight ${s.weight}`,
        s.removed ? h("span", { class: "badge error", title: JSON.stringify(s.removed) }, "removed") : null,
      );
    }),
  );
}

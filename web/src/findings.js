// Ingest findings: badges counting them by severity, and the list of them.

import { getJson, path } from "./api.js";
import { h, link } from "./dom.js";
import { episodeRoute } from "./route.js";

const SEVERITIES = ["error", "warning", "info"];

/** Severity names, worst first, then any other the server gives. */
function severities(bySeverity) {
  const extra = Object.keys(bySeverity)
    .filter((s) => !SEVERITIES.includes(s))
    .sort();
  return [...SEVERITIES, ...extra].filter((s) => bySeverity[s] > 0);
}

/** Badges with the count of each severity (`none` when there are none). */
export function findingBadges(bySeverity) {
  const present = severities(bySeverity ?? {});
  if (present.length === 0) return h("span", { class: "muted" }, "none");
  return present.map((s) => h("span", { class: `badge ${s}`, title: s }, `${bySeverity[s]} ${s}`));
}

/** The findings of dataset `name` as a table, fetched now. */
export async function findingsList(name, signal) {
  const { findings } = await getJson(`/v1/datasets/${path(name)}/findings`, signal);
  return findingsTable(name, findings);
}

/** `findings` as a table; episodes link to their pages (at the frame when one is named). */
export function findingsTable(name, findings) {
  if (findings.length === 0) return h("p", { class: "muted findings-list" }, "Ingest found nothing to report.");
  const order = (s) => {
    const i = SEVERITIES.indexOf(s);
    return i < 0 ? SEVERITIES.length : i;
  };
  const rows = [...findings].sort((a, b) => order(a.severity) - order(b.severity));
  return h(
    "table",
    { class: "grid findings-list" },
    h(
      "thead",
      null,
      h(
        "tr",
        null,
        ["severity", "kind", "episode", "camera", "frame", "file", "message"].map((c) => h("th", null, c)),
      ),
    ),
    h(
      "tbody",
      null,
      rows.map((f) =>
        h(
          "tr",
          { dataset: { severity: f.severity } },
          h("td", null, h("span", { class: `badge ${f.severity}` }, f.severity)),
          h("td", null, f.kind),
          h(
            "td",
            { class: "num" },
            f.episode_index === null || f.episode_index === undefined
              ? ""
              : link(episodeRoute(name, f.episode_index, f.frame_index ?? undefined), String(f.episode_index)),
          ),
          h("td", null, f.camera ?? ""),
          h("td", { class: "num" }, f.frame_index ?? ""),
          h("td", { class: "path" }, f.file ?? ""),
          h("td", { class: "wrap" }, f.message),
        ),
      ),
    ),
  );
}

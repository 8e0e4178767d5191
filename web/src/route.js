// The address of a page: the route and query in the URL's hash (`#/d/NAME?sort=length`).

/** The hash's route (`/d/NAME`) and its query. */
export function parseHash() {
  const raw = location.hash.replace(/^#/, "") || "/";
  const at = raw.indexOf("?");
  const route = at < 0 ? raw : raw.slice(0, at);
  return { route, query: new URLSearchParams(at < 0 ? "" : raw.slice(at + 1)) };
}

/** Replaces the hash's query (without a history entry or a new render), so a reload comes back to it. */
export function replaceQuery(query) {
  const { route } = parseHash();
  const text = query.toString();
  history.replaceState(null, "", `#${route}${text ? `?${text}` : ""}`);
}

/** The route of a dataset's page. */
export function datasetRoute(name) {
  return `/d/${encodeURIComponent(name)}`;
}

/** The route of an episode's page, at `step` when given. */
export function episodeRoute(name, episode, step) {
  const base = `/d/${encodeURIComponent(name)}/e/${encodeURIComponent(episode)}`;
  return step === undefined ? base : `${base}?step=${step}`;
}

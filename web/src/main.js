// The app: hash routes to pages, the login form a 401 brings up, and errors shown in the page.
//
// Routes: `#/` datasets, `#/d/NAME` one dataset (or view), `#/d/NAME/e/EPISODE?step=S` one
// episode, `#/sql` the SQL console.

import "uplot/dist/uPlot.min.css";
import "./app.css";

import { ApiError, getJson, setToken, token } from "./api.js";
import { PageError, h, message } from "./dom.js";
import { parseHash } from "./route.js";
import { datasetsPage } from "./datasets.js";
import { datasetPage } from "./dataset.js";
import { episodePage } from "./episode.js";
import { sqlPage } from "./sql.js";

const ROUTES = [
  { pattern: /^\/?$/, page: datasetsPage, nav: "datasets" },
  { pattern: /^\/d\/([^/]+)$/, page: datasetPage, nav: "datasets" },
  { pattern: /^\/d\/([^/]+)\/e\/([^/]+)$/, page: episodePage, nav: "datasets" },
  { pattern: /^\/sql$/, page: sqlPage, nav: "sql" },
];

/** The page shown now: its abort controller and what to run when it is left. */
let shown = null;

function leave() {
  if (!shown) return;
  shown.controller.abort();
  for (const fn of shown.cleanups) fn();
  shown = null;
}

function render() {
  leave();
  const main = document.getElementById("main");
  main.replaceChildren();
  updateHeader();
  const { route, query } = parseHash();
  const match = ROUTES.map((r) => ({ r, m: r.pattern.exec(route) })).find((x) => x.m);
  for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", match?.r.nav === a.dataset.nav);
  if (!match) {
    main.append(message("error", `There is no page at #${route}.`, "page-error"), h("p", null, h("a", { href: "#/" }, "All datasets")));
    return;
  }
  const controller = new AbortController();
  const page = { controller, cleanups: [] };
  shown = page;
  let params;
  try {
    params = match.m.slice(1).map(decodeURIComponent);
  } catch {
    main.append(message("error", `The address #${route} is not valid.`, "page-error"));
    return;
  }
  const ctx = {
    main,
    params,
    query,
    signal: controller.signal,
    onLeave: (fn) => page.cleanups.push(fn),
    /** Shows `error` in `where` (the whole page when not given); a 401 brings up the login. */
    fail: (error, where) => fail(page, error, where),
  };
  Promise.resolve()
    .then(() => match.r.page(ctx))
    .catch((e) => fail(page, e));
}

function fail(page, error, where) {
  if (shown !== page || error?.name === "AbortError") return;
  if (error instanceof ApiError && error.status === 401) {
    showLogin(error);
    return;
  }
  const explained = error instanceof ApiError || error instanceof PageError;
  if (!explained) console.error(error);
  const text = explained ? error.message : `Something went wrong: ${error?.message ?? error}`;
  const box = message("error", text, where ? null : "page-error");
  if (where) {
    where.replaceChildren(box);
  } else {
    document.getElementById("main").replaceChildren(box, h("p", null, h("a", { href: "#/" }, "All datasets")));
  }
}

function showLogin(refusal) {
  leave();
  const main = document.getElementById("main");
  const input = h("input", { id: "login-token", type: "password", autocomplete: "off", spellcheck: "false", required: true });
  const error = h("div", { id: "login-error", role: "alert" });
  if (token()) {
    error.append(message("error", `The server refused the token this tab holds: ${refusal.message}`));
    setToken(null);
  }
  const button = h("button", { id: "login-submit", type: "submit" }, "Log in");
  const form = h(
    "form",
    {
      id: "login",
      class: "login",
      onsubmit: async (e) => {
        e.preventDefault();
        const value = input.value.trim();
        if (!value) return;
        button.disabled = true;
        error.replaceChildren();
        setToken(value);
        try {
          await getJson("/v1/datasets");
          render();
        } catch (err) {
          setToken(null);
          const why = err instanceof ApiError && err.status === 401 ? `The server refused this token: ${err.message}` : err.message;
          error.replaceChildren(message("error", why, "login-refused"));
          input.select();
        } finally {
          button.disabled = false;
        }
      },
    },
    h("h1", null, "Log in"),
    h(
      "p",
      null,
      "This lake server needs a bearer token (one of those given to ",
      h("code", null, "lake serve --tokens"),
      " or ",
      h("code", null, "--token-file"),
      "). It is kept in this tab only.",
    ),
    h("label", { for: "login-token" }, "Token"),
    h("div", { class: "row" }, input, button),
    error,
  );
  main.replaceChildren(form);
  updateHeader();
  input.focus();
}

function updateHeader() {
  const out = document.getElementById("logout");
  if (out) out.hidden = !token();
}

function header() {
  return h(
    "header",
    { id: "top" },
    h("a", { class: "brand", href: "#/" }, "lake"),
    h(
      "nav",
      { id: "nav" },
      h("a", { href: "#/", dataset: { nav: "datasets" } }, "Datasets"),
      h("a", { href: "#/sql", dataset: { nav: "sql" } }, "SQL"),
    ),
    h(
      "button",
      {
        id: "logout",
        type: "button",
        class: "link",
        hidden: true,
        onclick: () => {
          setToken(null);
          render();
        },
      },
      "Log out",
    ),
  );
}

function start() {
  document.body.replaceChildren(header(), h("main", { id: "main" }));
  window.addEventListener("hashchange", render);
  render();
}

start();

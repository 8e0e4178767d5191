// Calls to lake's HTTP API: every request carries the tab's bearer token, and an error answer
// becomes an ApiError holding the server's `error` text.

const TOKEN_KEY = "lake.token";

/** An answer other than 2xx: `status`, the server's `error` text as message, and its JSON body. */
export class ApiError extends Error {
  constructor(status, message, body) {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.body = body;
  }
}

/** The token this tab logged in with (sessionStorage: one per tab, gone when it closes). */
export function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

export function setToken(value) {
  if (value) sessionStorage.setItem(TOKEN_KEY, value);
  else sessionStorage.removeItem(TOKEN_KEY);
}

/** Path segments joined into a URL path, each one escaped. */
export function path(...segments) {
  return segments.map((s) => encodeURIComponent(String(s))).join("/");
}

/**
 * A request to the API. `options` are fetch's (method, body, signal, headers); the answer is
 * returned when its status is 2xx, else an ApiError is thrown (status 0 when the server could
 * not be reached).
 */
export async function request(url, options = {}) {
  const headers = new Headers(options.headers);
  const t = token();
  if (t) headers.set("Authorization", `Bearer ${t}`);
  let res;
  try {
    res = await fetch(url, { ...options, headers });
  } catch (e) {
    if (e.name === "AbortError") throw e;
    throw new ApiError(0, `the server could not be reached (${e.message})`, null);
  }
  if (res.ok) return res;
  const text = await res.text();
  let body = null;
  try {
    body = JSON.parse(text);
  } catch {
    body = null;
  }
  const said = body && typeof body.error === "string" ? body.error : text.trim() || res.statusText;
  throw new ApiError(res.status, said || `HTTP ${res.status}`, body);
}

/** GET `url` as JSON. */
export async function getJson(url, signal) {
  const res = await request(url, { signal, headers: { Accept: "application/json" } });
  return res.json();
}

/** POST `body` (JSON-encoded unless a string) to `url`, answer as JSON. */
export async function postJson(url, body, signal) {
  const text = typeof body === "string" ? body : JSON.stringify(body);
  const type = typeof body === "string" ? "text/plain; charset=utf-8" : "application/json";
  const res = await request(url, { method: "POST", body: text, signal, headers: { Accept: "application/json", "Content-Type": type } });
  return res.json();
}

// Bundles the web app into OUT_DIR (argument): index.html, app.js (src/main.js and uPlot, one
// minified script) and app.css (uPlot's CSS, then the app's). The output depends on the sources
// and the pinned packages only: no timestamps, hashes or source maps.

import { copyFile, mkdir, readdir } from "node:fs/promises";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

import * as esbuild from "esbuild";

const here = fileURLToPath(new URL(".", import.meta.url));
const out = process.argv[2];
if (!out) {
  console.error("usage: node build.mjs OUT_DIR");
  process.exit(2);
}
await mkdir(out, { recursive: true });
await esbuild.build({
  absWorkingDir: here,
  entryPoints: { app: "src/main.js" },
  outdir: out,
  bundle: true,
  minify: true,
  format: "iife",
  target: ["chrome116", "firefox124", "safari17.4"],
  charset: "ascii",
  legalComments: "eof",
  sourcemap: false,
  logLevel: "warning",
});
await copyFile(join(here, "index.html"), join(out, "index.html"));
const made = (await readdir(out)).sort();
const expected = ["app.css", "app.js", "index.html"];
if (made.join() !== expected.join()) {
  console.error(`build.mjs: ${out} holds ${made.join(", ")}, expected ${expected.join(", ")}`);
  process.exit(1);
}

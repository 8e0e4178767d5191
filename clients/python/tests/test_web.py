"""The web app `lake serve --http` serves at `/`, driven in a real browser.

The tests ingest the bundled samples testdata/lerobot/v30-av1-small (two AV1 cameras) and
v30-images-tiny (PNG images) into a temporary lake with the lake binary at `$LAKE_BIN` (default:
the debug build, `${CARGO_TARGET_DIR:-~/.cache/lake/target}/debug/lake`), start `lake serve` on free
loopback ports with a bearer token, and drive Debian's headless Chromium through chromedriver
(`/usr/bin/chromium` and `/usr/bin/chromedriver`, or `$LAKE_CHROMIUM` and `$LAKE_CHROMEDRIVER`;
the driver is given by path, so Selenium never fetches one). They check that:

- the app asks for the token: a wrong one is refused in the login form, the right one opens the
  datasets page; and the API answers a request without a token, or with a wrong one, with 401;
- the datasets page lists every dataset with the episodes and steps `lake sql` counts, and a view;
  a copy of v30-images-tiny whose info.json overstates `total_frames` shows its ingest warning,
  and a click on it lists the finding;
- a dataset's page pages, sorts and filters its episodes on the server as `lake sql` would (longest
  first; a minimum length), and charts the statistics of `observation.state` with its x axis
  labelled by info.json's dimension names (the figure's `data-names`, the labels the app gives
  the axis);
- an episode's page draws each camera's frame at the step its URL names, and the pixels read back
  from the canvas (`getImageData`) equal the frame `lake sample --indices INDEX` decodes for that
  step, exactly. The server sends the frame as a PNG without a colour profile; the app decodes it
  with `createImageBitmap(…, {colorSpaceConversion: "none"})` onto a 2D canvas in sRGB, and
  Chromium runs with `--force-color-profile=srgb`, so no colour conversion happens anywhere
  between the loader's RGB bytes and the canvas: any difference is an error, not a rounding; so do
  the frames two steps on and one back (ArrowRight twice, ArrowLeft), which come from the middle of
  the steps one `/frames` request fetched;
- the plots' step line follows the step: ArrowRight, Home and End, the step slider and a click on
  a plot each set the episode's `data-step` and put the line (`.step-cursor`) at that step's
  position along the plot's x axis (to half a pixel); Space plays and pauses;
- the SQL console runs a query (Ctrl+Enter) and shows `lake sql`'s rows, says when an answer had
  more than the 10 000 rows it keeps, shows a syntax error with a caret at its line and column,
  and saves a query as a view; a `--read-only` server's console says views are made elsewhere
  and offers no button that could only be refused;
- a dataset, episode or step that does not exist shows the server's (or the app's) message in the
  page rather than an empty one; and no page logs a JavaScript error.

Each page's screenshot (datasets, dataset, episode, SQL) is written to `$LAKE_SCREENSHOTS`, else to
`${CARGO_TARGET_DIR:-~/.cache/lake/target}/web-screenshots/`; with `LAKE_UPDATE_DOCS=1` to the repo's
docs/guide/web/. selenium is scripts/python-env.sh's (pinned there); without it, Chromium,
chromedriver or the lake binary the tests fail saying so. Run:
`"$(scripts/python-env.sh)" clients/python/tests/test_web.py`.
"""

import base64
import json
import os
import shutil
import tempfile
import time
import unittest
import urllib.error
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SAMPLES = ["v30-av1-small", "v30-images-tiny"]
NAME = "v30-av1-small"
FLAWED = "with-findings"
TOKEN = "web-test-token"
CHROMIUM = os.environ.get("LAKE_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("LAKE_CHROMEDRIVER", "/usr/bin/chromedriver")
WAIT = 30

try:
    import numpy as np
    import pyarrow.ipc as ipc
    from selenium import webdriver
    from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select, WebDriverWait
except ImportError as e:
    raise SystemExit(f"test_web: {e}: run it with scripts/python-env.sh's python, which has selenium, pyarrow and numpy")

from lake_binary import Server, lake as lake_at, lake_sql as sql_at, missing, target_dir


def _screenshot_dir():
    if os.environ.get("LAKE_UPDATE_DOCS") == "1":
        return os.path.join(REPO, "docs", "guide", "web")
    return os.environ.get("LAKE_SCREENSHOTS") or os.path.join(target_dir(), "web-screenshots")


SCREENSHOTS = _screenshot_dir()

# The lake, server and browser every test uses: set by setUpModule.
LAKE = {}


def lake(*args):
    return lake_at(LAKE["root"], *args)


def lake_sql(query):
    return sql_at(LAKE["root"], query)


def start_browser():
    for path, what in ((CHROMIUM, "Chromium"), (CHROMEDRIVER, "chromedriver")):
        if not os.access(path, os.X_OK):
            raise RuntimeError(f"no {what} at {path} (apt install chromium chromium-driver, or set LAKE_CHROMIUM / LAKE_CHROMEDRIVER)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--force-color-profile=srgb",
        "--window-size=1280,1000",
        f"--user-data-dir={os.path.join(LAKE['tmp'], 'chromium')}",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path=CHROMEDRIVER, log_output=os.path.join(LAKE["tmp"], "chromedriver.log"))
    return webdriver.Chrome(service=service, options=options)


def setUpModule():
    if missing():
        raise RuntimeError(missing())
    tmp = tempfile.mkdtemp(prefix="lake-web-test-")
    LAKE.update(tmp=tmp, root=os.path.join(tmp, "lake"))
    try:
        make_lake()
        LAKE["server"] = Server(LAKE["root"], os.path.join(tmp, "serve.log"), "--tokens", TOKEN)
        LAKE["url"] = LAKE["server"].http
        LAKE["browser"] = start_browser()
        os.makedirs(SCREENSHOTS, exist_ok=True)
    except BaseException:
        # unittest skips tearDownModule when setUpModule fails.
        tearDownModule()
        raise


def make_lake():
    for sample in SAMPLES:
        lake("ingest", os.path.join(REPO, "testdata", "lerobot", sample))
    # A copy whose info.json overstates total_frames: ingest records a warning for it.
    flawed = os.path.join(LAKE["tmp"], FLAWED)
    shutil.copytree(os.path.join(REPO, "testdata", "lerobot", "v30-images-tiny"), flawed)
    info_path = os.path.join(flawed, "meta", "info.json")
    with open(info_path) as f:
        info = json.load(f)
    info["total_frames"] += 1
    with open(info_path, "w") as f:
        json.dump(info, f, indent=4)
    lake("ingest", flawed)
    lake("view", "create", "long-episodes", f"SELECT dataset, episode_index FROM episodes WHERE dataset = '{NAME}' AND length > 100")


def tearDownModule():
    if "browser" in LAKE:
        LAKE["browser"].quit()
    if "server" in LAKE:
        LAKE["server"].stop()
    if "tmp" in LAKE:
        shutil.rmtree(LAKE["tmp"], ignore_errors=True)


def api_status(path, token=None):
    request = urllib.request.Request(LAKE["url"] + path)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


class WebApp(unittest.TestCase):
    def setUp(self):
        self.browser = LAKE["browser"]
        self.browser.get_log("browser")

    def tearDown(self):
        # Failed requests (the 401s, 404s and 400s tests ask for) are logged too; a script error is not expected.
        errors = [e["message"] for e in self.browser.get_log("browser") if e["level"] == "SEVERE" and "Failed to load resource" not in e["message"]]
        self.assertEqual(errors, [], "the page logged errors")

    # Helpers

    def wait(self, condition, what, timeout=WAIT):
        # A condition that reads an element the page replaces meanwhile (a table re-rendered) is asked again.
        try:
            return WebDriverWait(self.browser, timeout, poll_frequency=0.05, ignored_exceptions=[StaleElementReferenceException]).until(
                lambda _: condition()
            )
        except TimeoutException:
            self.fail(f"waited {timeout} s for {what}; the page says: {self.browser.find_element(By.ID, 'main').text[:2000]}")

    def js(self, script, *args):
        return self.browser.execute_script(script, *args)

    def find(self, css):
        return self.browser.find_elements(By.CSS_SELECTOR, css)

    def element(self, css, what=None):
        return self.wait(lambda: (self.find(css) or [None])[0], what or css)

    def login(self, token):
        box = self.element("#login-token", "the login form")
        box.clear()
        box.send_keys(token)
        self.browser.find_element(By.ID, "login-submit").click()

    def open(self, route):
        """Opens `route` (`#/…`), logging in with the token when the app asks for it."""
        self.browser.get(f"{LAKE['url']}/{route}")
        self.wait(lambda: self.find("#main > *"), f"{route} to show something")
        if self.find("#login-token"):
            self.login(TOKEN)
            self.wait(lambda: not self.find("#login-token"), "the login to be accepted")

    def screenshot(self, name):
        """The whole page (beyond the window) as SCREENSHOTS/NAME.png."""
        metrics = self.browser.execute_cdp_cmd("Page.getLayoutMetrics", {})
        size = metrics["cssContentSize"]
        shot = self.browser.execute_cdp_cmd(
            "Page.captureScreenshot",
            {"format": "png", "captureBeyondViewport": True, "clip": {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}},
        )
        with open(os.path.join(SCREENSHOTS, f"{name}.png"), "wb") as f:
            f.write(base64.b64decode(shot["data"]))

    def step(self):
        return int(self.element("#episode").get_attribute("data-step"))

    def canvas_pixels(self, camera):
        """The RGB pixels of `camera`'s canvas, read back with getImageData, as H×W×3."""
        width, height, data = self.js(
            """
            const c = document.querySelector(`canvas.frame[data-camera="${arguments[0]}"]`);
            const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
            let s = "";
            for (let i = 0; i < d.length; i += 0x8000) s += String.fromCharCode.apply(null, d.subarray(i, i + 0x8000));
            return [c.width, c.height, btoa(s)];
            """,
            camera,
        )
        rgba = np.frombuffer(base64.b64decode(data), dtype=np.uint8).reshape(height, width, 4)
        self.assertTrue((rgba[:, :, 3] == 255).all(), f"{camera}: the frame is opaque")
        return rgba[:, :, :3]

    def sample_frames(self, dataset, index):
        """Every camera's frame of LeRobot `index` as `lake sample` writes it: {camera: H×W×3 uint8}."""
        out = os.path.join(LAKE["tmp"], f"sample-{dataset}-{index}.arrow")
        lake("sample", dataset, "--indices", str(index), "--out", out)
        table = ipc.open_file(out).read_all()
        frames = {}
        for field in table.schema:
            meta = {k.decode(): v.decode() for k, v in (field.metadata or {}).items()}
            if meta.get("layout") == "HWC":
                shape = json.loads(meta["shape"])
                frames[field.name] = table.column(field.name)[0].values.to_numpy().reshape(shape)
        self.assertTrue(frames, f"lake sample wrote no camera column for {dataset}")
        return frames

    def cursor(self, feature):
        """The step line of `feature`'s plot: its data-step, its left (CSS px) and the plot area's width."""
        return self.js(
            """
            const fig = document.querySelector(`figure.feature-plot[data-feature="${arguments[0]}"]`);
            const line = fig.querySelector(".step-cursor");
            const over = fig.querySelector(".u-over");
            return [Number(line.dataset.step), parseFloat(line.style.left), over.getBoundingClientRect().width];
            """,
            feature,
        )

    def assert_cursor_at(self, step, length):
        self.wait(lambda: self.step() == step, f"the episode to be at step {step}")
        for feature in ("observation.state", "action"):
            at, left, width = self.cursor(feature)
            self.assertEqual(at, step, f"{feature}: the step line's step")
            self.assertAlmostEqual(left, step / (length - 1) * width, delta=0.5, msg=f"{feature}: the step line's position at step {step}")

    # Tests

    def test_a_wrong_token_is_refused(self):
        self.assertEqual(api_status("/v1/datasets")[0], 401, "the API without a token")
        self.assertEqual(api_status("/v1/datasets", "not-the-token")[0], 401, "the API with a wrong token")
        self.assertEqual(api_status(f"/v1/datasets/{NAME}/frame?camera=observation.images.front&index=0")[0], 401, "a frame without a token")
        self.assertEqual(api_status("/v1/datasets", TOKEN)[0], 200, "the API with the token")
        self.browser.get(f"{LAKE['url']}/#/")
        self.js("sessionStorage.clear()")
        self.browser.refresh()
        self.login("not-the-token")
        refusal = self.element("#login-refused", "the refusal")
        self.assertIn("refused", refusal.text)
        self.assertFalse(self.find("#datasets"), "no datasets shown after a wrong token")
        self.login(TOKEN)
        self.element("#datasets", "the datasets page after the right token")

    def test_datasets_page(self):
        self.open("#/")
        table = self.element("#datasets")
        rows = {r.get_attribute("data-name"): r for r in table.find_elements(By.CSS_SELECTOR, "tbody tr")}
        self.assertEqual(sorted(rows), sorted(SAMPLES + [FLAWED]))
        counts = lake_sql("SELECT dataset, count(*) AS episodes, sum(length) AS steps FROM episodes GROUP BY dataset")
        for c in counts:
            cells = [td.text for td in rows[c["dataset"]].find_elements(By.TAG_NAME, "td")]
            self.assertEqual(cells[3].replace(",", ""), str(c["episodes"]), f"{c['dataset']}: episodes")
            self.assertEqual(cells[4].replace(",", ""), str(c["steps"]), f"{c['dataset']}: steps")
        self.assertIn("av1", rows[NAME].text, "the cameras' codec")
        self.assertIn("640×480", rows[NAME].text, "a camera's size")
        self.assertIn("1 warning", rows[FLAWED].text)
        rows[FLAWED].find_element(By.CSS_SELECTOR, ".findings-open").click()
        findings = self.element("#findings-panel .findings-list", "the findings list")
        self.assertIn("totals-mismatch", findings.text)
        self.assertIn("total_frames", findings.text)
        views = self.element("#views")
        self.assertIn("long-episodes", views.text)
        self.screenshot("datasets")

    def test_dataset_page(self):
        self.open(f"#/d/{NAME}")
        episodes = lake_sql(f'SELECT episode_index, length FROM "{NAME}".episodes ORDER BY length DESC, episode_index')
        total = self.element("#episodes-total")
        self.wait(lambda: total.get_attribute("data-total") == str(len(episodes)), "the episodes' total")
        self.browser.find_element(By.CSS_SELECTOR, '#episodes th[data-sort="length"]').click()
        first = lambda: int(self.element("#episodes tbody tr").get_attribute("data-episode"))  # noqa: E731
        self.wait(lambda: first() == episodes[0]["episode_index"], "the longest episode first after sorting by length")
        minimum = episodes[2]["length"]
        self.browser.find_element(By.ID, "filter-min").send_keys(str(minimum))
        longer = [e for e in episodes if e["length"] >= minimum]
        self.wait(lambda: total.get_attribute("data-total") == str(len(longer)), f"the total of episodes at least {minimum} long")
        shown = [int(r.get_attribute("data-episode")) for r in self.find("#episodes tbody tr")]
        self.assertEqual(shown, [e["episode_index"] for e in longer], "the filtered episodes, longest first")
        self.assertIn("sort=length", self.browser.current_url, "the table's state is in the URL")
        plot = self.element('figure.feature-stats[data-feature="observation.state"]')
        with open(os.path.join(REPO, "testdata", "lerobot", NAME, "meta", "info.json")) as f:
            info = json.load(f)
        self.element('figure.feature-stats[data-feature="observation.state"] .u-over', "the statistics chart")
        labels = json.loads(plot.get_attribute("data-names"))
        self.assertEqual(labels, info["features"]["observation.state"]["names"], "the dimensions are labelled with info.json's names")
        self.element("#findings .findings-list", "the findings list")
        self.browser.find_element(By.ID, "filter-min").send_keys(Keys.CONTROL, "a", Keys.BACKSPACE)
        self.wait(lambda: total.get_attribute("data-total") == str(len(episodes)), "every episode again")
        self.browser.find_element(By.ID, "filter-findings").click()
        self.wait(lambda: total.get_attribute("data-total") == "0", "no episode with findings")
        self.browser.find_element(By.ID, "filter-findings").click()
        self.wait(lambda: total.get_attribute("data-total") == str(len(episodes)), "every episode again")
        self.screenshot("dataset")

    def test_episode_frames_equal_the_samples(self):
        episode, step = 2, 10
        for dataset in SAMPLES:
            with self.subTest(dataset=dataset):
                [row] = lake_sql(f'SELECT dataset_from_index AS first FROM "{dataset}".episodes WHERE episode_index = {episode}')
                index = row["first"] + step
                self.open(f"#/d/{dataset}/e/{episode}?step={step}")
                self.wait(lambda: self.step() == step, f"step {step}")
                self.assert_frames_are_the_samples(dataset, index)
                # Two steps on: frames from the middle of the steps one request fetched.
                body = self.browser.find_element(By.TAG_NAME, "body")
                body.send_keys(Keys.ARROW_RIGHT)
                body.send_keys(Keys.ARROW_RIGHT)
                self.wait(lambda: self.step() == step + 2, f"step {step + 2}")
                self.assert_frames_are_the_samples(dataset, index + 2)
                body.send_keys(Keys.ARROW_LEFT)
                self.wait(lambda: self.step() == step + 1, f"step {step + 1}")
                self.assert_frames_are_the_samples(dataset, index + 1)
                # The command shown is the one run above, for this dataset and step.
                self.assertIn(f"lake sample {dataset} --indices {index + 1} --out sample.arrow", self.element("#sample-command").text)
                if dataset == NAME:
                    self.screenshot("episode")

    def assert_frames_are_the_samples(self, dataset, index):
        """Every camera's canvas shows the frame `lake sample` gives at `index`, byte for byte."""
        want = self.sample_frames(dataset, index)
        for camera, frame in want.items():
            canvas = f'canvas.frame[data-camera="{camera}"]'
            self.wait(lambda: self.element(canvas).get_attribute("data-index") == str(index), f"{camera}'s frame at index {index}")
            got = self.canvas_pixels(camera)
            self.assertEqual(got.shape, frame.shape, f"{dataset} {camera}: frame size")
            differ = np.argwhere(got != frame)
            self.assertEqual(len(differ), 0, f"{dataset} {camera} at index {index}: {len(differ)} values differ from lake sample's, first at {differ[:3].tolist()}")

    def test_plot_cursor_follows_the_step(self):
        episode = 2
        [row] = lake_sql(f'SELECT length FROM "{NAME}".episodes WHERE episode_index = {episode}')
        length = row["length"]
        self.open(f"#/d/{NAME}/e/{episode}?step=5")
        self.element('figure.feature-plot[data-feature="action"] .step-cursor', "the action plot")
        self.assert_cursor_at(5, length)
        body = self.browser.find_element(By.TAG_NAME, "body")
        body.send_keys(Keys.ARROW_RIGHT)
        self.assert_cursor_at(6, length)
        body.send_keys(Keys.END)
        self.assert_cursor_at(length - 1, length)
        body.send_keys(Keys.HOME)
        self.assert_cursor_at(0, length)
        self.js('const s = document.getElementById("step-slider"); s.value = arguments[0]; s.dispatchEvent(new Event("input"));', 40)
        self.assert_cursor_at(40, length)
        target = length // 3
        over = self.element('figure.feature-plot[data-feature="observation.state"] .u-over')
        width = over.rect["width"]
        offset = round(target / (length - 1) * width - width / 2)
        ActionChains(self.browser).move_to_element_with_offset(over, offset, 0).click().perform()
        self.assert_cursor_at(target, length)
        self.wait(lambda: f"step={target}" in self.browser.current_url, "the step in the URL")
        body.send_keys(Keys.SPACE)
        self.wait(lambda: self.element("#episode").get_attribute("data-playing") == "true", "playing")
        self.wait(lambda: self.step() >= target + 5, "the steps to advance while playing")
        body.send_keys(Keys.SPACE)
        self.wait(lambda: self.element("#episode").get_attribute("data-playing") == "false", "paused")
        at = self.step()
        time.sleep(0.3)
        self.assertEqual(self.step(), at, "paused, the step stays")
        self.assert_cursor_at(at, length)

    def run_query(self, query):
        box = self.element("#sql-query")
        box.clear()
        box.send_keys(query)
        before = self.js("return document.getElementById('sql-results').innerHTML + document.getElementById('sql-error-area').innerHTML")
        box.send_keys(Keys.CONTROL, Keys.ENTER)
        self.wait(
            lambda: not self.find("#sql-run[disabled]")
            and self.js("return document.getElementById('sql-results').innerHTML + document.getElementById('sql-error-area').innerHTML") != before,
            f"the answer to {query}",
        )

    def table_rows(self):
        head = [th.text for th in self.find("#sql-table thead th")]
        return head, [[td.text for td in tr.find_elements(By.TAG_NAME, "td")] for tr in self.find("#sql-table tbody tr")]

    def test_sql_console(self):
        self.open("#/sql")
        query = "SELECT dataset, count(*) AS episodes, sum(length) AS steps FROM episodes GROUP BY dataset ORDER BY dataset"
        self.run_query(query)
        head, rows = self.table_rows()
        want = lake_sql(query)
        self.assertEqual(head, ["dataset", "episodes", "steps"])
        self.assertEqual(rows, [[r["dataset"], str(r["episodes"]), str(r["steps"])] for r in want])
        self.assertIn(query, self.element("#sql-history").text, "the query is in the history")

        query = f'SELECT frame_index, "observation.state"[1] AS state_pan, action[1] AS action_pan FROM "{NAME}".steps WHERE episode_index = 2 ORDER BY frame_index'
        self.run_query(query)
        steps = lake_sql(f'SELECT count(*) AS n FROM "{NAME}".steps WHERE episode_index = 2')[0]["n"]
        self.assertGreater(steps, 100, "the episode fills more than one page")
        self.assertEqual(self.element("#sql-table").get_attribute("data-rows"), str(steps))
        _, rows = self.table_rows()
        self.assertEqual([r[0] for r in rows], [str(i) for i in range(100)], "the first page")
        self.browser.find_element(By.ID, "sql-next").click()
        _, rows = self.table_rows()
        self.assertEqual([r[0] for r in rows], [str(i) for i in range(100, steps)], "the second page")
        Select(self.element("#chart-mode")).select_by_value("line")
        self.element("#sql-chart .u-over", "the chart")
        self.screenshot("sql")

        self.run_query("SELECT value FROM generate_series(1, 10005)")
        self.element("#sql-more", "the note that the answer had more rows")
        self.assertEqual(self.element("#sql-table").get_attribute("data-rows"), "10000")
        _, rows = self.table_rows()
        self.assertEqual(rows[0], ["1"])

        self.run_query("SELECT dataset,\n  count(* FROM episodes")
        error = self.element("#sql-error", "the error")
        self.assertIn("Line: 2", error.text)
        caret = self.element("#sql-error-position")
        line, column = int(caret.get_attribute("data-line")), int(caret.get_attribute("data-column"))
        self.assertEqual(line, 2)
        text, marks = caret.text.split("\n")
        self.assertEqual(text, "  count(* FROM episodes")
        self.assertEqual(marks, " " * (column - 1) + "^", "the caret under the error's column")

        self.element("#sql-query").clear()
        self.element("#sql-query").send_keys(f"SELECT dataset, episode_index FROM episodes WHERE dataset = '{NAME}' AND length < 100")
        self.element("#view-name").send_keys("short-episodes")
        self.browser.find_element(By.ID, "view-save").click()
        saved = self.element("#view-saved, #view-error", "the view to be saved")
        self.assertEqual(saved.get_attribute("id"), "view-saved", saved.text)
        short = lake_sql(f"SELECT count(*) AS n FROM \"{NAME}\".episodes WHERE length < 100")[0]["n"]
        self.assertIn(f"{short} episodes", saved.text)
        self.browser.find_element(By.ID, "view-save").click()
        refused = self.element("#view-error", "the refusal of a view that exists")
        self.assertIn("short-episodes", refused.text)

    def test_a_read_only_server_offers_no_view_saving(self):
        server = Server(LAKE["root"], os.path.join(LAKE["tmp"], "serve-read-only.log"), "--tokens", TOKEN, "--read-only")
        try:
            self.browser.get(f"{server.http}/#/sql")
            self.wait(lambda: self.find("#main > *"), "the SQL page to show something")
            if self.find("#login-token"):
                self.login(TOKEN)
            note = self.element("#view-read-only", "the note that views are not made here")
            self.assertIn("lake view create", note.text)
            self.assertFalse(self.find("#view-save"), "no button that can only be refused")
            self.run_query("SELECT count(*) AS n FROM episodes")
            self.assertEqual(self.table_rows()[0], ["n"], "queries run as on any server")
        finally:
            server.stop()

    def test_bad_addresses_say_what_is_wrong(self):
        for route, words in (
            ("#/d/no-such-dataset", "no-such-dataset"),
            (f"#/d/{NAME}/e/999", "999"),
            (f"#/d/{NAME}/e/0?step=5000", "no step 5000"),
            ("#/nowhere", "no page"),
        ):
            with self.subTest(route=route):
                self.open(route)
                error = self.element("#page-error", f"the error of {route}")
                self.assertIn(words, error.text)


if __name__ == "__main__":
    unittest.main()

#!/usr/bin/env python3
"""Sends `lake serve` a few hundred malformed, oversized and hostile requests over HTTP and Flight
and reports, per route, how many were answered, refused (4xx), turned away for load or resources
(503, 507), or failed otherwise, and whether the server died. After each request the server must
answer /healthz. Exits 1 when the server dies, answers 500 or cuts an answer off, the failures
that must stay 0.

Usage: scripts/attack_probe.py LAKE_BINARY [--keep]

It ingests the bundled samples into a temporary lake and serves it on free loopback ports with a
token. Flight needs pyarrow (scripts/python-env.sh); without it only HTTP is probed. --keep leaves
the lake and the server's log behind."""
import argparse, http.client, json, os, shutil, socket, subprocess, sys, tempfile, time, urllib.error, urllib.parse, urllib.request
from collections import Counter, defaultdict
from pathlib import Path

TOKEN = "attack-probe-token"
REPO = Path(__file__).resolve().parent.parent
D = "v30-av1-small"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_cases():
    q = urllib.parse.quote
    cases = []
    for name in [D, D + "@1", D + "@0", D + "@99999999999999999999", D + "@", "@1", "x" * 5000, "..%2F..%2Fetc", "%00", f"{D}@1@2", q("😀")]:
        for sub in ["", "/episodes", "/episodes/0", "/episodes/-1", "/episodes/99999999999999999999", "/findings",
                    "/frame?camera=observation.images.front&index=0", "/frames?camera=observation.images.front&index=0&count=64"]:
            cases.append(("GET", f"/v1/datasets/{name}{sub}", None))
    for params in ["index=-1", "index=600", "index=9223372036854775807", "index=-9223372036854775808", "index=599&count=64",
                   "index=0&count=0", "index=0&count=65", "index=0&count=18446744073709551615", "index=abc", "", "index=0&camera=x&camera=y"]:
        for route in ["frames", "frame"]:
            cases.append(("GET", f"/v1/datasets/{D}/{route}?camera=observation.images.front&{params}", None))
    for params in ["offset=18446744073709551615", "limit=0", "limit=1001", "min_length=-9223372036854775808", "task=" + "a" * 100_000,
                   "with_findings=maybe", "sort=" + q("'; DROP TABLE"), "unknown=1"]:
        cases.append(("GET", f"/v1/datasets/{D}/episodes?{params}", None))
    base = {"datasets": [D], "preset": "act", "batch_size": 2, "limit_batches": 1}
    for v in [{}, {"batch_size": 0}, {"batch_size": 10**12}, {"batch_size": 1e300}, {"limit_batches": 10**19}, {"epoch": 2**64 - 1},
              {"start_step": 2**64 - 1}, {"step_stride": 2**64 - 1}, {"rank": 5, "world_size": 2}, {"world_size": 2**64 - 1},
              {"preset": "none", "delta_timestamps": {"action": [1e308]}}, {"preset": "none", "delta_timestamps": {"action": list(range(100_000))}},
              {"preset": "none", "batch_size": 64, "delta_timestamps": {"observation.images.front": [x / 30 for x in range(-500, 500)]}},
              {"datasets": []}, {"datasets": [D] * 10_000}, {"datasets": ["../x"]}, {"frame_format": "packets"}, {"frame_format": "bogus"},
              {"episodes": [10**18]}, {"episodes": list(range(100_000))}, {"drop_n_first_frames": 10**9}, {"preset": "x"}]:
        body = json.dumps({**base, **v})
        cases += [("POST", "/v1/sample", body), ("POST", "/v1/facts", body)]
    for body in ["", "null", "[]", "{", '"x"', "{}", '{"datasets":' + "[" * 100_000 + "]" * 100_000 + "}", '{"a":' * 5000 + "1" + "}" * 5000,
                 json.dumps({"datasets": [D], "x" * 1000: 1})]:
        cases += [("POST", route, body) for route in ["/v1/sample", "/v1/facts", "/v1/views"]]
    union = " UNION ALL ".join(["SELECT dataset, episode_index FROM episodes WHERE dataset = 'v30-av1-small'"] * 300)
    for name, query in [("probe-deep", union), ("../v", "SELECT 1"), ("probe-none", "SELECT 1"), (D, "SELECT dataset, episode_index FROM episodes"),
                        ("probe-endless", "SELECT 'v30-av1-small' AS dataset, value AS episode_index FROM generate_series(0, 4000000000)"),
                        ("probe-two", "SELECT dataset, episode_index FROM episodes; DROP TABLE episodes"), ("x" * 300, "SELECT 1")]:
        cases.append(("POST", "/v1/views", json.dumps({"name": name, "sql": query, "replace": True})))
    for query in ["SELECT 1" + "+1" * 500, "SELECT repeat('x', 2147483647)", "SELECT lpad('x', 2000000000)",
                  "SELECT length(string_agg(repeat('x', 1000000), ',')) FROM generate_series(1, 100000)", "SELECT array_repeat(1, 1000000000)",
                  "SELECT make_array(" + ",".join(["1"] * 50_000) + ")", "SELECT 1/0", "COPY steps TO '/tmp/x.csv'",
                  "SELECT * FROM read_parquet('/etc/passwd')", "CREATE EXTERNAL TABLE t STORED AS CSV LOCATION '/etc/passwd'",
                  "SELECT * FROM \"../../etc\".steps", "SELECT generate_series(1, 9223372036854775807)", "SELECT array_resize([1], 2000000000, 0)",
                  "SELECT count(*) FROM steps s1, steps s2, steps s3"]:
        cases.append(("POST", "/v1/sql", query))
    # Values at the edges of their types, which DataFusion's planner, constant folding and
    # functions have panicked on, patterns that are no regular expressions, recursion and
    # dictionaries in answers.
    i64_min, i64_max = "-9223372036854775808", "9223372036854775807"
    ns_stamp = lambda v: f"arrow_cast({v}, 'Timestamp(Nanosecond, None)')"
    for query in [f"SELECT * FROM (VALUES (1)) AS t(x) WHERE x BETWEEN {i64_min} AND {i64_max}",
                  f"SELECT count(*) FROM steps WHERE index BETWEEN {i64_min} AND {i64_max}",
                  f"SELECT date_bin(INTERVAL '1 microsecond', arrow_cast({i64_max}, 'Time64(Microsecond)'), arrow_cast(0, 'Time64(Microsecond)'))",
                  f"SELECT date_bin(INTERVAL '1 nanosecond', {ns_stamp(i64_max)}, {ns_stamp(i64_min)})",
                  f"SELECT date_trunc('week', {ns_stamp(i64_min)})", "SELECT DATE '2020-01-01' + INTERVAL '999999' YEAR",
                  "SELECT CAST(DATE '9999-12-31' AS timestamp)", f"SELECT lag(x, {i64_max}) OVER () FROM (VALUES (1)) t(x)",
                  f"SELECT -({i64_min})", f"SELECT {i64_min} / -1", f"SELECT substr('abc', {i64_min}, {i64_max})",
                  f"SELECT * FROM generate_series({i64_min}, {i64_max}, {i64_max})", f"SELECT action[{i64_min}:{i64_max}] FROM steps LIMIT 1",
                  "SELECT cardinality(generate_series(TIMESTAMP '1677-09-22', TIMESTAMP '2262-04-11', INTERVAL '1 nanosecond'))",
                  "SELECT cardinality(range(DATE '0001-01-01', DATE '9999-01-01', INTERVAL '1 month -30 days'))",
                  "SELECT regexp_like('abc', '(')", "SELECT count(*) FROM steps WHERE task ~ '['", "SELECT 'a' SIMILAR TO '('",
                  "WITH RECURSIVE r AS (SELECT 1 AS n UNION ALL SELECT n FROM r) SELECT n FROM r LIMIT 3",
                  "WITH RECURSIVE r AS (SELECT 'x' AS s UNION ALL SELECT s || s FROM r) SELECT length(s) FROM r LIMIT 40",
                  "SELECT arrow_cast(300, 'Dictionary(Int8, Int64)') AS d, arrow_cast(task, 'Dictionary(Int32, Utf8)') AS t FROM steps"]:
        cases.append(("POST", "/v1/sql", query))
    return cases


def route_of(path):
    """The route a path takes, its dataset name and query left out."""
    parts = path.split("?")[0].split("/")
    if parts[1:3] == ["v1", "datasets"] and len(parts) > 3:
        return "/".join(parts[:3] + ["{name}"] + parts[4:5])
    return "/".join(parts)


def request(base, method, path, body, timeout):
    data = body.encode() if isinstance(body, str) else body
    r = urllib.request.Request(base + path, data=data, method=method, headers={"Authorization": f"Bearer {TOKEN}"})
    if data is not None and path != "/v1/sql":
        r.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(r, timeout=timeout) as resp:
            resp.read(1 << 20)  # enough to see the answer start; a huge answer is not kept
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code
    except http.client.IncompleteRead:
        return "answer cut off"
    except (TimeoutError, urllib.error.URLError, ConnectionError) as e:
        return f"no answer ({e})"


def flight_cases(fl):
    base = json.dumps({"datasets": [D], "preset": "act", "batch_size": 2, "limit_batches": 1}).encode()
    calls = []
    for ticket in [b"", b"\x00" * 10, os.urandom(1000), b"{", b"null", base, base * 2, b'{"datasets":' + b"[" * 50_000 + b"]" * 50_000 + b"}",
                   b"x" * (5 << 20), json.dumps({"datasets": [D], "\u00e9" * 50_000: 1}).encode()]:
        calls.append(("DoGet", lambda c, t=ticket: c.do_get(fl.Ticket(t)).read_all()))
    for desc in [fl.FlightDescriptor.for_command(b""), fl.FlightDescriptor.for_command(os.urandom(100)), fl.FlightDescriptor.for_path("../..", "x"),
                 fl.FlightDescriptor.for_path(*["a"] * 20_000), fl.FlightDescriptor.for_command(base)]:
        calls.append(("GetFlightInfo", lambda c, d=desc: c.get_flight_info(d)))
        calls.append(("GetSchema", lambda c, d=desc: c.get_schema(d)))
    for action in [fl.Action("", b""), fl.Action("x" * 100_000, b""), fl.Action("lake.sampling_facts", b"{")]:
        calls.append(("DoAction", lambda c, a=action: list(c.do_action(a))))
    return calls


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("lake")
    p.add_argument("--keep", action="store_true")
    p.add_argument("--timeout", type=float, default=60, help="seconds to wait for one answer")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="lake-attack-"))
    root = work / "lake"
    for sample in ["v30-av1-small", "v30-h264-multifile", "v30-images-tiny"]:
        subprocess.run([args.lake, "--lake", root, "ingest", REPO / "testdata/lerobot" / sample], check=True, capture_output=True)
    http_port, flight_port = free_port(), free_port()
    log = open(work / "serve.log", "w")
    server = subprocess.Popen([args.lake, "--lake", root, "serve", "--http", f"127.0.0.1:{http_port}", "--flight", f"127.0.0.1:{flight_port}",
                               "--tokens", TOKEN], stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{http_port}"
    alive = lambda: server.poll() is None and request(base, "GET", "/healthz", None, 10) == 200
    for _ in range(300):
        if alive():
            break
        time.sleep(0.1)
    tally, failures = defaultdict(Counter), []

    def record(route, label, outcome):
        tally[route][outcome] += 1
        if not alive():
            tally[route]["server died"] += 1
            failures.append(f"{route} {label}: the server died")
            return False
        if outcome in ("500", "answer cut off"):
            failures.append(f"{route} {label}: {outcome}")
        return True

    try:
        for method, path, body in http_cases():
            status = request(base, method, path, body, args.timeout)
            outcome = str(status) if isinstance(status, int) or status == "answer cut off" else "no answer"
            outcome = {"2": "answered", "4": "refused (4xx)"}.get(outcome[0], outcome) if outcome not in ("500", "503", "507") else outcome
            if not record(f"HTTP {method} {route_of(path)}", f"{method} {path[:80]}" + (f" {body[:70]}" if path == "/v1/sql" else ""), outcome):
                break
        try:
            import pyarrow.flight as fl
        except ImportError:
            fl = None
            print("pyarrow is missing: Flight not probed")
        if fl and server.poll() is None:
            client = _Authorized(fl.FlightClient(f"grpc://127.0.0.1:{flight_port}"), fl.FlightCallOptions(
                headers=[(b"authorization", f"Bearer {TOKEN}".encode())]))
            for route, call in flight_cases(fl):
                try:
                    call(client)
                    outcome = "answered"
                except Exception as e:
                    # "Flight returned …" carries the server's status; anything else is the
                    # client's own failure to read it.
                    text = str(e)
                    if text.startswith("Flight returned internal"):
                        outcome = "500"
                    elif text.startswith("Flight returned"):
                        outcome = "refused"
                    else:
                        outcome = "unreadable refusal"
                        failures.append(f"Flight {route}: {text[:160]}")
                if not record(f"Flight {route}", route, outcome):
                    break
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()
    print(f"{'route':<40} {'tried':>5}  outcomes")
    for route, counts in tally.items():
        tried = sum(n for k, n in counts.items() if k != "server died")
        print(f"{route:<40} {tried:>5}  " + ", ".join(f"{k}: {n}" for k, n in sorted(counts.items())))
    print("failures:", "none" if not failures else "")
    for f in failures:
        print("  " + f)
    if args.keep:
        print(f"lake and server log kept in {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    sys.exit(1 if failures else 0)


class _Authorized:
    """A Flight client whose calls carry the token."""

    def __init__(self, client, options):
        self.client, self.options = client, options

    def __getattr__(self, name):
        method = getattr(self.client, name)
        return lambda *a: method(*a, options=self.options)


if __name__ == "__main__":
    main()

"""An S3-compatible server for lake's tests: moto's S3 on loopback, with conditional writes made atomic.

Run with the Python of scripts/s3-env.sh; scripts/s3-server.sh starts it in the background.

    python scripts/s3_server.py --port-file FILE [--host 127.0.0.1] [--port 0] [--bucket NAME]...
                                [--watch-pid PID] [--fail-every N] [--delay-ms MS]
                                [--deny-writes BUCKET/PREFIX]... [--verbose]

It binds HOST:PORT (port 0: a free port), creates each --bucket (default: one bucket named
`lake`) through the S3 API itself, and only then writes the bound port to --port-file, so a
port in that file answers. It exits when --watch-pid (a process id) is gone, so a test that dies
leaves no server behind.

moto checks a PUT's `If-None-Match: *` or `If-Match` and then stores the object, with nothing that
keeps another request from storing between the two. Here every request that changes state (PUT,
POST, DELETE) runs alone under one lock, its body read off the socket before it takes the lock,
so that of two racing conditional writes exactly one succeeds, as on S3. Reads run concurrently.

Faults, for tests of a client's retries: --fail-every N answers every N-th request with S3's
`503 SlowDown` (before moto sees it, so nothing changes), and --delay-ms MS holds every request that
long before answering. Each injected 503 is logged as a line `injected 503 METHOD PATH` on stderr.
--deny-writes BUCKET/PREFIX answers every PUT, POST and DELETE of a key under it with S3's `403
AccessDenied`, as S3 answers credentials whose policy allows reading only; reads go through.
While it runs, `POST /_lake/faults` with `{"fail_under": ["BUCKET/PREFIX", ...]}` makes every
request for a key under those prefixes a `503 SlowDown` from then on (an empty list ends it): a
store that stops answering for part of the lake, while the rest (the catalog, say) answers.
"""

import argparse
import io
import json
import logging
import os
import sys
import threading
import time
import urllib.request

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import make_server

WRITES = {"PUT", "POST", "DELETE"}


class SerialWrites:
    """A WSGI app that runs the requests changing state one at a time."""

    def __init__(self, app):
        self.app = app
        self.lock = threading.Lock()

    def __call__(self, environ, start_response):
        if environ.get("REQUEST_METHOD") not in WRITES:
            return self.app(environ, start_response)
        buffer_body(environ)
        with self.lock:
            # The response is drawn inside the lock too, so no part of the request runs outside it.
            result = self.app(environ, start_response)
            try:
                return [b"".join(result)]
            finally:
                if hasattr(result, "close"):
                    result.close()


class Faults:
    """A WSGI app in front of another that delays requests, fails every N-th and those under the
    failing prefixes with a 503, and refuses writes under the denied prefixes with a 403."""

    def __init__(self, app, fail_every, delay_ms, denied):
        self.app, self.fail_every, self.delay, self.denied = app, fail_every, delay_ms / 1000.0, denied
        self.failing = []
        self.count = 0
        self.lock = threading.Lock()
        self.on = threading.Event()

    def __call__(self, environ, start_response):
        if not self.on.is_set():
            return self.app(environ, start_response)
        path = environ.get("PATH_INFO", "")
        if path == "/_lake/faults" and environ.get("REQUEST_METHOD") == "POST":
            buffer_body(environ)
            self.failing = list(json.loads(environ["wsgi.input"].read() or b"{}").get("fail_under", []))
            start_response("204 No Content", [])
            return [b""]
        if any(path.startswith(f"/{prefix}") for prefix in self.failing):
            return self.slow_down(environ, start_response)
        if environ.get("REQUEST_METHOD") in WRITES and any(path.startswith(f"/{prefix}") for prefix in self.denied):
            buffer_body(environ)
            print(f"denied {environ.get('REQUEST_METHOD')} {environ.get('PATH_INFO')}", file=sys.stderr, flush=True)
            body = b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>'
            start_response("403 Forbidden", [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))])
            return [body]
        if self.delay:
            time.sleep(self.delay)
        with self.lock:
            self.count += 1
            fail = self.fail_every > 0 and self.count % self.fail_every == 0
        if not fail:
            return self.app(environ, start_response)
        return self.slow_down(environ, start_response)

    def slow_down(self, environ, start_response):
        """S3's `503 SlowDown`, logged as `injected 503 METHOD PATH`."""
        # The body is drained so that the client reads the answer, not a reset connection.
        buffer_body(environ)
        print(f"injected 503 {environ.get('REQUEST_METHOD')} {environ.get('PATH_INFO')}", file=sys.stderr, flush=True)
        body = b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>'
        start_response("503 Service Unavailable", [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))])
        return [body]


def buffer_body(environ):
    """Reads the request body off the socket into memory (moto keeps whole bodies in memory anyway)."""
    stream = environ["wsgi.input"]
    if environ.get("wsgi.input_terminated"):
        data = stream.read()
    else:
        length = int(environ.get("CONTENT_LENGTH") or 0)
        chunks, left = [], length
        while left > 0:
            chunk = stream.read(min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
    # Every body reaches moto whole and with its length, a chunked one too.
    environ["wsgi.input"] = io.BytesIO(data)
    environ["CONTENT_LENGTH"] = str(len(data))
    environ.pop("wsgi.input_terminated", None)
    environ.pop("HTTP_TRANSFER_ENCODING", None)


def watch(pid, server):
    """Stops the server once process `pid` is gone."""
    while True:
        time.sleep(0.5)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            server.shutdown()
            return
        except PermissionError:
            pass


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file", required=True)
    parser.add_argument("--bucket", action="append", default=None)
    parser.add_argument("--watch-pid", type=int, default=None)
    parser.add_argument("--fail-every", type=int, default=0, help="answer every N-th request with 503 SlowDown")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="hold every request this long")
    parser.add_argument("--deny-writes", action="append", default=[], metavar="BUCKET/PREFIX",
                        help="answer writes of keys under it with 403 AccessDenied")
    parser.add_argument("--verbose", action="store_true", help="log every request to stderr")
    args = parser.parse_args()
    if not args.verbose:
        logging.getLogger("werkzeug").setLevel(logging.WARNING)

    app = Faults(SerialWrites(DomainDispatcherApplication(create_backend_app)), args.fail_every, args.delay_ms, args.deny_writes)
    server = make_server(args.host, args.port, app, threaded=True, request_handler=MotoRequestHandler)
    port = server.server_port
    serving = threading.Thread(target=server.serve_forever, name="s3-serve", daemon=True)
    serving.start()
    for bucket in args.bucket or ["lake"]:
        request = urllib.request.Request(f"http://{args.host}:{port}/{bucket}", method="PUT")
        with urllib.request.urlopen(request, timeout=30) as response:
            if response.status != 200:
                sys.exit(f"s3_server: creating bucket {bucket} answered {response.status}")
    # Faults start once the buckets exist.
    app.on.set()
    tmp = f"{args.port_file}.tmp"
    with open(tmp, "w") as f:
        f.write(f"{port}\n")
    os.replace(tmp, args.port_file)
    if args.watch_pid:
        threading.Thread(target=watch, args=(args.watch_pid, server), name="s3-watch", daemon=True).start()
    try:
        serving.join()
    except KeyboardInterrupt:
        server.shutdown()


if __name__ == "__main__":
    main()

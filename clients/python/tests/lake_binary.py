"""The lake binary the Python tests drive, and the `lake serve` they start on loopback.

The binary is `$LAKE_BIN`, else the debug build, `${CARGO_TARGET_DIR:-~/.cache/lake/target}/debug/lake`.
"""

import json
import os
import re
import subprocess
import threading
import time
import urllib.request


def target_dir():
    """Cargo's target directory, where the tests find the debug build and leave what they make."""
    return os.environ.get("CARGO_TARGET_DIR") or os.path.expanduser("~/.cache/lake/target")


LAKE_BIN = os.environ.get("LAKE_BIN") or os.path.join(target_dir(), "debug", "lake")


def missing():
    """Why the binary cannot run, or None."""
    if os.access(LAKE_BIN, os.X_OK):
        return None
    return f"no lake binary at {LAKE_BIN} (cargo build -p lake, or set LAKE_BIN)"


def lake(root, *args):
    """`lake --lake ROOT ARGS...`'s standard output; an error with its output where it fails."""
    done = subprocess.run([LAKE_BIN, "--lake", root, *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"lake {' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done.stdout


def lake_sql(root, query):
    """The rows `lake sql` answers, as dictionaries."""
    return json.loads(lake(root, "sql", "--format", "json", query))


class Server:
    """`lake serve` over ROOT on free loopback ports, with ARGS after them.

    Its output goes to `log_path`. Once it answers `/healthz`, `flight` and `http` are its
    addresses (`grpc://…` and `http://…`). `stop()` ends it.
    """

    def __init__(self, root, log_path, *args, env=None):
        self.log_path = log_path
        self.log = open(log_path, "w")
        self.process = subprocess.Popen(
            [LAKE_BIN, "--lake", root, "serve", "--flight", "127.0.0.1:0", "--http", "127.0.0.1:0", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        found = {}
        said = threading.Event()

        def copy_output():
            for line in self.process.stdout:
                self.log.write(line)
                self.log.flush()
                flight, http = re.search(r"grpc://\S+", line), re.search(r"http://\S+", line)
                if flight and http and not found:
                    found.update(flight=flight.group(0), http=http.group(0))
                    said.set()
            said.set()

        self.reader = threading.Thread(target=copy_output, daemon=True)
        self.reader.start()
        if not said.wait(60) or not found:
            self.stop()
            raise RuntimeError(f"lake serve did not say where it listens; its log: {log_path}")
        self.flight, self.http = found["flight"], found["http"]
        for _ in range(100):
            try:
                with urllib.request.urlopen(f"{self.http}/healthz", timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"lake serve at {self.http} does not answer /healthz; its log: {log_path}")

    def stop(self):
        """Ends the server (SIGTERM, then SIGKILL after 20 s) and closes its log."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.reader.join(10)
        self.process.stdout.close()
        self.log.close()

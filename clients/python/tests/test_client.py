"""The Python client against a running `lake serve` (started by lake's integration tests, which
set LAKE_FLIGHT, LAKE_LOCAL, LAKE_TOKEN, LAKE_DATASET and LAKE_REFERENCE_DIR).

A full epoch read through the client holds every step once, and its samples equal LeRobot's own
reference dumps (every value bit for bit, every frame's SHA-256); the torch dataset resumes
exactly from its state_dict, splits ranks disjointly, refuses unknown keyword arguments when it
is made, takes None as unset, has a len() equal to the batches it yields, and gives frames in
LeRobot's layout on request (skipped without torch). Requests to the HTTP port end in a
`LakeError` however they fail: refused, unreachable, or broken off after the first rows. The
package builds a wheel that installs into a clean virtual environment (skipped without `build`).
"""

import glob
import hashlib
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import warnings
import zipfile

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.ipc as ipc

from lake_client import (
    FRAMES_KEY,
    LakeClient,
    LakeError,
    LocalClient,
    batch_to_numpy,
    frames_to_rgb,
    to_lerobot_layout,
    yuv420p_to_rgb24,
)

try:
    import torch  # noqa: F401

    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False

try:
    import build  # noqa: F401

    HAVE_BUILD = True
except ImportError:
    HAVE_BUILD = False

# clients/python: the package's sources and pyproject.toml.
CLIENT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

LOCATION = os.environ.get("LAKE_FLIGHT", "grpc://127.0.0.1:50051")
LOCAL = os.environ.get("LAKE_LOCAL")
HTTP = os.environ.get("LAKE_HTTP")
TOKEN = os.environ.get("LAKE_TOKEN")
DATASET = os.environ.get("LAKE_DATASET", "v30-av1-small")
REFERENCE_DIR = os.environ.get("LAKE_REFERENCE_DIR", "")

# Three DataLoader workers on a two-core machine are what the worker tests mean to run.
warnings.filterwarnings("ignore", message="This DataLoader will create")


def read_epoch(client, preset, batch_size=50):
    request = {"datasets": [DATASET], "preset": preset, "batch_size": batch_size, "seed": 11, "drop_last": False}
    info = client.info(request)
    request["limit_batches"] = info["steps_per_epoch"]
    batches = list(client.batches(request))
    return info, batches


class FullEpochEqualsLeRobot(unittest.TestCase):
    def setUp(self):
        self.client = LakeClient(LOCATION, TOKEN)

    def check_preset(self, preset):
        info, batches = read_epoch(self.client, preset)
        table = pa.Table.from_batches(batches)
        index = table.column("index").to_pylist()
        self.assertEqual(sorted(index), list(range(info["epoch_len"])), "an epoch holds every step once")
        ref = ipc.open_file(os.path.join(REFERENCE_DIR, f"{DATASET}.{preset}.arrow")).read_all()
        rows = {i: r for r, i in enumerate(index)}
        columns = batch_to_numpy(table.combine_chunks().to_batches()[0])
        checked = 0
        for row in ref.to_pylist():
            if row.get("lerobot_error"):
                continue
            r = rows[row["index"]]
            for key in ("episode_index", "frame_index", "task_index"):
                self.assertEqual(int(columns[key][r]), row[key], key)
            self.assertEqual(np.float32(columns["timestamp"][r]), np.float32(row["timestamp"]))
            self.assertEqual(columns["task"][r], row["task"])
            for key, value in row.items():
                if key.endswith(".sha256"):
                    camera = key[: -len(".sha256")]
                    frames = columns[camera][r]
                    got = [hashlib.sha256(np.ascontiguousarray(f).tobytes()).hexdigest() for f in (frames if isinstance(value, list) else [frames])]
                    self.assertEqual(got, value if isinstance(value, list) else [value], f"{camera} frames")
                elif ref.schema.field(key).type in (pa.list_(pa.float32()), pa.list_(pa.bool_())):
                    self.assertIn(key, columns, f"the batch has no {key}")
                    want = np.asarray(value).ravel()
                    got = np.asarray(columns[key][r]).ravel()
                    self.assertEqual(got.astype(want.dtype).tobytes(), want.tobytes(), key)
            checked += 1
        self.assertGreater(checked, 0)

    def test_none_preset_epoch_matches_reference(self):
        self.check_preset("none")

    def test_act_preset_epoch_matches_reference(self):
        self.check_preset("act")

    def test_diffusion_preset_epoch_matches_reference(self):
        self.check_preset("diffusion")

    def test_errors_pickle_and_rebuild_from_their_text(self):
        import pickle

        e = pickle.loads(pickle.dumps(LakeError("busy", "the server is full")))
        self.assertEqual((e.code, e.message, str(e)), ("busy", "the server is full", "the server is full (busy)"))
        again = LakeError("Caught LakeError in DataLoader worker process 0.\nTraceback ...\nlake_client.LakeError: gone (unavailable)\n")
        self.assertEqual(again.code, "unavailable")
        with self.assertRaises(LakeError) as bad:
            LakeClient("http://127.0.0.1:1")
        self.assertEqual(bad.exception.code, "bad_request")

    def test_a_limited_stream_has_a_len_and_none_fields_are_left_out(self):
        request = {"datasets": [DATASET], "preset": "none", "batch_size": 8, "seed": 4, "limit_batches": 3}
        # None is the same as leaving a field out (the server refuses null for most of them).
        unset = {"episodes": None, "drop_last": None, "drop_n_first_frames": None, "frame_size": None, "epoch": None}
        info = self.client.info(request)
        self.assertEqual(self.client.info({**request, **unset})["steps_per_epoch"], info["steps_per_epoch"])
        clients = [self.client] + ([LocalClient(LOCAL, TOKEN)] if LOCAL else [])
        whole = [b["index"].to_pylist() for b in self.client.batches(request)]
        for client in clients:
            batches = client.batches({**request, **unset})
            self.assertEqual(len(batches), 3, type(client).__name__)
            # Each batch let go before the next (a local stream's slots).
            read = [next(batches)["index"].to_pylist()]
            self.assertEqual(len(batches), 2)
            for batch in batches:
                read.append(batch["index"].to_pylist())
                self.assertEqual(len(batches), 3 - len(read))
                del batch
            self.assertEqual(read, whole)
            endless = client.batches({**request, "limit_batches": None})
            self.assertTrue(endless)
            with self.assertRaises(TypeError) as refused:
                len(endless)
            self.assertIn("endless", str(refused.exception))
            self.assertIn("limit_batches", str(refused.exception))
            endless.close()

    def test_datasets_are_listed(self):
        listed = {d["name"]: d for d in self.client.datasets()}
        self.assertIn(DATASET, listed)
        self.assertGreaterEqual(listed[DATASET]["version"], 1)

    @unittest.skipUnless(HTTP, "LAKE_HTTP (the server's HTTP address) is not set")
    def test_the_http_address_is_named_as_not_flights(self):
        with self.assertRaises(LakeError) as refused:
            LakeClient(f"grpc://{HTTP}", TOKEN).info({"datasets": [DATASET]})
        self.assertEqual(refused.exception.code, "unavailable")
        self.assertIn("give lake serve's --flight address", str(refused.exception))

    @unittest.skipUnless(HTTP, "LAKE_HTTP (the server's HTTP address) is not set")
    def test_http_answers_refusals_and_broken_answers_are_lake_errors(self):
        from lake_client._http import http_json

        sql = {"Content-Type": "text/plain", "Accept": "application/json"}
        rows = http_json(HTTP, "POST", "/v1/sql", TOKEN, b"SELECT value FROM generate_series(1, 3)", sql)
        self.assertEqual(rows, [{"value": 1}, {"value": 2}, {"value": 3}])
        cases = [
            # The first batch fails: a refusal with the server's message.
            (b"SELECT 1 / (value - 1) AS x FROM generate_series(1, 3)", "bad_request", "Divide by zero"),
            # The 100,000th row fails, batches after the first went out with the 200.
            (b"SELECT 1 / (value - 100000) AS x FROM generate_series(1, 200000)", "internal", "broke off after"),
        ]
        for query, code, says in cases:
            with self.assertRaises(LakeError) as refused:
                http_json(HTTP, "POST", "/v1/sql", TOKEN, query, sql)
            self.assertEqual(refused.exception.code, code, str(refused.exception))
            self.assertIn(says, str(refused.exception))
        with self.assertRaises(LakeError) as refused:
            http_json(HTTP, "GET", "/v1/datasets", None)
        self.assertEqual(refused.exception.code, "unauthorized")
        with self.assertRaises(LakeError) as refused:
            http_json("127.0.0.1:1", "GET", "/v1/datasets", TOKEN)
        self.assertEqual(refused.exception.code, "unavailable")
        self.assertIn("give lake serve's --http address", str(refused.exception))


@unittest.skipUnless(HAVE_BUILD, "the `build` package cannot be imported (scripts/python-env.sh installs it)")
class TheWheel(unittest.TestCase):
    """`python -m build --wheel` makes a wheel that installs into a clean virtual environment,
    which then imports lake_client from the wheel and reads a batch with it.

    Nothing comes from PyPI: the wheel is built without isolation (with this environment's
    setuptools, which scripts/python-env.sh pins), and installed with --no-deps --no-index; the
    new environment sees this one's pyarrow and numpy through a .pth file, once the wheel's
    metadata is checked to require them. So the test runs offline, as CI may, and in seconds."""

    def run_ok(self, *args, **kw):
        # No PYTHONPATH (lake's test runner points it at the source tree).
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        done = subprocess.run(args, capture_output=True, text=True, env=env, **kw)
        self.assertEqual(done.returncode, 0, f"{' '.join(args)}:\n{done.stdout}\n{done.stderr}")
        return done.stdout

    def test_the_wheel_installs_into_a_clean_venv_and_imports_from_there(self):
        with tempfile.TemporaryDirectory() as tmp:
            # Built from a copy, so the source tree gets no build/ or egg-info.
            source = os.path.join(tmp, "source")
            shutil.copytree(CLIENT_DIR, source, ignore=shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__"))
            self.run_ok(sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", os.path.join(tmp, "dist"), source)
            (wheel,) = glob.glob(os.path.join(tmp, "dist", "*.whl"))
            self.assertEqual(os.path.basename(wheel), "lake_client-0.1.0-py3-none-any.whl")
            with zipfile.ZipFile(wheel) as z:
                names = z.namelist()
                metadata = z.read("lake_client-0.1.0.dist-info/METADATA").decode()
            # Every module of the package, and nothing else (no tests, no build leftovers).
            modules = sorted(f"lake_client/{m}" for m in os.listdir(os.path.join(CLIENT_DIR, "lake_client")) if m.endswith(".py"))
            self.assertEqual(sorted(n for n in names if not n.startswith("lake_client-0.1.0.dist-info/")), modules)
            requires = [line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
            self.assertIn("pyarrow>=14", requires)
            self.assertIn("numpy>=1.24", requires)

            venv = os.path.join(tmp, "venv")
            self.run_ok(sys.executable, "-m", "venv", venv)
            python = os.path.join(venv, "bin", "python")
            self.run_ok(python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", wheel)
            site = self.run_ok(python, "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip()
            with open(os.path.join(site, "lake-test-dependencies.pth"), "w") as pth:
                pth.write("\n".join(sorted({os.path.dirname(os.path.dirname(m.__file__)) for m in (np, pa)})) + "\n")
            # -I: no PYTHONPATH, user site or working directory on the path; run from elsewhere too.
            script = (
                "import importlib.metadata as md, json, sys\n"
                "import lake_client\n"
                "location, token, dataset = sys.argv[1:]\n"
                "request = {'datasets': [dataset], 'batch_size': 4, 'limit_batches': 1}\n"
                "rows = [b.num_rows for b in lake_client.LakeClient(location, token or None).batches(request)]\n"
                "files = [str(f) for f in md.distribution('lake-client').files]\n"
                "print(json.dumps({'file': lake_client.__file__, 'version': md.version('lake-client'), 'files': files,"
                " 'rows': rows}))\n"
            )
            seen = json.loads(self.run_ok(python, "-I", "-c", script, LOCATION, TOKEN or "", DATASET, cwd=tmp))
            installed = os.path.realpath(seen["file"])
            self.assertEqual(installed, os.path.join(os.path.realpath(site), "lake_client", "__init__.py"), "from the wheel")
            self.assertFalse(installed.startswith(os.path.realpath(CLIENT_DIR) + os.sep), "not the source tree")
            with open(installed, "rb") as got, open(os.path.join(CLIENT_DIR, "lake_client", "__init__.py"), "rb") as want:
                self.assertEqual(got.read(), want.read(), "the wheel holds this tree's client")
        self.assertEqual(seen["version"], "0.1.0")
        self.assertIn("lake_client/__init__.py", seen["files"])
        self.assertEqual(seen["rows"], [4], "the installed client reads a batch from the server")


class RankFromTheEnvironment(unittest.TestCase):
    """Without an initialised `torch.distributed`, the launcher's variables give rank and world."""

    def rank_and_world(self, env):
        from unittest import mock

        from lake_client import _rank_and_world

        names = ["RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "SLURM_PROCID",
                 "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS"]
        clean = {k: v for k, v in os.environ.items() if k not in names}
        with mock.patch.dict(os.environ, {**clean, **env}, clear=True):
            return _rank_and_world()

    def test_launchers_in_order_and_bad_values_named(self):
        self.assertEqual(self.rank_and_world({}), (0, 1))
        self.assertEqual(self.rank_and_world({"RANK": "1", "WORLD_SIZE": "2"}), (1, 2))
        self.assertEqual(self.rank_and_world({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4"}), (2, 4))
        self.assertEqual(self.rank_and_world({"PMI_RANK": "3", "PMI_SIZE": "4"}), (3, 4))
        self.assertEqual(self.rank_and_world({"SLURM_PROCID": "5", "SLURM_STEP_NUM_TASKS": "8", "SLURM_NTASKS": "8"}), (5, 8))
        # A batch script outside srun: the allocation's tasks are no world it belongs to.
        self.assertEqual(self.rank_and_world({"SLURM_PROCID": "0", "SLURM_NTASKS": "8"}), (0, 1))
        # torchrun's variables win over the job's (torchrun under srun).
        self.assertEqual(self.rank_and_world({"RANK": "6", "WORLD_SIZE": "16", "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "2"}), (6, 16))
        with self.assertRaisesRegex(ValueError, "WORLD_SIZE='two' is not a whole number"):
            self.rank_and_world({"RANK": "0", "WORLD_SIZE": "two"})
        with self.assertRaisesRegex(ValueError, "PMI_RANK=4 is not a rank of PMI_SIZE=4"):
            self.rank_and_world({"PMI_RANK": "4", "PMI_SIZE": "4"})


class _SilentServer(flight.FlightServerBase):
    """A Flight server whose streams start and then send nothing: a server that stopped
    answering, as far as a reader waiting for its next batch can tell."""

    def __init__(self):
        super().__init__("grpc://127.0.0.1:0")
        self.release = threading.Event()
        self.cancelled = threading.Event()
        self.started = threading.Event()

    def do_get(self, context, ticket):
        self.started.set()
        schema = pa.schema([("index", pa.int64())])

        def silent():
            while not self.release.wait(0.05):
                if context.is_cancelled():
                    self.cancelled.set()
                    return
            yield pa.record_batch([pa.array([0])], schema=schema)

        return flight.GeneratorStream(schema, silent())


class ALocalServerThatGoesAway(unittest.TestCase):
    def test_a_stream_closed_without_an_error_is_unavailable(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "lake.sock")
            server = socket.socket(socket.AF_UNIX)
            server.bind(path)
            server.listen(1)

            def go(read_first):
                conn, _ = server.accept()
                if read_first:
                    conn.recv(1 << 16)
                else:
                    time.sleep(0.2)  # the request arrives, unread: closing resets the connection
                conn.close()

            # Closed after reading the request (an end of file), and with it unread (a reset).
            for read_first in (True, False):
                thread = threading.Thread(target=go, args=(read_first,))
                thread.start()
                with self.assertRaises(LakeError) as gone:
                    next(LocalClient(path).batches({"datasets": ["x"]}))
                thread.join()
                self.assertEqual(gone.exception.code, "unavailable", read_first)
                self.assertIn("resume from the next step", str(gone.exception))
            server.close()
            # Nothing listening (a server killed, its socket file left), or no socket at all.
            for where in (path, os.path.join(tmp, "none.sock")):
                with self.assertRaises(LakeError) as gone:
                    next(LocalClient(where).batches({"datasets": ["x"]}))
                self.assertEqual(gone.exception.code, "unavailable", where)
                self.assertIn(f"no lake server at {where}", str(gone.exception))


class ALocalServerThatStopsAnswering(unittest.TestCase):
    def test_keepalives_hold_a_stream_open_and_silence_ends_it_as_unavailable(self):
        schema = pa.schema([("index", pa.int64())]).serialize().to_pybytes()
        # The stream format's framing (continuation, length) is not part of the message sent.
        (length,) = struct.unpack_from("<i", schema, 4)
        frame = lambda kind, payload=b"": struct.pack("<I", 1 + len(payload)) + kind + payload
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "lake.sock")
            server = socket.socket(socket.AF_UNIX)
            server.bind(path)
            server.listen(1)
            done = threading.Event()

            def serve():
                conn, _ = server.accept()
                conn.recv(1 << 16)
                conn.sendall(frame(b"S", schema[8 : 8 + length]))
                # At work on the first batch for 1.5 s (keepalives 0.2 s apart), then frozen.
                for _ in range(8):
                    time.sleep(0.2)
                    conn.sendall(frame(b"K"))
                done.wait(10)
                conn.close()

            thread = threading.Thread(target=serve)
            thread.start()
            started = time.monotonic()
            try:
                with self.assertRaises(LakeError) as silent:
                    next(LocalClient(path, server_timeout_s=0.6).batches({"datasets": ["x"]}))
            finally:
                done.set()
                thread.join()
                server.close()
            waited = time.monotonic() - started
            self.assertEqual(silent.exception.code, "unavailable")
            self.assertIn("the server sent nothing for 0.6 s", str(silent.exception))
            self.assertGreater(waited, 1.6 + 0.6 - 0.05, "keepalives held the stream open")
        with self.assertRaises(ValueError):
            LocalClient(path, server_timeout_s=0)


class AStreamThatStopsAnswering(unittest.TestCase):
    def setUp(self):
        self.server = _SilentServer()
        self.client = LakeClient(f"grpc://127.0.0.1:{self.server.port}")

    def tearDown(self):
        self.server.release.set()
        self.server.shutdown()

    def test_ctrl_c_interrupts_a_wait_for_the_next_batch_and_cancels_the_stream(self):
        batches = self.client.batches({"datasets": ["silent"]})
        main = threading.main_thread().ident
        interrupted = []

        # Ctrl-C once the stream has started and the reader waits for its first batch (a timer
        # alone could fire before, on a loaded machine).
        def interrupt():
            if self.server.started.wait(30.0):
                time.sleep(0.2)
                interrupted.append(time.monotonic())
                signal.pthread_kill(main, signal.SIGINT)

        # Python's own Ctrl-C handler, also where this process was started with SIGINT ignored
        # (as a background job of a shell is): without it the signal would do nothing.
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        self.addCleanup(signal.signal, signal.SIGINT, previous)
        threading.Thread(target=interrupt, daemon=True).start()
        with self.assertRaises(KeyboardInterrupt):
            next(batches)
        self.assertTrue(interrupted, "the stream started")
        self.assertLess(time.monotonic() - interrupted[0], 5.0)
        self.assertTrue(self.server.cancelled.wait(5.0), "the server saw the stream cancelled")

    def test_dropping_the_iterator_cancels_the_stream(self):
        batches = self.client.batches({"datasets": ["silent"]})
        time.sleep(0.2)
        del batches
        self.assertTrue(self.server.cancelled.wait(5.0), "the server saw the stream cancelled")


@unittest.skipUnless(LOCAL, "the server has no local socket (LAKE_LOCAL)")
class LocalStreams(unittest.TestCase):
    def test_an_epoch_in_shared_memory_equals_flights(self):
        _, over_flight = read_epoch(LakeClient(LOCATION, TOKEN), "act")
        request = {"datasets": [DATASET], "preset": "act", "batch_size": 50, "seed": 11, "drop_last": False,
                   "limit_batches": len(over_flight)}
        read = 0
        # Each batch is compared and let go (its slot goes back) before the next; one slot.
        for batch in LocalClient(LOCAL, TOKEN, slots=1).batches(request):
            self.assertTrue(batch.equals(over_flight[read]), f"batch {read}")
            read += 1
            del batch
        self.assertEqual(read, len(over_flight))

    def test_a_trainer_slower_than_the_server_timeout_is_not_taken_for_a_silent_server(self):
        request = {"datasets": [DATASET], "preset": "none", "batch_size": 4, "seed": 1, "limit_batches": 3}
        batches = LocalClient(LOCAL, TOKEN, slots=1, server_timeout_s=1.0).batches(request)
        first = next(batches)
        # Training on it for longer than the timeout: the server's keepalives (it waits for the
        # slot) wait unread in the socket meanwhile.
        time.sleep(2.5)
        del first
        read = 0
        for batch in batches:
            read += 1
            del batch
        self.assertEqual(read, 2)

    def test_a_request_is_described_as_over_flight(self):
        request = {"datasets": [DATASET], "preset": "act", "batch_size": 50, "seed": 11, "drop_last": False,
                   "rank": 1, "world_size": 3}
        local, flight = LocalClient(LOCAL, TOKEN).info(request), LakeClient(LOCATION, TOKEN).info(request)
        self.assertTrue(local["schema"].equals(flight["schema"], check_metadata=True))
        self.assertEqual((local["epoch_len"], local["steps_per_epoch"]), (flight["epoch_len"], flight["steps_per_epoch"]))
        self.assertEqual(local["datasets"], [f"{DATASET}@1"], "the plan pins the version read")
        self.assertEqual(flight["datasets"], local["datasets"])
        self.assertGreater(local["steps_per_epoch"], 0)
        with self.assertRaises(LakeError) as refused:
            LocalClient(LOCAL, TOKEN).info({"datasets": [DATASET], "rank": 3, "world_size": 3})
        self.assertEqual(refused.exception.code, "bad_request")
        with self.assertRaises(LakeError) as refused:
            LocalClient(LOCAL, "wrong").info(request)
        self.assertEqual(refused.exception.code, "unauthorized")
        # Flight refuses with the same codes and messages.
        with self.assertRaises(LakeError) as refused:
            LakeClient(LOCATION, TOKEN).info({"datasets": [DATASET], "rank": 3, "world_size": 3})
        self.assertEqual(refused.exception.code, "bad_request")
        self.assertNotIn("gRPC", refused.exception.message)
        self.assertIn("rank 3", refused.exception.message)
        with self.assertRaises(LakeError) as refused:
            list(LakeClient(LOCATION, TOKEN).batches({"datasets": ["nope"]}))
        self.assertEqual(refused.exception.code, "not_found")
        with self.assertRaises(LakeError) as refused:
            LakeClient(LOCATION, "wrong").info(request)
        self.assertEqual(refused.exception.code, "unauthorized")
        with self.assertRaises(LakeError) as refused:
            LakeClient(LOCATION, None).datasets()
        self.assertEqual(refused.exception.code, "unauthorized")
        # A reader cut short cancels its stream; the server then serves the next one as usual.
        endless = LakeClient(LOCATION, TOKEN).batches({"datasets": [DATASET], "batch_size": 4})
        self.assertEqual(next(endless).num_rows, 4)
        endless.close()
        self.assertEqual(len(list(LakeClient(LOCATION, TOKEN).batches({**request, "limit_batches": 1}))), 1)

    def test_a_full_server_is_busy_not_a_bad_request(self):
        # pyarrow raises gRPC's RESOURCE_EXHAUSTED (a server whose memory budget is taken) as
        # an ArrowInvalid; the client says busy, which a trainer retries.
        from lake_client import _lake_error

        e = _lake_error(pa.ArrowInvalid(
            "gRPC returned resource exhausted error, with message: the server's memory budget is taken. "
            "gRPC client debug context: UNKNOWN:Error received from peer"))
        self.assertEqual((e.code, e.message), ("busy", "the server's memory budget is taken"))
        self.assertEqual(_lake_error(pa.ArrowInvalid("Flight returned invalid argument error, with message: bad")).code, "bad_request")

    def test_a_stream_whose_slots_are_all_held_says_so(self):
        import lake_client

        request = {"datasets": [DATASET], "preset": "act", "batch_size": 8, "seed": 2, "limit_batches": 2}
        batches = LocalClient(LOCAL, TOKEN, slots=1).batches(request)
        held = [next(batches)]
        # The one slot is held; a second later the trainer drops its batch and the stream goes on.
        timer = threading.Timer(1.0, held.clear)
        saved, lake_client.STALL_WARNING_S = lake_client.STALL_WARNING_S, 0.2
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                timer.start()
                second = next(batches)
        finally:
            lake_client.STALL_WARNING_S = saved
            timer.cancel()
        self.assertEqual(second.num_rows, 8)
        self.assertTrue(any("all 1 of its slots" in str(w.message) for w in caught), [str(w.message) for w in caught])
        del second
        self.assertEqual(list(batches), [])

    def test_refusals_name_their_reason(self):
        with self.assertRaises(LakeError) as refused:
            next(LocalClient(LOCAL, TOKEN).batches({"datasets": ["nope"]}))
        self.assertEqual(refused.exception.code, "not_found")
        self.assertIn("nope", str(refused.exception))
        with self.assertRaises(LakeError) as refused:
            next(LocalClient(LOCAL, None).batches({"datasets": [DATASET]}))
        self.assertEqual(refused.exception.code, "unauthorized")


class YuvFrames(unittest.TestCase):
    """`frame_format="yuv420p"`: planes that the client turns into the RGB bytes the server sends."""

    REQUEST = {"datasets": [DATASET], "preset": "diffusion", "batch_size": 16, "seed": 3, "limit_batches": 3}

    def test_planes_over_flight_and_local_convert_to_the_rgb_frames(self):
        rgb = list(LakeClient(LOCATION, TOKEN).batches(self.REQUEST))
        for client in [LakeClient(LOCATION, TOKEN)] + ([LocalClient(LOCAL, TOKEN)] if LOCAL else []):
            # Each batch is compared and let go before the next (a local stream's slots).
            compared = 0
            for planes, frames in zip(client.batches({**self.REQUEST, "frame_format": "yuv420p"}), rgb):
                compared += 1
                cameras = [f.name for f in frames.schema if (f.metadata or {}).get(b"pixel_format")]
                self.assertTrue(cameras)
                converted = batch_to_numpy(planes)
                facts = converted[FRAMES_KEY]
                self.assertEqual(sorted(facts), sorted(cameras), "every camera of this dataset is 8-bit 4:2:0")
                for camera in cameras:
                    h, w = facts[camera]["height"], facts[camera]["width"]
                    self.assertEqual(converted[camera].shape[-1], h * w * 3 // 2, "planes are half the bytes of RGB")
                frames_to_rgb(converted)
                self.assertNotIn(FRAMES_KEY, converted)
                want = batch_to_numpy(frames)
                for key, value in want.items():
                    if isinstance(value, list):
                        self.assertEqual(converted[key], value, key)
                    else:
                        np.testing.assert_array_equal(converted[key], value, err_msg=key)
                del planes, converted
            self.assertEqual(compared, len(rgb))

    def test_the_numpy_and_torch_conversions_agree_and_refuse_a_wrong_size(self):
        (batch,) = LakeClient(LOCATION, TOKEN).batches({**self.REQUEST, "frame_format": "yuv420p", "limit_batches": 1})
        columns = batch_to_numpy(batch)
        camera, facts = next(iter(columns[FRAMES_KEY].items()))
        planes = columns[camera]
        with self.assertRaises(ValueError) as refused:
            yuv420p_to_rgb24(planes[..., 1:], facts["height"], facts["width"], facts["yuv_to_rgb"])
        self.assertIn("YUV 4:2:0 planes", str(refused.exception))
        if not HAVE_TORCH:
            self.skipTest("torch is not installed")
        on_cpu = yuv420p_to_rgb24(planes, facts["height"], facts["width"], facts["yuv_to_rgb"])
        as_tensor = yuv420p_to_rgb24(torch.from_numpy(np.ascontiguousarray(planes)), facts["height"], facts["width"], facts["yuv_to_rgb"])
        np.testing.assert_array_equal(as_tensor.numpy(), on_cpu)


    def test_packet_batches_pass_through_as_the_server_sends_them(self):
        (batch,) = LakeClient(LOCATION, TOKEN).batches({**self.REQUEST, "frame_format": "packets", "limit_batches": 1})
        cameras = [f for f in batch.schema if (f.metadata or {}).get(b"pixel_format") == b"packets"]
        self.assertTrue(cameras)
        for camera in cameras:
            gops = batch.column(camera.name + "_packets")
            self.assertEqual(gops.type.value_type.field("packets").type.value_type.field("data").type, pa.binary())
            listed = gops.flatten()
            frames = sum(len(g["frames"].as_py()) for g in listed)
            column = batch.column(camera.name)
            numbers = (column.flatten() if pa.types.is_fixed_size_list(column.type) else column).to_numpy()
            # Every slot shows one of the frames its batch's GOPs give.
            self.assertTrue(numbers.max() < frames, (numbers.max(), frames))


class LeRobotLayout(unittest.TestCase):
    """`to_lerobot_layout`: uint8 HWC frames as float32 CHW, each value the uint8 / 255."""

    def every_value(self):
        # All 256 values in each channel, a window of 2 frames: [B=2, T=2, H=16, W=16, 3].
        values = np.arange(256, dtype=np.uint8).reshape(16, 16)
        frames = np.stack([values, values[::-1], values.T], axis=-1)
        return np.stack([np.stack([frames, 255 - frames])] * 2)

    def test_numpy_frames(self):
        frames = self.every_value()
        got = to_lerobot_layout(frames)
        self.assertEqual((got.dtype, got.shape), (np.float32, (2, 2, 3, 16, 16)))
        self.assertTrue(got.flags["C_CONTIGUOUS"])
        for b, t, c in np.ndindex(2, 2, 3):
            want = frames[b, t, :, :, c].astype(np.float32) / np.float32(255)
            self.assertEqual(got[b, t, c].tobytes(), want.tobytes(), (b, t, c))
        self.assertEqual((got.min(), got.max()), (0.0, 1.0))
        with self.assertRaises(ValueError):
            to_lerobot_layout(frames[..., :2])
        with self.assertRaises(TypeError):
            to_lerobot_layout(frames.astype(np.float32))

    @unittest.skipUnless(HAVE_TORCH, "torch is not installed")
    def test_torch_frames_on_every_device_equal_lerobots_cpu_division(self):
        import lake_client

        frames = torch.from_numpy(self.every_value())
        # LeRobot's own arithmetic, on the CPU, after its CHW permute.
        want = frames.permute(0, 1, 4, 2, 3).type(torch.float32) / 255
        got = to_lerobot_layout(frames)
        self.assertEqual((got.dtype, tuple(got.shape)), (torch.float32, (2, 2, 3, 16, 16)))
        self.assertTrue(got.is_contiguous())
        self.assertTrue(torch.equal(got, want))
        # The lookup other devices use, run here on the CPU; and on a GPU where there is one.
        self.assertTrue(torch.equal(lake_client._unit_lookup(frames), want))
        self.assertTrue(torch.equal(to_lerobot_layout(frames[0, 0]), want[0, 0]), "one frame, no window: [3, H, W]")
        if torch.cuda.is_available():
            on_gpu = to_lerobot_layout(frames.to("cuda"))
            self.assertEqual(on_gpu.device.type, "cuda")
            self.assertTrue(torch.equal(on_gpu.cpu(), want))
        with self.assertRaises(TypeError):
            to_lerobot_layout(frames.float())


@unittest.skipUnless(HAVE_TORCH, "torch is not installed")
class TorchDataset(unittest.TestCase):
    def make(self, location=LOCATION, **kw):
        from lake_client import LakeIterableDataset

        args = dict(datasets=[DATASET], preset="none", batch_size=40, seed=5, epochs=1, token=TOKEN, rank=0, world_size=1)
        args.update(kw)
        return LakeIterableDataset(location, **args)

    def test_datasets_take_one_name_or_a_list_and_refuse_a_whole_request(self):
        self.assertEqual([b["index"].tolist() for b in self.make(datasets=DATASET)], [b["index"].tolist() for b in self.make()])
        with self.assertRaises(TypeError) as refused:
            self.make(datasets={"datasets": [DATASET], "batch_size": 4})
        self.assertIn("keyword arguments", str(refused.exception))
        with self.assertRaises(ValueError):
            self.make(datasets=[])

    def test_request_cursor_fields_start_the_cursor_and_owned_fields_are_refused(self):
        whole = [b["index"].tolist() for b in self.make()]
        started = self.make(start_step=3)
        self.assertEqual([b["index"].tolist() for b in started], whole[3:])
        self.assertEqual(started.state_dict()["epoch"], 1)
        for field in ("limit_batches", "step_stride"):
            with self.assertRaises(ValueError) as refused:
                from lake_client import LakeIterableDataset

                LakeIterableDataset(LOCATION, [DATASET], **{field: 1})
            self.assertIn(field, str(refused.exception))

    def test_resume_from_state_dict_replays_exactly(self):
        whole = [b["index"].tolist() for b in self.make()]
        first = self.make()
        seen = []
        for i, b in enumerate(first):
            seen.append(b["index"].tolist())
            if i == 4:
                break
        state = first.state_dict()
        self.assertEqual(state["datasets"], [f"{DATASET}@1"], "the versions read are saved")
        pinned = self.make()
        self.assertEqual(pinned.pin(), [f"{DATASET}@1"], "pinned before any batch")
        self.assertEqual(pinned.state_dict()["datasets"], [f"{DATASET}@1"])
        rest = self.make()
        rest.load_state_dict(state)
        with self.assertRaises(ValueError):
            self.make(datasets=["another"]).load_state_dict(state)
        # A request whose sample order differs is refused, naming the field.
        for field, value, says in [("episodes", [0, 1], "episodes [0, 1] differs from the saved all"),
                                   ("drop_last", False, "drop_last False differs from the saved True"),
                                   ("shuffle", False, "shuffle False differs from the saved True"),
                                   ("drop_n_first_frames", 2, "drop_n_first_frames 2 differs")]:
            with self.assertRaises(ValueError) as refused:
                self.make(**{field: value}).load_state_dict(state)
            self.assertIn(says, str(refused.exception))
        seen += [b["index"].tolist() for b in rest]
        self.assertEqual(seen, whole)
        # A cursor past the epoch's steps (another batch size, say) is refused, not an empty run.
        past = self.make()
        past.load_state_dict({**state, "step": 10_000})
        with self.assertRaisesRegex(ValueError, "an epoch of this request has"):
            next(iter(past))
        if LOCAL:
            self.assertEqual([b["index"].tolist() for b in self.make(local=LOCAL)], whole)
            self.assertEqual([b["index"].tolist() for b in self.make(location=None, local=LOCAL)], whole)
        frames = next(iter(self.make()))["observation.images.front"]
        self.assertEqual(frames.dtype, torch.uint8)
        self.assertEqual(tuple(frames.shape[1:]), (480, 640, 3))

    def test_ranks_agree_on_the_versions_read(self):
        # Two ranks in a real gloo group; rank 1's server answers as if a version 0 were the
        # latest (an ingest between the ranks' starts): both read rank 0's.
        import socket as sockets

        import torch.multiprocessing as mp

        with sockets.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        ctx = mp.get_context("spawn")
        results = ctx.Queue()
        procs = [ctx.Process(target=_rank_main, args=(r, port, LOCATION, TOKEN, DATASET, results)) for r in range(2)]
        for p in procs:
            p.start()
        got = dict(results.get(timeout=120) for _ in procs)
        for p in procs:
            p.join(timeout=60)
            self.assertEqual(p.exitcode, 0)
        self.assertEqual(got, {0: [f"{DATASET}@1"], 1: [f"{DATASET}@1"]})

    def test_dataloader_workers_yield_the_single_process_sequence(self):
        from torch.utils.data import DataLoader

        whole = [b["index"].tolist() for b in self.make()]
        for workers in (2, 3):
            got = [b["index"].tolist() for b in DataLoader(self.make(), batch_size=None, **workers_of(workers))]
            self.assertEqual(got, whole, f"{workers} workers")
        samples = [i for b in whole for i in b]
        self.assertEqual(len(samples), len(set(samples)), "no batch twice")

    def test_worker_errors_keep_their_code_and_persistent_workers_are_not_reread(self):
        from torch.utils.data import DataLoader

        # A worker's refusal reaches the training loop as a LakeError with its code.
        with self.assertRaises(LakeError) as refused:
            next(iter(DataLoader(self.make(datasets="no-such-dataset"), batch_size=None, **workers_of(2))))
        self.assertEqual(refused.exception.code, "not_found", str(refused.exception))
        # Iterated again after a break, a DataLoader with persistent workers would skip the
        # batches its workers had made ahead: refused, not skipped.
        loader = DataLoader(self.make(), batch_size=None, persistent_workers=True, **workers_of(2))
        for i, _ in enumerate(loader):
            if i == 1:
                break
        with self.assertRaises(RuntimeError) as again:
            next(iter(loader))
        self.assertIn("iterated before and left unfinished", str(again.exception))

    def test_a_single_process_state_resumes_under_workers_across_epochs(self):
        from torch.utils.data import DataLoader

        # 15 steps an epoch; the resume at step 11 crosses into epoch 1 with 3 workers taking turns.
        whole = [b["index"].tolist() for b in self.make(epochs=2)]
        self.assertEqual(len(whole), 30)
        first = self.make(epochs=2)
        for i, _ in enumerate(first):
            if i == 10:
                break
        state = first.state_dict()
        self.assertEqual((state["epoch"], state["step"]), (0, 11))
        rest = self.make(epochs=2)
        rest.load_state_dict(state)
        got = [b["index"].tolist() for b in DataLoader(rest, batch_size=None, **workers_of(3))]
        self.assertEqual(got, whole[11:])

    def test_a_plain_dataloader_with_workers_checkpoints_after_a_batch(self):
        # The main process's copy of the dataset checkpoints from the batches the workers made:
        # 15 steps an epoch; cut after 17 batches (into epoch 1), resumed with other workers.
        from torch.utils.data import DataLoader

        whole = [b["index"].tolist() for b in self.make(epochs=2)]
        ds = self.make(epochs=2)
        self.assertEqual(ds.pin(), [f"{DATASET}@1"])
        got, state = [], None
        for b in DataLoader(ds, batch_size=None, **workers_of(3)):
            got.append(b["index"].tolist())
            self.assertEqual(b["lake.cursor"].tolist(), list(divmod(len(got), 15)))
            if len(got) == 17:
                state = ds.state_dict(after=b)
                break
        self.assertEqual((state["epoch"], state["step"], state["datasets"]), (1, 2, [f"{DATASET}@1"]))
        self.assertNotIn("workers", state)
        rest = self.make(epochs=2)
        rest.load_state_dict(state)
        got += [b["index"].tolist() for b in DataLoader(rest, batch_size=None, **workers_of(2))]
        self.assertEqual(got, whole)
        with self.assertRaises(ValueError):
            ds.state_dict(after={"index": b["index"]})
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loose = self.make().state_dict(after=b)
        self.assertTrue(any("pin()" in str(w.message) for w in caught), [str(w.message) for w in caught])
        # Such a state names no versions: its resume pins them on its first batch, as a fresh
        # dataset does, instead of taking the bare names as pinned.
        self.assertEqual(loose["datasets"], [DATASET])
        resumed = self.make(epochs=2)
        resumed.load_state_dict(loose)
        self.assertEqual(resumed.pin(), [f"{DATASET}@1"])

    def test_each_worker_resumes_its_own_stride(self):
        # As torchdata's StatefulDataLoader does it: each worker's state_dict() after each batch
        # it makes, and load_state_dict() of it in the same worker of a new loader.
        from torch.utils.data import DataLoader

        whole = [b["index"].tolist() for b in self.make()]
        run = list(DataLoader(_WithWorkerState(self.make()), batch_size=None, **workers_of(2)))
        self.assertEqual([indices for indices, _ in run], whole)
        # Cut after 6 batches (3 from each worker; the round robin goes on with worker 0).
        states = {}
        for _, state in run[:6]:
            states[state["worker"]] = state
        self.assertEqual({w: (s["epoch"], s["step"], s["workers"]) for w, s in states.items()},
                         {0: (0, 6, 2), 1: (0, 7, 2)})
        loader = DataLoader(self.make(), batch_size=None, **workers_of(2, states))
        self.assertEqual([b["index"].tolist() for b in loader], whole[6:])
        with self.assertRaises(ValueError):
            self.make().load_state_dict(states[0])  # a worker's state, outside its worker

    def test_worker_cursor_splits_the_steps_left(self):
        from lake_client import worker_cursor

        # 15 steps an epoch, 2 epochs, from step 11 of epoch 0: 19 steps for 3 workers.
        self.assertEqual([worker_cursor(0, 11, w, 3, 15, 2) for w in range(3)], [(0, 11, 7), (0, 12, 6), (0, 13, 6)])
        self.assertEqual(worker_cursor(0, 14, 1, 2, 15), (1, 0, None), "epochs wrap; no limit without epochs")
        self.assertEqual([worker_cursor(0, 14, w, 3, 15, 1) for w in range(3)], [(0, 14, 1), (1, 0, 0), (1, 1, 0)])
        self.assertEqual(worker_cursor(1, 0, 0, 2, 15, 1), (1, 0, 0))
        # Each worker's steps, from its start on by its stride, are the steps left, once each.
        for start, workers in ((0, 2), (7, 3), (14, 4), (29, 2)):
            steps = []
            for w in range(workers):
                epoch, step, limit = worker_cursor(*divmod(start, 15), w, workers, 15, 2)
                steps += [epoch * 15 + step + k * workers for k in range(limit)]
            self.assertEqual(sorted(steps), list(range(start, 30)), (start, workers))

    def test_worker_states_in_one_process(self):
        # Two workers simulated in this process (torch's worker info set by hand): each worker's
        # state resumes its stride, and worker 0 warns that the main process's state stays put.
        import torch.utils.data._utils.worker as torch_worker
        from torch.utils.data._utils.worker import WorkerInfo

        import lake_client

        whole = [b["index"].tolist() for b in self.make()]

        def as_worker(w, ds, batches=None, state=None):
            torch_worker._worker_info = WorkerInfo(id=w, num_workers=2, seed=0, dataset=ds)
            try:
                if state is not None:
                    ds.load_state_dict(state)
                out = []
                for b in ds:
                    out.append(b["index"].tolist())
                    if len(out) == batches:
                        break
                return out, ds.state_dict()
            finally:
                torch_worker._worker_info = None

        lake_client._WARNED_WORKER_STATE = False
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            a, state_a = as_worker(0, self.make(), batches=2)
            b, state_b = as_worker(1, self.make(), batches=3)
            as_worker(0, self.make(), batches=1)
        warned = [str(w.message) for w in caught if "runs in 2 DataLoader worker" in str(w.message)]
        self.assertEqual(len(warned), 1, warned)
        self.assertIn("StatefulDataLoader", warned[0])
        self.assertEqual((a, b), ([whole[0], whole[2]], [whole[1], whole[3], whole[5]]))
        self.assertEqual((state_a["worker"], state_a["step"], state_b["worker"], state_b["step"]), (0, 4, 1, 7))
        a2, _ = as_worker(0, self.make(), state=state_a)
        b2, _ = as_worker(1, self.make(), state=state_b)
        self.assertEqual(a2, whole[4::2])
        self.assertEqual(b2, whole[7::2])
        with self.assertRaises(ValueError):
            as_worker(1, self.make(), state=state_a)  # worker 0's state in worker 1

    def test_yuv_batches_become_the_rgb_batches_with_frames_to_rgb(self):
        rgb = list(self.make(preset="act"))
        yuv = list(self.make(preset="act", frame_format="yuv420p"))
        self.assertEqual(len(yuv), len(rgb))
        for planes, frames in zip(yuv, rgb):
            self.assertIn(FRAMES_KEY, planes)
            frames_to_rgb(planes, device="cpu")
            self.assertEqual(sorted(planes), sorted(frames))
            for key, value in frames.items():
                if isinstance(value, list):
                    self.assertEqual(planes[key], value, key)
                else:
                    self.assertTrue(torch.equal(planes[key], value), key)

    def test_an_unshuffled_stream_gives_the_steps_as_recorded_every_epoch(self):
        shuffled = [i for b in self.make(drop_last=False) for i in b["index"].tolist()]
        self.assertNotEqual(shuffled, sorted(shuffled))
        in_order = self.make(shuffle=False, drop_last=False, epochs=2, batch_size=7)
        batches = [b["index"].tolist() for b in in_order]
        steps = [i for b in batches for i in b]
        self.assertEqual(steps[:len(shuffled)], sorted(shuffled), "the first epoch: every step once, as recorded")
        self.assertEqual(steps[len(shuffled):], sorted(shuffled), "the next epoch the same")
        self.assertEqual(len(self.make(shuffle=False, drop_last=False, epochs=2, batch_size=7)), len(batches))
        # Two ranks take their slices of each global batch in order, the last one short.
        ranks = [[i for b in self.make(shuffle=False, drop_last=False, batch_size=4, rank=r, world_size=2) for i in
                  b["index"].tolist()] for r in range(2)]
        self.assertEqual(sorted(ranks[0] + ranks[1]), sorted(shuffled))
        self.assertEqual(ranks[0][:4] + ranks[1][:4], sorted(shuffled)[:8])
        # A weight mixes datasets in a shuffle: refused in order, naming the field.
        with self.assertRaises(Exception) as refused:
            list(self.make(datasets=[f"{DATASET}=2"], shuffle=False))
        self.assertIn("with `shuffle: false` each dataset's steps are read once", str(refused.exception))

    def test_unknown_keyword_arguments_are_refused_when_the_dataset_is_made(self):
        # Nothing listens there: the refusal comes from the constructor, not the server.
        nowhere = "grpc://127.0.0.1:1"
        with self.assertRaises(TypeError) as refused:
            self.make(location=nowhere, num_workers=2)
        said = str(refused.exception)
        for says in ("unexpected keyword argument 'num_workers'", "DataLoader's argument", "episodes", "drop_last",
                     "shuffle", "frame_layout"):
            self.assertIn(says, said)
        with self.assertRaises(TypeError) as refused:
            self.make(location=nowhere, drop_lsat=False, batchsize=4)
        said = str(refused.exception)
        self.assertIn("arguments 'drop_lsat' (did you mean 'drop_last'?), 'batchsize' (did you mean 'batch_size'?)", said)
        with self.assertRaisesRegex(ValueError, r"frame_layout 'LeRobot' is not one of .*did you mean 'lerobot'"):
            self.make(location=nowhere, frame_layout="LeRobot")
        with self.assertRaisesRegex(ValueError, r'frame_format="packets" sends compressed GOPs .*lake train --decode cpu'):
            self.make(location=nowhere, frame_format="packets")
        # Every valid keyword is taken without a word from the server.
        self.make(location=nowhere, shuffle=False, episodes=[0], drop_last=False, drop_n_first_frames=1, drop_n_last_frames=1,
                  frame_size=None, frame_format="yuv420p", proxy=False, epoch=0, start_step=0, frame_layout="lerobot")

    def test_none_is_unset(self):
        whole = [b["index"].tolist() for b in self.make()]
        unset = self.make(episodes=None, drop_last=None, drop_n_first_frames=None, drop_n_last_frames=None, frame_size=None,
                          frame_format=None, proxy=None, epoch=None, start_step=None, limit_batches=None, step_stride=None,
                          preset=None, delta_timestamps=None, frame_layout=None)
        self.assertEqual([b["index"].tolist() for b in unset], whole)
        self.assertEqual(unset.state_dict()["order"], self.make().state_dict()["order"])
        with self.assertRaisesRegex(ValueError, r"episodes=\[\] selects no episode"):
            self.make(episodes=[])
        for field in ("seed", "batch_size"):
            with self.assertRaisesRegex(TypeError, f"{field} must be a whole number, not None"):
                self.make(**{field: None})

    def test_len_is_the_batches_iteration_yields(self):
        ds = self.make()
        self.assertEqual(len(ds), 15)
        self.assertEqual(len(list(ds)), 15)
        self.assertEqual(len(ds), 0, "the cursor is at the end")
        self.assertEqual(list(ds), [])
        started = self.make(epochs=2, start_step=3)
        self.assertEqual(len(started), 27)
        self.assertEqual(len(list(started)), 27)
        # A DataLoader over it has the same length (what tqdm shows), with workers too.
        from torch.utils.data import DataLoader

        loader = DataLoader(self.make(epochs=2), batch_size=None, **workers_of(2))
        self.assertEqual(len(loader), 30)
        self.assertEqual(len(list(loader)), 30)
        endless = self.make(epochs=None)
        self.assertTrue(endless)
        with self.assertRaises(TypeError) as refused:
            len(endless)
        self.assertIn("endless", str(refused.exception))
        self.assertIn("epochs=N", str(refused.exception))
        self.assertEqual(len(self.make(epochs=0)), 0)

    def test_len_counts_a_ranks_empty_batches_and_each_workers_share(self):
        # Without drop_last, an epoch's last global batch is short; a rank whose slice of it is
        # empty still gets a batch there (of 0 rows): len() counts it, as the server sends it.
        epoch_len = LakeClient(LOCATION, TOKEN).info({"datasets": [DATASET]})["epoch_len"]
        size = next(b for b in range(25, epoch_len) if 0 < epoch_len % (3 * b) <= b)
        rows = 0
        for rank in range(3):
            ds = self.make(batch_size=size, rank=rank, world_size=3, drop_last=False, epochs=2)
            self.assertEqual(len(ds), 2 * -(-epoch_len // (3 * size)))
            batches = list(ds)
            self.assertEqual(len(batches), 2 * -(-epoch_len // (3 * size)), f"rank {rank}")
            empty = [b for b in batches if len(b["index"]) == 0]
            self.assertEqual(len(empty), 0 if rank == 0 else 2, f"rank {rank}")
            rows += sum(len(b["index"]) for b in batches)
        self.assertEqual(rows, 2 * epoch_len)
        with_drop = self.make(batch_size=size, rank=2, world_size=3, epochs=1)
        self.assertEqual(len(with_drop), epoch_len // (3 * size))
        # In a DataLoader worker, len() is that worker's share: what it yields (simulated here).
        import torch.utils.data._utils.worker as torch_worker
        from torch.utils.data._utils.worker import WorkerInfo

        shares = []
        for w in range(3):
            ds = self.make(epochs=2, start_step=4)
            torch_worker._worker_info = WorkerInfo(id=w, num_workers=3, seed=0, dataset=ds)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    share = len(ds)
                    self.assertEqual(share, len(list(ds)), f"worker {w}")
            finally:
                torch_worker._worker_info = None
            shares.append(share)
        self.assertEqual(shares, [9, 9, 8])

    def test_len_asks_the_server_once_the_versions_are_pinned(self):
        ds = self.make(epochs=3)
        asked = []
        planned = LakeClient.info

        def counted(client, request):
            asked.append(request)
            return planned(client, request)

        LakeClient.info = counted
        try:
            self.assertEqual(len(ds), 45)
            self.assertEqual(len(ds), 45)
            self.assertEqual(len(asked), 2, "not pinned: the latest versions' shape each time")
            ds.pin()
            del asked[:]
            self.assertEqual(len(ds), 45)
            self.assertEqual(asked, [], "pinned: the shape pin() was told")
            ds.load_state_dict({**ds.state_dict(), "epoch": 1, "step": 5})
            self.assertEqual(len(ds), 25)
        finally:
            LakeClient.info = planned

    def test_lerobot_layout_is_float_chw_over_255_with_the_window_first(self):
        for preset, window in (("act", None), ("diffusion", 2)):
            frames = next(iter(self.make(preset=preset, batch_size=16, start_step=7)))
            lerobot = next(iter(self.make(preset=preset, batch_size=16, start_step=7, frame_layout="lerobot")))
            self.assertEqual(sorted(frames), sorted(lerobot))
            cameras = [k for k, v in frames.items() if isinstance(v, torch.Tensor) and v.dtype == torch.uint8]
            self.assertTrue(cameras, preset)
            for key, value in frames.items():
                if key not in cameras:
                    self.assertTrue(value == lerobot[key] if isinstance(value, list) else torch.equal(value, lerobot[key]), key)
                    continue
                got = lerobot[key]
                lead = (16,) if window is None else (16, window)
                h, w = value.shape[-3:-1]
                self.assertEqual((got.dtype, tuple(got.shape)), (torch.float32, lead + (3, h, w)), f"{preset} {key}")
                self.assertEqual(tuple(value.shape), lead + (h, w, 3))
                self.assertTrue(got.is_contiguous())
                # LeRobot's arithmetic (`frames.type(torch.float32) / 255` on the CPU), and numpy's.
                self.assertTrue(torch.equal(got, torch.movedim(value, -1, -3).type(torch.float32) / 255), key)
                want = np.moveaxis(value.numpy(), -1, -3).astype(np.float32) / np.float32(255)
                self.assertEqual(got.numpy().tobytes(), np.ascontiguousarray(want).tobytes(), key)
                self.assertTrue(torch.equal(got[0, ..., 0, 0], value[0, ..., 0, 0, :].type(torch.float32) / 255))

    def test_lerobot_layout_of_yuv_frames_after_their_conversion(self):
        rgb = next(iter(self.make(preset="diffusion", frame_layout="lerobot", start_step=2)))
        planes = next(iter(self.make(preset="diffusion", frame_layout="lerobot", frame_format="yuv420p", start_step=2)))
        cameras = list(planes[FRAMES_KEY])
        self.assertTrue(cameras)
        self.assertTrue(all(planes[k].dtype == torch.uint8 for k in cameras), "planes stay bytes until converted")
        devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
        for device in devices:
            batch = dict(planes, **{FRAMES_KEY: {k: dict(v) for k, v in planes[FRAMES_KEY].items()}})
            frames_to_rgb(batch, device=device)
            for key in cameras:
                self.assertEqual(batch[key].device.type, device)
                self.assertEqual(batch[key].dtype, torch.float32)
                self.assertTrue(torch.equal(batch[key].cpu(), rgb[key]), f"{key} on {device}")
        # A plain client's numpy batch, asked for the layout, and a dataset's batch asked for bytes.
        (batch,) = LakeClient(LOCATION, TOKEN).batches({"datasets": [DATASET], "preset": "diffusion", "batch_size": 40,
                                                        "seed": 5, "start_step": 2, "limit_batches": 1,
                                                        "frame_format": "yuv420p"})
        columns = frames_to_rgb(batch_to_numpy(batch), frame_layout="lerobot")
        for key in cameras:
            self.assertEqual(columns[key].tobytes(), rgb[key].numpy().tobytes(), key)
        batch = dict(planes, **{FRAMES_KEY: {k: dict(v) for k, v in planes[FRAMES_KEY].items()}})
        frames_to_rgb(batch, frame_layout="uint8_hwc")
        for key in cameras:
            self.assertEqual(batch[key].dtype, torch.uint8)
            self.assertTrue(torch.equal(to_lerobot_layout(batch[key]), rgb[key]))

    def test_ranks_split_each_global_batch(self):
        whole = [b["index"].tolist() for b in self.make()]
        halves = [[b["index"].tolist() for b in self.make(batch_size=20, rank=r, world_size=2)] for r in range(2)]
        for step, batch in enumerate(whole):
            self.assertEqual(sorted(halves[0][step] + halves[1][step]), sorted(batch))
            self.assertFalse(set(halves[0][step]) & set(halves[1][step]))


class _WithWorkerState(torch.utils.data.IterableDataset if HAVE_TORCH else object):
    """Each batch's indices with the dataset's state_dict() right after it, taken in the worker
    that made it (as StatefulDataLoader takes it)."""

    def __init__(self, ds):
        super().__init__()
        self.ds = ds

    def __iter__(self):
        for b in self.ds:
            yield b["index"].tolist(), self.ds.state_dict()


def workers_of(n, states=None):
    """DataLoader arguments for `n` workers. They start from a fork server, not by forking this
    process: a gRPC client (Flight) used here before a fork can hang in the child."""
    return dict(num_workers=n, multiprocessing_context="forkserver", worker_init_fn=_WorkerInit(states))


class _WorkerInit:
    """A worker_init_fn: silences the workers' warning about state_dict (these tests know), and
    loads each worker's own saved state, if any, into its copy of the dataset."""

    def __init__(self, states=None):
        self.states = states

    def __call__(self, worker):
        warnings.filterwarnings("ignore", message="LakeIterableDataset runs in")
        if self.states is not None:
            torch.utils.data.get_worker_info().dataset.load_state_dict(self.states[worker])


def _rank_main(rank, port, location, token, dataset, results):
    import torch.distributed as dist

    import lake_client

    if rank == 1:
        planned = lake_client.LakeClient.info

        def stale(self, request):
            info = planned(self, request)
            if "@" not in str(request["datasets"]):
                info["datasets"] = [f"{dataset}@0"]
            return info

        lake_client.LakeClient.info = stale
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        ds = lake_client.LakeIterableDataset(location, datasets=[dataset], preset="none", batch_size=10, seed=5, token=token)
        next(iter(ds))
        results.put((rank, ds.state_dict()["datasets"]))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    unittest.main()

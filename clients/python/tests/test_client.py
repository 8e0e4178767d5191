"""The Python client against a running `lake serve` (started by lake's integration tests, which
set LAKE_FLIGHT, LAKE_LOCAL, LAKE_TOKEN, LAKE_DATASET and LAKE_REFERENCE_DIR).

A full epoch read through the client holds every step once, and its samples equal LeRobot's own
reference dumps (every value bit for bit, every frame's SHA-256); the torch dataset resumes
exactly from its state_dict and splits ranks disjointly (skipped without torch).
"""

import hashlib
import os
import threading
import unittest
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from lake_client import LakeClient, LakeError, LocalClient, batch_to_numpy

try:
    import torch  # noqa: F401

    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False

LOCATION = os.environ.get("LAKE_FLIGHT", "grpc://127.0.0.1:50051")
LOCAL = os.environ.get("LAKE_LOCAL")
TOKEN = os.environ.get("LAKE_TOKEN")
DATASET = os.environ.get("LAKE_DATASET", "v30-av1-small")
REFERENCE_DIR = os.environ.get("LAKE_REFERENCE_DIR", "")


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
                elif key in columns and ref.schema.field(key).type in (pa.list_(pa.float32()), pa.list_(pa.bool_())):
                    want = np.asarray(value).ravel()
                    got = np.asarray(columns[key][r]).ravel()
                    self.assertEqual(got.astype(want.dtype).tobytes(), want.tobytes(), key)
            checked += 1
        self.assertGreater(checked, 0)

    def test_none_preset_epoch_matches_reference(self):
        self.check_preset("none")

    def test_act_preset_epoch_matches_reference(self):
        self.check_preset("act")

    def test_datasets_are_listed(self):
        self.assertIn(DATASET, [d["name"].split("@")[0] for d in self.client.datasets()])


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


@unittest.skipUnless(HAVE_TORCH, "torch is not installed")
class TorchDataset(unittest.TestCase):
    def make(self, location=LOCATION, **kw):
        from lake_client import LakeIterableDataset

        args = dict(datasets=[DATASET], preset="none", batch_size=40, seed=5, epochs=1, token=TOKEN, rank=0, world_size=1)
        args.update(kw)
        return LakeIterableDataset(location, **args)

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
        rest = self.make()
        rest.load_state_dict(state)
        with self.assertRaises(ValueError):
            self.make(datasets=["another"]).load_state_dict(state)
        seen += [b["index"].tolist() for b in rest]
        self.assertEqual(seen, whole)
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

    def test_ranks_split_each_global_batch(self):
        whole = [b["index"].tolist() for b in self.make()]
        halves = [[b["index"].tolist() for b in self.make(batch_size=20, rank=r, world_size=2)] for r in range(2)]
        for step, batch in enumerate(whole):
            self.assertEqual(sorted(halves[0][step] + halves[1][step]), sorted(batch))
            self.assertFalse(set(halves[0][step]) & set(halves[1][step]))


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

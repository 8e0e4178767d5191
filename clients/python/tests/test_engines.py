"""A lake's tables read by other engines: pylance, and through Arrow DuckDB and Polars.

The tests ingest the bundled sample testdata/lerobot/v30-av1-small into a temporary lake with the
lake binary at `$LAKE_BIN` (default: the debug build, `${CARGO_TARGET_DIR:-~/.cache/lake/target}/debug/lake`),
find the version's tables from `lake inspect --json` (`record.tables`: the directory, relative to the
lake root, holding `<table>.lance`) and compare with what `lake sql` answers over the same lake:

- pylance opens the steps table with the commit record's and `lake sql`'s row count, and its
  columns are `lake sql`'s once each one's `lake:name` metadata (LeRobot's key, where Lance's
  column name has `/` for `.`) is applied; vector features are fixed-size lists of info.json's shape;
- per episode, the step count and `action[0]`'s minimum, maximum and mean from DuckDB (over the
  pylance dataset, an Arrow dataset) and from Polars (`pl.scan_lance`, and `pl.from_arrow` of a
  pylance table) equal `lake sql`'s: counts, minima and maxima exactly, means to 1e-12 (the
  engines add in different orders), and a DuckDB count with a `WHERE` (which DuckDB passes into
  the Lance scan) is the episode's step count;
- the episodes table read with pylance equals `lake sql`'s and its lengths are the step counts;
- the packets table's bytes read with pylance have the CRC-32 ingest stored beside them, and its
  rows per camera are `lake sql`'s.

The packages are scripts/python-env.sh's (pinned there); without them, or without the lake binary,
the tests fail saying so. Run: `"$(scripts/python-env.sh)" clients/python/tests/test_engines.py`.
"""

import json
import math
import os
import shutil
import tempfile
import unittest
import zlib

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SAMPLE = os.path.join(REPO, "testdata", "lerobot", "v30-av1-small")
NAME = "v30-av1-small"

try:
    import duckdb
    import lance
    import numpy as np
    import polars as pl
    import pyarrow as pa
except ImportError as e:
    raise SystemExit(f"test_engines: {e}: run it with scripts/python-env.sh's python, which has pylance, duckdb and polars")


from lake_binary import lake as lake_at, lake_sql as sql_at, missing

# The lake every test reads: set by setUpModule.
LAKE = {}


def lake(*args):
    return lake_at(LAKE["root"], *args)


def lake_sql(query):
    return sql_at(LAKE["root"], query)


def table_path(table):
    tables = LAKE["record"]["tables"]
    if table not in tables["tables"]:
        raise AssertionError(f"the commit record names no {table} table: {tables}")
    return os.path.join(LAKE["root"], tables["dir"], f"{table}.lance")


def setUpModule():
    if missing():
        raise RuntimeError(missing())
    tmp = tempfile.mkdtemp(prefix="lake-engines-test-")
    LAKE.update(tmp=tmp, root=os.path.join(tmp, "lake"))
    lake("ingest", SAMPLE)
    LAKE["record"] = json.loads(lake("inspect", NAME, "--json"))["record"]


def tearDownModule():
    if "tmp" in LAKE:
        shutil.rmtree(LAKE["tmp"], ignore_errors=True)


def per_episode_from_lake():
    """Per episode: steps, and action[0]'s minimum, maximum and mean, as `lake sql` gives them."""
    rows = lake_sql(
        f'SELECT episode_index, count(*) AS steps, min(action[1]) AS lo, max(action[1]) AS hi, avg(action[1]) AS mean '
        f'FROM "{NAME}".steps GROUP BY episode_index ORDER BY episode_index'
    )
    return [(r["episode_index"], r["steps"], r["lo"], r["hi"], r["mean"]) for r in rows]


class EnginesAgreeWithLakeSql(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.steps = lance.dataset(table_path("steps"))
        cls.expected = per_episode_from_lake()

    def assert_per_episode(self, got, engine):
        want = self.expected
        self.assertEqual([g[0] for g in got], [w[0] for w in want], f"{engine}: episodes")
        self.assertGreater(len(want), 1, "the sample has several episodes")
        for (episode, steps, lo, hi, mean), (_, want_steps, want_lo, want_hi, want_mean) in zip(got, want):
            self.assertEqual(steps, want_steps, f"{engine}: steps of episode {episode}")
            # lake sql prints float32 extremes as the shortest text that reads back as the same float32.
            self.assertEqual(np.float32(lo), np.float32(want_lo), f"{engine}: min(action[0]) of episode {episode}")
            self.assertEqual(np.float32(hi), np.float32(want_hi), f"{engine}: max(action[0]) of episode {episode}")
            self.assertTrue(
                math.isclose(mean, want_mean, rel_tol=1e-12, abs_tol=1e-12),
                f"{engine}: mean(action[0]) of episode {episode} is {mean!r}, lake sql says {want_mean!r}",
            )

    def test_steps_rows_and_columns(self):
        ds = self.steps
        rows = lake_sql(f'SELECT count(*) AS n FROM "{NAME}".steps')[0]["n"]
        self.assertEqual(ds.count_rows(), rows, "pylance's rows against lake sql's")
        self.assertEqual(rows, LAKE["record"]["counts"]["steps"], "lake sql's rows against the commit record's")
        described = [r["column_name"] for r in lake_sql(f'DESCRIBE "{NAME}".steps')]
        names = [(f.metadata or {}).get(b"lake:name", f.name.encode()).decode() for f in ds.schema]
        self.assertEqual(names, described, "the Lance columns (by lake:name) against lake sql's")
        for key, feature in LAKE["record"]["info"]["features"].items():
            shape = feature["shape"]
            if feature["dtype"] == "float32" and len(shape) == 1 and shape[0] > 1:
                field = ds.schema.field(key.replace(".", "/"))
                self.assertEqual(field.type, pa.list_(pa.float32(), shape[0]), key)

    def test_duckdb_over_the_arrow_dataset(self):
        con = duckdb.connect()
        con.register("steps", self.steps)
        got = con.sql(
            'SELECT episode_index, count(*), min(action[1]), max(action[1]), avg(action[1]) '
            'FROM steps GROUP BY episode_index ORDER BY episode_index'
        ).fetchall()
        self.assert_per_episode(got, "duckdb")
        episode = self.expected[-1][0]
        [(n,)] = con.sql(f"SELECT count(*) FROM steps WHERE episode_index = {episode}").fetchall()
        self.assertEqual(n, self.expected[-1][1], "duckdb with a filter pushed into the Lance scan")

    def per_episode_polars(self, frame, engine):
        action0 = pl.col("action").arr.get(0)
        got = (
            frame.group_by("episode_index")
            .agg(pl.len(), action0.min().alias("lo"), action0.max().alias("hi"), action0.cast(pl.Float64).mean().alias("mean"))
            .sort("episode_index")
        )
        if isinstance(got, pl.LazyFrame):
            got = got.collect()
        self.assert_per_episode(got.rows(), engine)

    def test_polars_scan_lance(self):
        self.per_episode_polars(pl.scan_lance(table_path("steps")), "polars scan_lance")

    def test_polars_from_arrow(self):
        table = self.steps.to_table(columns=["episode_index", "action"])
        self.per_episode_polars(pl.from_arrow(table), "polars from_arrow")

    def test_episodes_table(self):
        columns = ["episode_index", "length", "dataset_from_index", "dataset_to_index"]
        got = lance.dataset(table_path("episodes")).to_table(columns=columns).sort_by("episode_index").to_pylist()
        want = lake_sql(f'SELECT {", ".join(columns)} FROM "{NAME}".episodes ORDER BY episode_index')
        self.assertEqual(got, want, "episodes read with pylance against lake sql's")
        self.assertEqual(len(got), LAKE["record"]["counts"]["episodes"])
        self.assertEqual([(e["episode_index"], e["length"]) for e in got], [(e[0], e[1]) for e in self.expected], "episode lengths against step counts")

    def test_packets_bytes(self):
        packets = lance.dataset(table_path("packets"))
        per_camera = {}
        for batch in packets.to_batches(columns=["camera", "data", "data_crc32"]):
            for camera, data, crc in zip(*(batch.column(c).to_pylist() for c in ("camera", "data", "data_crc32"))):
                self.assertEqual(zlib.crc32(data), crc, f"a {camera} packet's bytes against its CRC-32")
                per_camera[camera] = per_camera.get(camera, 0) + 1
        want = lake_sql(f'SELECT camera, count(*) AS n FROM "{NAME}".packets GROUP BY camera')
        self.assertEqual(per_camera, {r["camera"]: r["n"] for r in want}, "packets per camera against lake sql's")
        self.assertEqual(sum(per_camera.values()), LAKE["record"]["counts"]["packets"])


if __name__ == "__main__":
    unittest.main()

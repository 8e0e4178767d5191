"""Writes a LeRobot v3.0 dataset of many short episodes, for timing what scales with the episode
count (the web app's pages, the episodes table): the bundled testdata/lerobot/v30-images-tiny
without its camera, its 3 episodes repeated (re-indexed) N times over.

    python bench/many_episodes.py OUT_DIR [EPISODES]     (default 10 000; needs pyarrow)
"""

import json
import os
import shutil
import sys

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

SOURCE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "testdata", "lerobot", "v30-images-tiny")
CAMERA = "observation.images.front"


def main(out, episodes):
    data = pq.read_table(os.path.join(SOURCE, "data/chunk-000/file-000.parquet")).drop_columns([CAMERA])
    meta = pq.read_table(os.path.join(SOURCE, "meta/episodes/chunk-000/file-000.parquet"))
    meta = meta.drop_columns([c for c in meta.column_names if c.startswith(f"stats/{CAMERA}/")])
    source_episodes = meta.num_rows
    rows, metas, start = [], [], 0
    for e in range(episodes):
        s = e % source_episodes
        steps = data.filter(pc.equal(data["episode_index"], s))
        n = steps.num_rows
        steps = steps.set_column(steps.column_names.index("episode_index"), "episode_index", pa.array([e] * n, pa.int64()))
        steps = steps.set_column(steps.column_names.index("index"), "index", pa.array(range(start, start + n), pa.int64()))
        rows.append(steps)
        m = meta.slice(s, 1)
        for name, value in (("episode_index", e), ("dataset_from_index", start), ("dataset_to_index", start + n)):
            m = m.set_column(m.column_names.index(name), name, pa.array([value], pa.int64()))
        metas.append(m)
        start += n
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(os.path.join(out, "data/chunk-000"))
    os.makedirs(os.path.join(out, "meta/episodes/chunk-000"))
    pq.write_table(pa.concat_tables(rows).replace_schema_metadata(None), os.path.join(out, "data/chunk-000/file-000.parquet"))
    pq.write_table(pa.concat_tables(metas), os.path.join(out, "meta/episodes/chunk-000/file-000.parquet"))
    shutil.copy(os.path.join(SOURCE, "meta/tasks.parquet"), os.path.join(out, "meta/tasks.parquet"))
    with open(os.path.join(SOURCE, "meta/info.json")) as f:
        info = json.load(f)
    del info["features"][CAMERA]
    info.update(total_episodes=episodes, total_frames=start, splits={"train": f"0:{episodes}"})
    with open(os.path.join(out, "meta/info.json"), "w") as f:
        json.dump(info, f, indent=4)
    with open(os.path.join(SOURCE, "meta/stats.json")) as f:
        stats = json.load(f)
    stats.pop(CAMERA, None)
    with open(os.path.join(out, "meta/stats.json"), "w") as f:
        json.dump(stats, f, indent=4)
    print(f"{out}: {episodes} episodes, {start} steps")


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) == 3 else 10_000)

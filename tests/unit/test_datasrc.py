"""Training data from the controller (tfps_data_src) and the check of hand-placed data.

The assignment of files to worker hosts must be exactly what the workers read: each host
gets a directory with only its files and the job's list, and every worker's real
tf.data pipeline over that directory yields the same examples as the same worker reading
the whole data set (what `tfps local` and compose do).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tfps.cluster import datasrc
from tfps.cluster.plan import DATA_MOUNT
from tfps.cluster.variables import train_list_path
from tfps.data import dataset as data_mod
from tfps.errors import ConfigError

TFPS = Path(sys.executable).parent / "tfps"


def write_csvs(directory: Path, count: int, rows: int = 6) -> list[Path]:
    """``count`` CSV files whose rows are all different (feature f0 = file * 100 + row)."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        path = directory / f"part-{i:02d}.csv"
        path.write_text("f0,f1,label\n" + "".join(f"{i * 100 + r},{r},{r % 3}\n" for r in range(rows)))
        paths.append(path)
    return paths


def examples(pattern: str, num_shards: int, index: int) -> list[float]:
    """The f0 values one worker's pipeline yields in one pass (sorted), built as a worker does."""
    schema = data_mod.infer_schema(pattern, "label", None, "train_data", shard=(num_shards, index))
    ds = data_mod.make_dataset(schema, "label", 4, num_shards=num_shards, shard_index=index, train=False)
    return sorted(float(x) for features, _ in ds for x in features.numpy()[:, 0])


def place(assignment: dict, root: Path) -> dict[str, Path]:
    """Copy each host's files to root/<host>, as the play does, with the list pointing there."""
    dirs = {}
    for host, files in assignment["hosts"].items():
        host_dir = root / host
        for rel in files:
            (host_dir / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(Path(assignment["base"]) / rel, host_dir / rel)
        (host_dir / assignment["list"]).write_text(
            datasrc.list_text(assignment).replace(DATA_MOUNT + "/", str(host_dir) + "/"))
        dirs[host] = host_dir
    return dirs


@pytest.mark.parametrize("files,worker_hosts", [
    (5, ["h2", "h3", "h3"]),          # one host with two workers gets the union of their shards
    (4, ["h1", "h2"]),
    (7, ["h1", "h2", "h1", "h3"]),
    (2, ["h1", "h2", "h3"]),          # fewer files than workers: every worker reads every file
    (1, ["h1"]),
])
def test_each_worker_reads_from_its_host_exactly_what_it_reads_from_the_whole_data(files, worker_hosts, tmp_path):
    src = tmp_path / "controller"
    write_csvs(src, files)
    assignment = datasrc.assign(str(src), None, None, worker_hosts)
    n = len(worker_hosts)
    assert assignment["train"] == [f"{DATA_MOUNT}/part-{i:02d}.csv" for i in range(files)]
    dirs = place(assignment, tmp_path / "hosts")
    read_anywhere = []
    for index, host in enumerate(worker_hosts):
        expected = examples(str(src / "*.csv"), n, index)    # the worker with all the data
        got = examples("@" + str(dirs[host] / assignment["list"]), n, index)
        assert got == expected, (index, host)
        read_anywhere += got
    # Together the workers read every example (exactly once when sharding by file).
    everything = examples(str(src / "*.csv"), 1, 0)
    assert sorted(set(read_anywhere)) == everything
    if files >= n:
        assert sorted(read_anywhere) == everything
        # ... and a host holds only the files of its own workers.
        for host, held in assignment["hosts"].items():
            mine = [i for i, h in enumerate(worker_hosts) if h == host]
            assert held == sorted(f"part-{f:02d}.csv" for f in range(files) if f % n in mine)


def test_the_rule_is_the_one_make_dataset_uses():
    files = [f"f{i}" for i in range(7)]
    assert data_mod.shard_files(files, 3, 1) == ["f1", "f4"]
    assert data_mod.shard_files(files[:2], 3, 2) == files[:2]


def test_a_worker_missing_its_own_file_is_told_which_and_where(tmp_path):
    src = tmp_path / "controller"
    write_csvs(src, 4)
    assignment = datasrc.assign(str(src), None, None, ["h1", "h2"])
    dirs = place(assignment, tmp_path / "hosts")
    os.remove(dirs["h2"] / "part-03.csv")
    with pytest.raises(ConfigError, match=r"part-03.csv is in the list .* but not on this host"):
        data_mod.infer_schema("@" + str(dirs["h2"] / assignment["list"]), shard=(2, 1))
    # worker 0 on h1 does not need it
    assert data_mod.infer_schema("@" + str(dirs["h1"] / assignment["list"]), shard=(2, 0)).files[-1].endswith(
        "part-03.csv")


def test_a_directory_with_train_and_eval_globs(tmp_path):
    src = tmp_path / "controller"
    write_csvs(src / "train", 3)
    write_csvs(src / "eval", 1)
    (src / "README").write_text("not data")
    assignment = datasrc.assign(str(src), "/input/train/*.csv", "/input/eval/*.csv", ["h2", "h3"])
    assert assignment["hosts"] == {"h2": ["eval/part-00.csv", "train/part-00.csv", "train/part-02.csv"],
                                   "h3": ["train/part-01.csv"]}
    checked = datasrc.with_checksums(assignment)
    body = (src / "train/part-01.csv").read_bytes()
    import hashlib
    assert checked["files"]["train/part-01.csv"] == {"sha256": hashlib.sha256(body).hexdigest(), "size": len(body)}


def test_mnist_images_travel_with_their_labels(tmp_path):
    src = tmp_path / "controller"
    src.mkdir()
    for part in ("a", "b"):
        (src / f"{part}-images-idx3-ubyte").write_bytes(b"\0\0\x08\x03" + (1).to_bytes(4, "big") * 3 + b"\x01")
        (src / f"{part}-labels-idx1-ubyte").write_bytes(b"\0\0\x08\x01" + (1).to_bytes(4, "big") + b"\x01")
    assignment = datasrc.assign(str(src), None, None, ["h1", "h2"])
    assert assignment["train"] == ["/input/a-images-idx3-ubyte", "/input/b-images-idx3-ubyte"]
    assert assignment["hosts"] == {"h1": ["a-images-idx3-ubyte", "a-labels-idx1-ubyte"],
                                   "h2": ["b-images-idx3-ubyte", "b-labels-idx1-ubyte"]}


@pytest.mark.parametrize("src,train,message", [
    ("{tmp}/nowhere", None, "tfps_data_src: {tmp}/nowhere does not exist on the controller"),
    ("{tmp}/nowhere/*.csv", None, "tfps_data_src: {tmp}/nowhere (of {tmp}/nowhere/*.csv) is not a directory"),
    ("{tmp}/controller/*.npz", None, "tfps_data_src: on the controller, no files match '{tmp}/controller/*.npz'"),
    ("{tmp}/controller", "/input/x*.csv", "tfps_train_data: on the controller, no files match"),
    ("{tmp}/controller", "/data/x.csv", "tfps_train_data: /data/x.csv is not under /input"),
    ("{tmp}/controller/*.csv", "/input/x.csv", "tfps_train_data: is '/input/x.csv', but tfps_data_src"),
])
def test_bad_sources_are_refused_with_one_message(src, train, message, tmp_path):
    write_csvs(tmp_path / "controller", 2)
    with pytest.raises(ConfigError) as info:
        datasrc.assign(src.format(tmp=tmp_path), train, None, ["h1"])
    assert str(info.value).startswith(message.format(tmp=tmp_path)), str(info.value)


def test_hand_placed_data_that_differs_is_named_by_host_and_file():
    same = {"a.csv": {"size": 10, "sha256": "x"}, "b.csv": {"size": 20, "sha256": "y"}}
    assert datasrc.compare_hosts({"h2": same, "h3": dict(same)}, "/input/*.csv") == []
    problems = datasrc.compare_hosts({
        "h2": same,
        "h3": {"a.csv": {"size": 11}, "c.csv": {"size": 5}},
        "h4": {"a.csv": {"size": 10, "sha256": "z"}, "b.csv": {"size": 20, "sha256": "y"}},
    }, "/input/*.csv in tfps_data_dir")
    assert len(problems) == 2
    assert problems[0].startswith("h3: its training data (/input/*.csv in tfps_data_dir) differs from h2's: "
                                  "lacks b.csv; has c.csv that h2 has not; a.csv is 11 bytes, on h2 10")
    assert problems[1].startswith("h4: its training data (/input/*.csv in tfps_data_dir) differs from h2's: "
                                  "a.csv differs from h2's (sha256)")


def test_tfps_plan_starts_the_workers_on_the_list_of_training_files(tmp_path):
    src = tmp_path / "controller"
    write_csvs(src, 3)
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        "all:\n  vars:\n    tfps_data_src: " + str(src) + "\n    tfps_data_dir: /srv/data\n"
        "  children:\n    ps:\n      hosts:\n        h1: {ansible_host: 10.0.0.1}\n"
        "    worker:\n      hosts:\n        h2: {ansible_host: 10.0.0.2}\n        h3: {ansible_host: 10.0.0.3}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(HOME=str(tmp_path), ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-tmp"),
               ANSIBLE_CONFIG=str(tmp_path / "none.cfg"))
    proc = subprocess.run([str(TFPS), "plan", "-i", str(inventory), "--format", "json"], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    import json
    plan = json.loads(proc.stdout)
    for task in plan["tasks"]:
        assert f"--train_data=@{train_list_path('train')}" in task["argv"], task["argv"]


def test_examples_helper_sees_distinct_rows(tmp_path):
    """The comparison above is meaningful: every row of the test data is different."""
    write_csvs(tmp_path, 3)
    values = examples(str(tmp_path / "*.csv"), 1, 0)
    assert len(values) == len(set(values)) == 18 and np.isfinite(values).all()

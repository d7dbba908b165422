"""Training data on the 3-host harness: copied from the controller (tfps_data_src), or
placed by hand and checked to be the same on every worker host before anything starts."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import pytest
from plays import assert_ok, job_vars, no_containers_anywhere, play_vars, section

from tfps.models import demo

#: ps0 on host1; worker0 (the chief) on host2; worker1 and worker2 on host3.
LAYOUT = {"ps": ["host1"], "worker": {"host2": {}, "host3": {"tfps_workers": 2}}}


def controller_data(directory: Path, parts: int) -> Path:
    """The demo's blobs data (3 classes), its training rows split into ``parts`` CSV files."""
    globs = demo.ensure_demo_data(str(directory / "demo"))
    rows, header = [], None
    for path in sorted(Path(globs["blobs_train"]).parent.glob("train-*.csv")):
        lines = path.read_text().splitlines()
        header = lines[0]
        rows += lines[1:]
    src = directory / "controller-data"
    src.mkdir()
    for i in range(parts):
        (src / f"train-{i}.csv").write_text("\n".join([header, *rows[i::parts]]) + "\n")
    (src / "eval.csv").write_text(Path(globs["blobs_eval"]).read_text())
    (src / "notes.txt").write_text("not data: never copied\n")
    return src


@pytest.mark.system
@pytest.mark.timeout(1800)   # a full deploy (archive to 3 hosts, training, a second deploy)
def test_data_only_on_the_controller_trains_and_is_not_copied_again(bare_metal, image_archive, run_playbook,
                                                                      tmp_path, request):
    """tfps_data_src: each worker host gets only its workers' files (the union for host3's
    two workers), in the job's own directory there (no tfps_data_dir given), each worker
    reads exactly its shard, the job learns, and a second deploy copies nothing."""
    job = "datasrc"
    src = controller_data(tmp_path, 5)
    data_dir = f"/var/lib/tfps/{job}/data"   # tfps_data_dir's default with tfps_data_src

    def remove_job() -> None:
        # Also when an assertion failed: a job left running would take the TF ports of the
        # next test's job on the shared hosts.
        for host in bare_metal.hosts:
            for name in host.containers(f"tfps.job={job}"):
                host.sh(f"docker rm -f {name}")
            host.sh(f"rm -rf {data_dir} /srv/tfps/{job}")
    request.addfinalizer(remove_job)
    inventory = bare_metal.inventory(tmp_path / "inventory", LAYOUT, group_vars={"all": job_vars(
        job, image_archive, tfps_data_src=str(src), tfps_train_data="/input/train-*.csv",
        tfps_eval_data="/input/eval.csv", tfps_batch_size=64, tfps_remove_containers=False)})
    result = run_playbook("deploy.yml", inventory, play_vars(tmp_path, memory_check=True), timeout=1500)
    print(f"deploy with tfps_data_src (5 files to 2 worker hosts, job trained): {result.seconds:.0f} s")
    assert_ok(result, "deploy.yml")

    # worker0 reads train-0, train-3; worker1 train-1, train-4; worker2 train-2 (sorted(files)[i::3]).
    def held(host):
        code, out = bare_metal[host].sh(f"cd {data_dir} 2>/dev/null && ls -A", check=False)
        return sorted(out.split()) if code == 0 else []
    assert held("host2") == [f".tfps-{job}-train-files", "eval.csv", "train-0.csv", "train-3.csv"]
    assert held("host3") == [f".tfps-{job}-train-files", "train-1.csv", "train-2.csv", "train-4.csv"]
    assert held("host1") == []
    for host, name in (("host2", "train-3.csv"), ("host3", "train-4.csv")):
        assert bare_metal[host].sh(f"sha256sum {data_dir}/{name}")[1].split()[0] == \
            hashlib.sha256((src / name).read_bytes()).hexdigest()

    # Each worker read exactly its own files of the global list, as its log says.
    logs = tmp_path / "results" / "latest" / "logs"
    expected = {"worker0": "train-0.csv train-3.csv", "worker1": "train-1.csv train-4.csv", "worker2": "train-2.csv"}
    for task, files in expected.items():
        line = f"{task}: reads {len(files.split())} of the 5 listed training files: {files}"
        assert line in (logs / f"{task}.log").read_text(), task

    results = json.loads((tmp_path / "results" / "latest" / "results.json").read_text())
    assert results["status"] == "succeeded"
    assert results["eval_metrics"]["accuracy"] > 0.8, results["eval_metrics"]   # 3 classes: chance is 0.33

    # Again: the job has ended and is not started again, and no data file is copied.
    # (The memory estimate was shown by the first deploy: not computed again.)
    again = run_playbook("deploy.yml", inventory, play_vars(tmp_path), timeout=1500)
    assert_ok(again, "deploy.yml (again)")
    copies = section(again.output, "Copy the data files that are missing or differ")
    # Every one of the 6 files is skipped on its host (and the loops' summary lines say so).
    assert "changed:" not in copies and "ok: [" not in copies, copies
    assert len(re.findall(r"skipping: \[host[23]\] => \(item=", copies)) == 6, copies
    for task in ("Create the data directories on the worker host",
                 "Write the job's list of training files, which every worker shards"):
        assert "changed:" not in section(again.output, task), section(again.output, task)
    # Each collect is an attempt of its own on the controller; latest is the newest.
    runs = tmp_path / "results"
    attempts = sorted(p.name for p in runs.iterdir() if p.is_dir() and not p.is_symlink())
    assert len(attempts) == 2 and all(re.fullmatch(r"\d{8}T\d{6}Z", a) for a in attempts), attempts
    assert os.readlink(runs / "latest") == attempts[-1]
    assert all((runs / a / "results.json").is_file() for a in attempts)

    remove_job()
    no_containers_anywhere(bare_metal, job)


#: (Hand-placed data that differs between the worker hosts: one of the problems
#: test_ansible.py's test_bad_hosts_fail_in_the_check_phase_all_named_in_one_play names in one play.)
BAD_DATA = {
    "no such source": "tfps_data_src: {src}/nowhere does not exist on the controller",
    "source matches no file": "tfps_data_src: on the controller, no files match '{src}/*.tfrecord'",
}


@pytest.mark.system
@pytest.mark.parametrize("case", list(BAD_DATA))
def test_bad_data_is_refused_before_anything_starts(case, bare_metal, image_archive, run_playbook, tmp_path):
    """A tfps_data_src that names no file stops the check phase (--tags check: nothing
    trains) with one message."""
    job = "baddata"
    data_dir = f"/srv/tfps-data/{job}"
    src = tmp_path / "src"
    src.mkdir()
    settings = {"tfps_data_dir": data_dir, "tfps_train_data": "/input/train-*.csv", "tfps_data_checksums": True}
    if case == "no such source":
        settings.update(tfps_data_src=str(src / "nowhere"))
    else:
        settings.update(tfps_data_src=str(src / "*.tfrecord"), tfps_train_data="")
    inventory = bare_metal.inventory(tmp_path / "inventory", {"ps": ["host1"], "worker": ["host2", "host3"]},
                                     group_vars={"all": job_vars(job, image_archive, **settings)})
    try:
        result = run_playbook("deploy.yml", inventory, play_vars(tmp_path), args=["--tags", "check"])
        assert result.returncode != 0, result.output[-3000:]
        assert BAD_DATA[case].format(src=src) in result.output, result.output[-4000:]
        assert "Copy the data files" not in result.output
        for host in bare_metal.hosts:
            assert not host.exists("/srv/tfps/" + job)
        no_containers_anywhere(bare_metal, job)
    finally:
        for host in bare_metal.hosts:
            host.sh(f"rm -rf {data_dir}")

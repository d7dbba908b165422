"""``tfps local --gpus``: which GPU each task process sees, and what is refused before anything starts.

No GPU is available to these tests: nvidia-smi's answers are the recordings in
tests/fixtures/nvidia-smi/ (an A100 pair under driver 535, a V100 under driver 470, a
driver/library mismatch), fed to the launcher in place of running nvidia-smi.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tfps import cli
from tfps.cluster import gpu
from tfps.errors import ConfigError
from tfps.exitcodes import ExitCode
from tfps.launch import estimate, processes

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-smi"


def recorded(name: str, rc: int = 0):
    """An nvidia-smi that answers with a recording, and remembers how it was called."""
    calls = []

    def run(args):
        calls.append(list(args))
        return rc, (FIXTURES / name).read_text()

    run.calls = calls
    return run


def no_nvidia_smi(args):
    raise FileNotFoundError("nvidia-smi")


# ----------------------------------------------------------------- nvidia-smi checks


def test_listed_gpus_that_nvidia_smi_lists_are_accepted():
    run = recorded("query-gpu-2xa100.csv")
    found = gpu.check_local(["1", "0"], run)
    assert [(g.index, g.uuid) for g in found] == [("1", "GPU-a1d9f07e-3c55-41b2-8e6d-7f0c4b2e9d13"),
                                                  ("0", "GPU-5e3b1c2a-8f4d-4c1e-9b7a-2d6f8e9a0b1c")]
    assert run.calls == [list(gpu.QUERY_GPU_ARGS)]
    assert [g.name for g in gpu.check_local(["0"], recorded("query-gpu-1xv100.csv"))] == ["Tesla V100-PCIE-16GB"]


@pytest.mark.parametrize("recording, ids, says", [
    ("query-gpu-2xa100.csv", ["0", "2"], "this machine has no GPU 2; nvidia-smi lists 0 (NVIDIA A100-PCIE-40GB), "
                                         "1 (NVIDIA A100-PCIE-40GB): give --gpus from these"),
    ("query-gpu-1xv100.csv", ["1", "3"], "this machine has no GPU 1, 3; nvidia-smi lists 0 (Tesla V100-PCIE-16GB)"),
])
def test_a_gpu_nvidia_smi_does_not_list_is_refused(recording, ids, says):
    with pytest.raises(ConfigError) as err:
        gpu.check_local(ids, recorded(recording))
    assert err.value.field == "gpus"
    assert says in str(err.value)


def test_no_nvidia_smi_is_refused_with_what_to_do():
    with pytest.raises(ConfigError) as err:
        gpu.check_local(["0"], no_nvidia_smi)
    assert str(err.value).startswith("gpus: no NVIDIA driver found (no nvidia-smi on PATH); install the NVIDIA driver")
    assert "drop --gpus to train on the CPU" in str(err.value)


def test_a_failing_nvidia_smi_is_refused_with_its_error():
    with pytest.raises(ConfigError) as err:
        gpu.check_local(["0"], recorded("smoke-driver-mismatch.txt", rc=18))
    assert ("nvidia-smi lists no GPU (exit 18: Failed to initialize NVML: Driver/library version mismatch / "
            "NVML library version: 535.183)") in str(err.value)


def test_the_real_nvidia_smi_call(tmp_path, monkeypatch):
    """:func:`gpu.nvidia_smi` finds nvidia-smi on PATH and passes the query; without one, FileNotFoundError."""
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(FileNotFoundError):
        gpu.nvidia_smi(gpu.QUERY_GPU_ARGS)
    fake = tmp_path / "nvidia-smi"
    fake.write_text(f"#!/bin/sh\n[ \"$1 $2\" = '{' '.join(gpu.QUERY_GPU_ARGS)}' ] || exit 9\n"
                    f"exec cat {FIXTURES / 'query-gpu-2xa100.csv'}\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    assert [g.index for g in gpu.check_local(["0", "1"])] == ["0", "1"]


# ----------------------------------------------------------------- what each task process sees


def test_a_worker_sees_its_gpu_with_memory_growth_and_a_ps_none():
    assert gpu.process_env("3") == {"CUDA_VISIBLE_DEVICES": "3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                                    "TF_FORCE_GPU_ALLOW_GROWTH": "true"}
    assert gpu.process_env(None) == {"CUDA_VISIBLE_DEVICES": "-1"}


class FakeTask:
    """Stands for a task process: records what the launcher would start, and exits 0 at once."""

    started: list[FakeTask] = []
    ended_why = ""   # why the launcher ended it (TaskProcess.ended_why)
    sent_without_results = False   # the chief said it sent the message without results.json (TaskProcess)

    def __init__(self, name, argv, env, out=None, verbose=False):
        self.name, self.argv, self.env = name, argv, env
        self.code = None
        self.signalled = set()

    def spawn(self):
        FakeTask.started.append(self)

    def pump(self):
        pass

    def poll(self):
        self.code = 0
        return 0

    def sample_rss(self):
        pass

    def signal(self, sig):
        pass

    def describe_exit(self):
        return "0 (OK)"


@pytest.fixture
def launcher(monkeypatch, tmp_path):
    """run_local with its checks, task processes and summary replaced: what it would start."""
    FakeTask.started = []
    preflights = []
    monkeypatch.setattr(processes, "TaskProcess", FakeTask)
    monkeypatch.setattr(processes, "_preflight", lambda *a, **kw: preflights.append(a) or False)
    monkeypatch.setattr(processes, "summarize", lambda *a, **kw: True)   # the chief reported
    for key in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "TF_FORCE_GPU_ALLOW_GROWTH", "TF_CONFIG"):
        monkeypatch.delenv(key, raising=False)   # restored after the test: run_local sets the first
    cfg = estimate.config_of([f"--model_dir={tmp_path / 'model'}"])

    def launch(**kwargs):
        code = processes.run_local(cfg, fork=False, **kwargs)
        return code, {t.name: t.env for t in FakeTask.started}, preflights
    launch.preflights = preflights
    return launch


def test_each_worker_process_gets_its_gpu_and_every_ps_none(launcher):
    code, env, _ = launcher(num_ps=2, num_workers=2, gpus=["1", "0"], nvidia_smi=recorded("query-gpu-2xa100.csv"))
    assert code == ExitCode.OK
    assert sorted(env) == ["ps0", "ps1", "worker0", "worker1"]
    gpu_keys = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "TF_FORCE_GPU_ALLOW_GROWTH")
    seen = {name: {k: e.get(k) for k in gpu_keys} for name, e in env.items()}
    assert seen["worker0"] == {"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                               "TF_FORCE_GPU_ALLOW_GROWTH": "true"}
    assert seen["worker1"] == {"CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                               "TF_FORCE_GPU_ALLOW_GROWTH": "true"}
    for ps in ("ps0", "ps1"):
        assert seen[ps] == {"CUDA_VISIBLE_DEVICES": "-1", "CUDA_DEVICE_ORDER": None, "TF_FORCE_GPU_ALLOW_GROWTH": None}
    # The launcher itself keeps off the GPUs (its checks may start TensorFlow's runtime).
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "-1"


def test_a_classic_script_gets_the_same_gpus(launcher, tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    code, env, _ = launcher(num_ps=1, num_workers=1, gpus=["0"], script=str(script),
                            nvidia_smi=recorded("query-gpu-1xv100.csv"))
    assert code == ExitCode.OK
    assert env["worker0"]["CUDA_VISIBLE_DEVICES"] == "0" and env["worker0"]["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    assert env["ps0"]["CUDA_VISIBLE_DEVICES"] == "-1"


def test_without_gpus_no_task_environment_changes(launcher):
    code, env, _ = launcher(num_ps=1, num_workers=2)
    assert code == ExitCode.OK and len(env) == 3
    for e in env.values():
        assert not {"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "TF_FORCE_GPU_ALLOW_GROWTH"} & set(e)
    assert "CUDA_VISIBLE_DEVICES" not in os.environ


@pytest.mark.parametrize("nvidia_smi, says", [
    (recorded("query-gpu-1xv100.csv"), "this machine has no GPU 1"),
    (no_nvidia_smi, "no NVIDIA driver found"),
])
def test_a_gpu_problem_stops_the_launch_before_anything_starts(launcher, nvidia_smi, says):
    with pytest.raises(ConfigError, match=says):
        launcher(num_ps=1, num_workers=2, gpus=["0", "1"], nvidia_smi=nvidia_smi)
    assert FakeTask.started == [] and launcher.preflights == []   # refused before the checks and any task
    assert "CUDA_VISIBLE_DEVICES" not in os.environ


# ----------------------------------------------------------------- the command line


@pytest.fixture
def local_call(monkeypatch):
    """What cmd_local passes to run_local (nothing is launched)."""
    calls = []
    monkeypatch.setattr(processes, "run_local", lambda cfg, **kw: calls.append(kw) or ExitCode.OK)
    return calls


@pytest.mark.parametrize("argv, workers, gpus", [
    (["--gpus", "1,0"], 2, ["1", "0"]),
    (["--gpus", "0"], 1, ["0"]),                    # not the default 2 workers
    (["--gpus", " 0, 01 "], 2, ["0", "1"]),         # spaces and a leading zero, as nvidia-smi numbers GPUs
    (["--gpus", "1,01"], None, None),               # GPU 1 twice: refused
    (["--gpus", "0,1", "--workers", "2"], 2, ["0", "1"]),
    (["--workers", "3"], 3, None),
    ([], 2, None),
])
def test_gpus_set_one_worker_per_gpu(local_call, argv, workers, gpus, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = cli.main(["local", *argv])
    if workers is None:
        assert code == ExitCode.BAD_CONFIG and local_call == []
        return
    assert code == ExitCode.OK
    assert local_call[0]["num_workers"] == workers and local_call[0]["gpus"] == gpus


def test_the_how_tos_command_asks_for_one_worker_per_gpu(local_call, tmp_path, monkeypatch):
    """docs/how-to/gpus.md's `tfps local --gpus` line, as the page gives it, up to the launch."""
    import docblocks
    monkeypatch.chdir(tmp_path)
    (argv,) = docblocks.commands("how-to/gpus.md", "tests/unit/test_local_gpus.py")
    assert argv[:2] == ["tfps", "local"], argv
    assert cli.main(argv[1:]) == ExitCode.OK
    assert local_call[0]["num_workers"] == 2 and local_call[0]["gpus"] == ["0", "1"] and local_call[0]["num_ps"] == 1


@pytest.mark.parametrize("argv, line", [
    (["--gpus", "0,1", "--workers", "3"],
     "tfps: error: workers: --workers 3 does not match 2 GPU id(s) in --gpus; a GPU worker per GPU, so drop --workers"),
    (["--gpus", "0,0"], "tfps: error: gpus: '0,0' lists GPU 0 twice; one worker per GPU"),
    (["--gpus", "0,x"], "tfps: error: gpus: 'x' is not a GPU index; use device indices such as 0,1 (nvidia-smi -L)"),
    (["--gpus", "1.5"], "tfps: error: gpus: '1.5' is not a GPU index; use device indices such as 0,1 (nvidia-smi -L)"),
    (["--gpus=-1"], "tfps: error: gpus: '-1' is not a GPU index; use device indices such as 0,1 (nvidia-smi -L)"),
    (["--gpus", "GPU-5e3b1c2a-8f4d-4c1e-9b7a-2d6f8e9a0b1c"],
     "tfps: error: gpus: 'GPU-5e3b1c2a-8f4d-4c1e-9b7a-2d6f8e9a0b1c' is not a GPU index; use device indices such as "
     "0,1 (nvidia-smi -L)"),
    (["--gpus", "0,,1"], "tfps: error: gpus: '0,,1' has an empty item; give device indices such as 0,1 "
                         "(nvidia-smi -L), separated by single commas"),
    (["--gpus", "0,1,"], "tfps: error: gpus: '0,1,' has an empty item"),
    (["--gpus", ""], "tfps: error: gpus: '' names no GPU; give device indices such as 0,1 (nvidia-smi -L)"),
])
def test_bad_gpus_are_one_line_and_exit_2(local_call, argv, line, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["local", *argv]) == ExitCode.BAD_CONFIG == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(line), err[0]
    assert local_call == [] and list(tmp_path.iterdir()) == []


def test_without_nvidia_smi_tfps_local_gpus_refuses_in_one_line(tmp_path, monkeypatch, capsys):
    """The real command on a machine without nvidia-smi (this one; PATH is emptied to be sure)."""
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["local", "--gpus", "0,1", "--train_steps", "5"]) == ExitCode.BAD_CONFIG
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["tfps: error: gpus: no NVIDIA driver found (no nvidia-smi on PATH); install the NVIDIA driver, "
                   "which brings nvidia-smi, and a CUDA build of TensorFlow (pip install 'tfps[gpu]'), or drop "
                   "--gpus to train on the CPU"]
    assert list(tmp_path.iterdir()) == [empty]   # nothing started, nothing written

"""Bad input through the real command line: exit 2, one line naming the field, nothing started."""

from __future__ import annotations

import subprocess
import sys

import pytest
from integration_helpers import REPO, base_env

pytestmark = pytest.mark.integration

CLUSTER = ["--ps_hosts", "127.0.0.1:1", "--worker_hosts", "127.0.0.1:2,127.0.0.1:3"]


def tfps(*args, env=None, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "tfps", *map(str, args)], env=env or base_env(), cwd=str(cwd),
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args,env,field", [
    (["run"], {}, "cluster"),
    (["run", *CLUSTER, "--job_name", "worker", "--task_index", "5"], {}, "task_index"),
    (["run"], {"TF_CONFIG": '{"cluster": {"ps": ["h:1"]'}, "TF_CONFIG"),
    (["run", *CLUSTER, "--job_name", "chief", "--task_index", "0"], {}, "job_name"),
    (["local", "--model", "nosuch"], {}, "model"),
    (["local", "--train_data", "/nonexistent/*.csv"], {}, "train_data"),
    (["local", "--train_steps", "-1"], {}, "train_steps"),
    (["local", "--batch-size", "0"], {}, "batch_size"),
    (["local", "--final_save_timeout", "5"], {}, "final_save_timeout"),
    (["local", "--script", "/nonexistent/train.py"], {}, "script"),
    (["run", *CLUSTER, "--job_name", "worker", "--task_index", "1", "--restarts", "-1"], {}, "restarts"),
    (["local", "--startup_timeout", "0"], {}, "startup_timeout"),
    (["local", "--gpus", "0,1", "--workers", "3"], {}, "workers"),
    (["local", "--gpus", "0,0"], {}, "gpus"),
    (["local", "--gpus", "0"], {"PATH": "/nonexistent"}, "gpus"),   # no nvidia-smi: no NVIDIA driver
], ids=["run-no-cluster", "task-index-range", "bad-tf-config", "job-name-chief", "unknown-model",
        "no-train-files", "negative-steps", "zero-batch-dashes", "short-final-save", "missing-script",
        "negative-restarts", "zero-startup-timeout", "gpus-vs-workers", "gpu-twice", "gpus-without-driver"])
def test_bad_input_exits_2_with_one_line(args, env, field, tmp_path):
    model_dir = tmp_path / "model"
    if args[0] == "local":
        args = [*args, "--model_dir", model_dir]
    p = tfps(*args, env=base_env(**env), cwd=tmp_path)
    assert p.returncode == 2, (p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith(f"tfps: error: {field}: "), lines[0]
    assert not model_dir.exists()
    assert not (tmp_path / "runs").exists()


def test_bad_csv_is_refused_before_anything_starts(tmp_path):
    bad = tmp_path / "train.csv"
    bad.write_text("f0,f1,label\n1,2,0\n3,4\n")
    p = tfps("local", "--train_data", bad, "--model_dir", tmp_path / "model", cwd=tmp_path)
    assert p.returncode == 2
    assert p.stderr.strip() == (f"tfps: error: train_data: {bad}:3 has 2 columns, the header has 3; "
                                "fix or remove that row")
    assert "tfps local:" not in p.stdout

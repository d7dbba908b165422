"""tfps_config: the role reads the job file ``--config`` reads (tfps plan -i computes the
same plan the role's tfps_plan action does). The file's settings replace the role's
defaults, the inventory's variables win over it, and an unknown key is refused by name."""

from __future__ import annotations

import pytest

from tfps import cli
from tfps.exitcodes import ExitCode

JOB = """\
train-steps: 777
batch_size: 16
hidden_units: "64,32"
model_arg: {depth: 3}
"""


@pytest.fixture(autouse=True)
def no_user_config(tmp_path, monkeypatch):
    for name in [n for n in __import__("os").environ if n.startswith("ANSIBLE_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("ANSIBLE_LOCAL_TEMP", str(tmp_path / "ansible-tmp"))
    monkeypatch.chdir(tmp_path)   # a relative tfps_config is read from the working directory
    (tmp_path / "hosts.ini").write_text("[ps]\np ansible_host=10.0.0.1\n[worker]\nw ansible_host=10.0.0.2\n"
                                        "[all:vars]\ntfps_config=job.yaml\ntfps_batch_size=64\n")


def test_the_job_files_settings_reach_the_plan_and_the_inventory_wins(tmp_path):
    from tfps.cluster.inventory import load_plan

    (tmp_path / "job.yaml").write_text(JOB)
    plan = load_plan(["hosts.ini"])
    argv = plan["tasks"][0]["argv"]
    assert "--train_steps=777" in argv and "--hidden_units=64,32" in argv   # from the file
    assert "--batch_size=16" not in argv                                  # the inventory's 64 wins
    assert "--model_arg=depth=3" in argv
    assert plan["job_file"] == {"tfps_train_steps": 777, "tfps_batch_size": 64, "tfps_model_args": {"depth": 3},
                                "tfps_extra_args": ["--hidden_units=64,32"]}
    given = load_plan(["hosts.ini"], extra_vars=["tfps_train_steps=5"])   # -e wins too
    assert "--train_steps=5" in given["tasks"][0]["argv"] and str(given["job_file"]["tfps_train_steps"]) == "5"


@pytest.mark.parametrize("text, line", [
    ("trainsteps: 3\n", "tfps: error: tfps_config: job.yaml: 'trainsteps' is not an option of tfps run; "
                        "did you mean train-steps?"),
    ("workers: 3\n", "tfps: error: tfps_config: job.yaml: 'workers' is the cluster's layout, which the inventory "
                     "gives (its groups ps and worker, tfps_ps_tasks, tfps_workers, tfps_gpus); leave it out of the "
                     "job file"),
    ("image: tfps:1\n", "tfps: error: tfps_config: job.yaml: 'image' is not a job setting (an option of tfps run); "
                        "set the role's tfps_image in the inventory instead"),
    ("notify: [mailto://x]\n", "tfps: error: tfps_config: job.yaml: notification URLs are secrets; set "
                               "tfps_notify_urls in a vaulted group_vars file instead (docs/ansible.md, Security)"),
])
def test_plan_refuses_a_job_files_unknown_key_by_name(tmp_path, capsys, text, line):
    (tmp_path / "job.yaml").write_text(text)
    code = cli.main(["plan", "-i", "hosts.ini"])
    err = capsys.readouterr().err
    assert code == ExitCode.BAD_CONFIG and err.splitlines() == [line], err

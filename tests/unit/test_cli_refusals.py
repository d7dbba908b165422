"""Bad input through ``cli.main`` in-process: one line ``tfps: error: ...`` and exit 2, nothing started.

argparse's own errors (issue 35 item 23), numeric options out of range (item 15), ``tfps
demo-data`` on a file (item 24) or into a directory of a user's files (issue 51).
"""

from __future__ import annotations

import pytest

from tfps import cli
from tfps.config import MAX_SECONDS, NUMERIC_LIMITS, RunConfig
from tfps.errors import ConfigError


def refusal(capsys, argv: list[str]) -> str:
    """The one line that ``tfps ARGV`` prints; checks exit 2 and that nothing else is printed."""
    code = cli.main(argv)
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2, (argv, out, err)
    assert len(lines) == 1, (argv, err)
    assert lines[0].startswith("tfps: error: "), lines[0]
    return lines[0]


@pytest.mark.parametrize("argv,start", [
    (["local", "--train_steps", "1e20"], "tfps: error: train_steps: invalid int value: '1e20'"),
    (["local", "--backup_workers", "abc"], "tfps: error: backup_workers: invalid int value: 'abc'"),
    (["local", "--learning_rate", "fast"], "tfps: error: learning_rate: invalid float value: 'fast'"),
    (["local", "--nosuch"], "tfps: error: unrecognized arguments: --nosuch"),
    (["run", "--task_index", "x"], "tfps: error: task_index: invalid int value: 'x'"),
    (["compose", "--workers", "two"], "tfps: error: workers: invalid int value: 'two'"),
    (["plan"], "tfps: error: the following arguments are required: -i/--inventory"),
    (["plan", "-i", "x", "--format", "xml"], "tfps: error: format: invalid choice: 'xml'"),
    (["logs", "-i", "x"], "tfps: error: the following arguments are required: job"),
    (["logs", "-i", "x", "job", "-n", "many"], "tfps: error: lines: invalid int value: 'many'"),
    (["logs", "--slurm"], "tfps: error: the following arguments are required: job"),
    (["demo-data"], "tfps: error: the following arguments are required: directory"),
    (["notify-failure"], "tfps: error: the following arguments are required: --reason"),
    (["nosuch"], "tfps: error: 'nosuch' is not a tfps command"),
    (["--bogus"], "tfps: error: unrecognized arguments: --bogus"),
])
def test_every_argparse_error_is_one_line(capsys, argv, start):
    line = refusal(capsys, argv)
    assert line.startswith(start), line
    assert line.endswith("--help)"), line   # the hint: where the options are described


def test_tfps_run_own_parser_is_one_line_too(capsys):
    from tfps.task import entry
    assert entry.main(["--train_steps", "1e20"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["tfps: error: train_steps: invalid int value: '1e20' (see tfps run --help)"]


def test_help_and_version_still_exit_0(capsys):
    assert cli.main(["--version"]) == 0
    assert cli.main(["local", "--help"]) == 0
    assert "--train-steps" in capsys.readouterr().out   # help shows the dashed spelling


@pytest.mark.parametrize("field", ["learning_rate", "partition_mb", "sync_timeout", "startup_timeout",
                                   "final_save_timeout", "notify_every", "stall_timeout"])
@pytest.mark.parametrize("value", ["1e308", "inf", "nan", "-inf"])
def test_float_options_out_of_range_are_refused_before_start(capsys, tmp_path, monkeypatch, field, value):
    monkeypatch.chdir(tmp_path)
    line = refusal(capsys, ["local", f"--{field}", value, "--model_dir", str(tmp_path / "m")])
    assert line.startswith(f"tfps: error: {field}: "), line
    assert list(tmp_path.iterdir()) == []


def test_every_float_option_has_an_upper_bound():
    import dataclasses
    floats = {f.name for f in dataclasses.fields(RunConfig) if "float" in str(f.type)}
    assert floats <= set(NUMERIC_LIMITS), floats - set(NUMERIC_LIMITS)


def test_the_largest_accepted_values_are_accepted():
    cfg = RunConfig(partition_mb=float(2**42), sync_timeout=MAX_SECONDS, startup_timeout=MAX_SECONDS,
                    final_save_timeout=MAX_SECONDS, notify_every=MAX_SECONDS, stall_timeout=MAX_SECONDS,
                    learning_rate=1e38, tf_threads=2**31 - 1).validate()
    assert int(cfg.partition_mb * 2**20) < 2**63      # what tfps.task.graph.placement computes
    assert int(cfg.sync_timeout * 1000) < 2**63       # TensorFlow's operation_timeout_in_ms
    import threading
    assert cfg.stall_timeout <= threading.TIMEOUT_MAX
    with pytest.raises(ConfigError, match="tf_threads: 2147483648 is too large"):
        RunConfig(tf_threads=2**31).validate()


@pytest.mark.parametrize("argv,field", [
    (["compose", "--ps_cpus", "inf"], "ps_cpus"),
    (["compose", "--worker_cpus", "nan"], "worker_cpus"),
    (["compose", "--pids_limit", str(10**22)], "pids_limit"),
])
def test_compose_numeric_limits(capsys, argv, field):
    assert refusal(capsys, argv).startswith(f"tfps: error: {field}: ")


def test_demo_data_into_a_directory_of_the_users_files_is_refused_and_they_are_kept(capsys, tmp_path):
    """``tfps demo-data DIR`` overwrote DIR/ctr/eval.csv, a user's own file of that name."""
    own = tmp_path / "data"
    (own / "ctr").mkdir(parents=True)
    (own / "ctr" / "eval.csv").write_text("user,label\nme,1\n")
    (own / "notes.txt").write_text("mine\n")
    assert refusal(capsys, ["demo-data", str(own)]) == (
        f"tfps: error: directory: {own} holds files tfps did not write (ctr, notes.txt); give a new or empty "
        "directory for the demo data")
    assert (own / "ctr" / "eval.csv").read_text() == "user,label\nme,1\n"
    assert sorted(p.name for p in own.rglob("*")) == ["ctr", "eval.csv", "notes.txt"]
    # A new directory is filled, and the same command again finds it tfps's own.
    demo = tmp_path / "demo"
    for _ in range(2):
        assert cli.main(["demo-data", str(demo)]) == 0
        assert "ctr_eval: " in capsys.readouterr().out
    assert (demo / "COMPLETE").exists() and (demo / "ctr" / "eval.csv").stat().st_size > 1000


def test_demo_data_on_a_file_is_one_line(capsys, tmp_path):
    f = tmp_path / "data.csv"
    f.write_text("keep me\n")
    assert refusal(capsys, ["demo-data", str(f)]) == (
        f"tfps: error: directory: {f} is a file, not a directory; give a new or existing directory for the demo data")
    assert f.read_text() == "keep me\n"
    line = refusal(capsys, ["demo-data", str(f / "sub")])
    assert line.startswith(f"tfps: error: directory: cannot write the demo data to {f / 'sub'}"), line


@pytest.mark.parametrize("field,value,most", [("min_count", 2**31, 2**31 - 1),
                                              ("expected_ids", 999999999999, 2**31 - 1)])
@pytest.mark.parametrize("how", ["flag", "config"])
def test_dynamic_table_counts_past_32_bits_are_refused_with_their_bound(capsys, tmp_path, monkeypatch,
                                                                        field, value, most, how):
    """min_count 2**31 wrapped in the int32 sketch (every id admitted at once); expected_ids
    999999999999 failed every task on a negative shape."""
    monkeypatch.chdir(tmp_path)
    argv = ["local", "--model", "wide_deep", "--embedding", "dynamic", "--model_dir", str(tmp_path / "m")]
    if how == "flag":
        argv += [f"--{field}", str(value)]
    else:
        (tmp_path / "job.yml").write_text(f"{field}: {value}\n")
        argv += ["--config", str(tmp_path / "job.yml")]
    line = refusal(capsys, argv)
    assert line.startswith(f"tfps: error: {field}: {value} is too large: "), line
    assert line.endswith(f"use at most {most}"), line
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("command", ["deploy", "stop", "status", "cleanup"])
@pytest.mark.parametrize("content, words", [
    (None, "no such file or directory"),
    ("", "Ansible could not read it as an inventory: no hosts were found"),
    ("[ps\nfoo=[\n", "Ansible could not read it as an inventory: Failed to parse"),
    ("[ps]\nh1\n", "the inventory has no 'worker' group"),
])
def test_a_playbook_command_refuses_the_inventories_plan_refuses_before_any_play(
        capsys, tmp_path, command, content, words):
    """Issue 51: ``-i /nonexistent``, an empty and an unparseable inventory exited 0 after
    Ansible's warnings and "no hosts matched"; now they are the plan's one line, exit 2."""
    source = tmp_path / "hosts.ini"
    if content is not None:
        source.write_text(content)
    line = refusal(capsys, [command, "-i", str(source)])
    assert words in line, line


def test_a_good_inventory_passes_the_playbook_commands_check():
    import argparse
    import pathlib

    from tfps.backends import ansible
    example = pathlib.Path(__file__).resolve().parents[2] / "inventory" / "example"
    ansible.check_inventory(argparse.Namespace(inventory=[str(example)], extra_vars=[], vault_id=[],
                                               vault_password_file=[]))

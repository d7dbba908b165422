"""The sbatch script of tfps slurm, and what it refuses before anything is written or submitted."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tfps import cli
from tfps.launch import slurm

BASE = dict(name="job", num_ps=1, num_workers=2, model_dir="/shared/m", slurm_dir="/shared/m.slurm",
            workdir="/shared", python="/opt/venv/bin/python", run_options=["--train_steps", "100"], grace=1830)


def _sbatch_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("#SBATCH")]


def test_every_sbatch_line_has_a_comment_above_it():
    text = slurm.sbatch_script(**BASE, partition="cpu", time="2:00:00", nodes=3, requeue=True,
                               extra=["--mem=4G"])
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("#SBATCH") and not lines[i - 1].startswith("#SBATCH"):
            assert lines[i - 1].startswith("# "), line
    assert _sbatch_lines(text) == [
        "#SBATCH --job-name=job", "#SBATCH --ntasks=3", "#SBATCH --nodes=3", "#SBATCH --partition=cpu",
        "#SBATCH --time=2:00:00", "#SBATCH --chdir=/shared", "#SBATCH --output=/shared/m.slurm/slurm-%j.out",
        "#SBATCH --signal=TERM@1830", "#SBATCH --requeue", "#SBATCH --mem=4G"]


def test_one_srun_step_runs_every_task_with_the_same_interpreter():
    text = slurm.sbatch_script(**BASE)
    assert text.count("\nsrun ") == 1
    assert "srun --ntasks=3 --distribution=block" in text
    assert "/opt/venv/bin/python -m tfps.launch.slurm_step --ps 1 --workers 2 --rendezvous \"$RENDEZVOUS\"" in text
    assert "--train_steps 100" in text
    assert 'exit "$rc"' in text and "chief.exit" in text


def test_the_script_is_valid_bash():
    text = slurm.sbatch_script(**BASE, gpus_per_worker=1, nodes=2, verbose=True)
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0


def test_a_gpu_layout_asks_gres_for_every_slot_of_a_node():
    text = slurm.sbatch_script(**{**BASE, "num_workers": 4}, nodes=2, gpus_per_worker=2)
    assert "#SBATCH --ntasks-per-node=3" in _sbatch_lines(text)
    assert "#SBATCH --gres=gpu:6" in _sbatch_lines(text)
    assert "--gpus_per_worker 2" in text


@pytest.mark.parametrize("text, secs", [
    ("30", 1800), ("10:00", 600), ("1:00:00", 3600), ("2-0", 172800), ("1-2:30", 95400), ("0-0:0:90", 90)])
def test_walltime(text, secs):
    assert slurm.walltime_secs(text) == secs


def _tfps(tmp_path, monkeypatch, capsys, *args):
    monkeypatch.chdir(tmp_path)
    code = cli.main(["slurm", *args])
    return code, capsys.readouterr()


@pytest.mark.parametrize("args, words", [
    (["--ps", "0"], "ps: 0 is not a count of tasks"),
    (["--nodes", "5"], "nodes: 5 node(s) for 3 task(s)"),
    (["--gpus-per-worker", "1"], "give --nodes with --gpus-per-worker"),
    (["--time", "10"], "ask for more time or lower --final-save-timeout"),
    (["--time", "soon"], "is not a Slurm time"),
    (["--notify", "json://localhost"], "--notify-config FILE"),
    (["--sbatch-option=mem=1G"], "is not an sbatch option"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys, args, words):
    code, out = _tfps(tmp_path, monkeypatch, capsys, *args, "--model_dir", str(tmp_path / "m"))
    assert code == 2
    assert out.err.count("\n") == 1 and words in out.err, out.err
    assert list(tmp_path.iterdir()) == []


def test_writes_the_script_beside_the_model_dir(tmp_path, monkeypatch, capsys):
    code, out = _tfps(tmp_path, monkeypatch, capsys, "--ps", "2", "--workers", "3", "--train-steps", "50",
                      "--sync_replicas", "--model_dir", "m", "--time", "1:00:00", "--final_save_timeout", "120")
    assert code == 0
    text = (tmp_path / "m.slurm" / "job.sbatch").read_text()
    assert not (tmp_path / "m").exists()     # the model_dir holds only what the job writes
    assert f"{sys.executable} -m tfps.launch.slurm_step --ps 2 --workers 3" in text
    options = re.search(r"-- \\\n\s+(.*)\n", text).group(1)
    assert options.split() == ["--train_steps", "50", "--sync_replicas", "--model_dir", str(tmp_path / "m"),
                               "--final_save_timeout", "120.0"]
    assert "#SBATCH --signal=TERM@150" in text and "#SBATCH --chdir=" + str(tmp_path) in text


def test_submit_without_sbatch_says_where_to_run_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    code, out = _tfps(tmp_path, monkeypatch, capsys, "--model_dir", "m", "--submit")
    assert code == 2 and "sbatch is not on the PATH" in out.err


def test_results_and_messages_name_the_slurm_job(monkeypatch):
    from tfps.notify.message import format_message
    from tfps.outcome.contract import JobResult
    from tfps.outcome.report import slurm_job
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert slurm_job() is None
    monkeypatch.setenv("SLURM_JOB_ID", "1234")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    assert slurm_job() == "1234"
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    assert slurm_job() == "1234 (requeued 2x)"
    result = JobResult(job="j", status="succeeded", slurm_job="1234")
    assert result.to_dict()["slurm_job"] == "1234"
    assert "slurm_job" not in JobResult(job="j", status="succeeded").to_dict()   # left out elsewhere
    assert re.search(r"^Slurm job +1234$", format_message("succeeded", result)[1], re.M)


def test_the_others_learn_the_chiefs_exit_code_or_that_it_was_killed(tmp_path):
    from tfps.exitcodes import ExitCode
    from tfps.launch import slurm_step
    now = [0.0]

    def sleep(secs):
        now[0] += secs
        if now[0] < 10:   # the chief beats for 10 s, then falls silent without an exit code
            (tmp_path / slurm_step.CHIEF_ALIVE).write_text(f"{int(now[0])}\n")

    assert slurm_step._chief_gone(str(tmp_path), clock=lambda: now[0], sleep=sleep) == ExitCode.KILLED
    assert 10 + slurm_step.CHIEF_SILENT_SECS <= now[0] <= 10 + slurm_step.CHIEF_SILENT_SECS + 2
    slurm_step._write_chief_exit(str(tmp_path), 1)
    assert slurm_step._chief_gone(str(tmp_path), sleep=lambda s: None) == 1


@pytest.mark.parametrize("chief_code, step_code, expected", [("0", 0, 0), ("1", 0, 1), ("143", 143, 143),
                                                              (None, 137, 137), (None, 0, 1)])
def test_the_script_exits_with_the_chiefs_code(tmp_path, chief_code, step_code, expected):
    """The script run by bash with a stand-in for srun: the job's code is the chief's, or the
    step's (never 0) when the chief left none."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    write = f'echo {chief_code} > "$dir/chief.exit"' if chief_code is not None else ":"
    (bin_dir / "srun").write_text(
        "#!/bin/bash\nwhile [ $# -gt 0 ]; do [ \"$1\" = --rendezvous ] && dir=$2; shift; done\n"
        f"{write}\nexit {step_code}\n")
    (bin_dir / "srun").chmod(0o755)
    script = tmp_path / "job.sbatch"
    script.write_text(slurm.sbatch_script(**{**BASE, "slurm_dir": str(tmp_path / "m.slurm")}))
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_ID": "7"}
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert proc.returncode == expected, proc.stdout + proc.stderr
    assert (tmp_path / "m.slurm" / "rendezvous" / "7-0").is_dir()


def test_the_run_options_reach_tfps_run_as_given():
    """What tfps slurm passes on is what tfps run parses back: the same job settings."""
    import dataclasses

    from tfps.config import from_args
    from tfps.task import entry
    given = ["--model", "wide_deep", "--train_steps", "77", "--sync_replicas", "--backup_workers", "1",
             "--model_arg", "units=8", "--model_arg", "dropout=0.5", "--learning_rate", "0.05",
             "--notify_started", "--stall_timeout", "0", "--checkpoint_secs", "30", "--run_name", "exp-1"]
    ns = cli.build_parser().parse_args(["slurm", "--workers", "3", *given])
    argv = slurm.run_argv(ns, {"model_dir": "/shared/m"})
    back = entry.build_parser().parse_args(argv)
    mine, theirs = dataclasses.asdict(from_args(ns)), dataclasses.asdict(from_args(back))
    mine["model_dir"] = "/shared/m"
    assert mine == theirs


def test_a_model_dir_a_running_job_holds_is_refused_before_anything_is_written(tmp_path, monkeypatch, capsys):
    import fcntl
    import json

    from tfps.outcome import lock
    (tmp_path / "m").mkdir()
    with open(tmp_path / "m" / lock.LOCK_FILE, "w") as held:    # the running job's chief, on another node
        fcntl.flock(held, fcntl.LOCK_EX)
        json.dump({"pid": 31, "host": "node2", "by": "the chief of Slurm job 12 (tfps slurm)", "job": "job"}, held)
        held.flush()
        code, out = _tfps(tmp_path, monkeypatch, capsys, "--model_dir", "m")
    assert code == 2 and out.err.count("\n") == 1, out.err
    assert "model_dir: " in out.err and "is in use by job 'job' (the chief of Slurm job 12" in out.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]    # no script, no m.slurm/


# ----------------------------------------------------------------------------- values that reach the script

#: Values a user may give that a shell or sbatch would read as more than one word or as a command.
NASTY = ["a b", "a\ntouch x", "a\rb", 'a"b', "a'b", "a\\b", "a#b", "$HOME", "a;touch x", "$(touch x)", "`touch x`",
         "a\u2028b"]


def sbatch_words(line: str) -> list[str]:
    """An ``#SBATCH`` line's words as sbatch reads them: blanks split outside double quotes, a double
    quote toggles quoting, an unquoted ``#`` starts a comment (a backslash never appears: refused)."""
    words, word, quoted = [], None, False
    for ch in line[len("#SBATCH"):]:
        assert ch != "\\", line
        if ch == '"':
            quoted, word = not quoted, word or ""
        elif ch == "#" and not quoted:
            break
        elif ch.isspace() and not quoted:
            if word is not None:
                words.append(word)
            word = None
        else:
            word = (word or "") + ch
    assert not quoted, line
    return words + ([word] if word is not None else [])


def _srun_argv(tmp_path, script: str) -> list[str]:
    """The script run by bash with a stand-in srun that records its arguments: what the tasks get."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "srun").write_text('#!/bin/bash\nprintf "%s\\0" "$@" > "$SRUN_ARGV"\n')
    (bin_dir / "srun").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_ID": "7", "SRUN_ARGV": str(tmp_path / "argv")}
    done = subprocess.run(["bash", script], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert done.stderr == "", done.stderr      # no stray command ran (nor failed)
    return (tmp_path / "argv").read_bytes().decode().split("\0")[:-1]


@pytest.mark.parametrize("value", NASTY)
@pytest.mark.parametrize("flag, sbatch", [("--model_dir", "--output"), ("--partition", "--partition"),
                                          ("--run_name", "--job-name"), ("--export_dir", None),
                                          ("--sbatch-option=--comment", "--comment"), ("--time", "--time")])
def test_every_value_reaching_the_script_is_one_word_or_refused(tmp_path, monkeypatch, capsys, flag, sbatch, value):
    """Issue 51: a --model_dir holding a newline put a command of its own on a line of the script,
    and --partition $'a\\nb' a stray one. Each value is refused in one line (nothing written), or
    comes out of bash -n, of sbatch's reading of #SBATCH lines and of a real run as one word."""
    work = tmp_path / "work"
    work.mkdir()
    if flag == "--time":
        value = "30" + ("" if value == "a b" else value[1:])   # "30\nrm -rf x", '30"b', ...
    given = str(work / f"m{value}") if flag in ("--model_dir", "--export_dir") else value
    args = [f"{flag}={given}"] if "=" in flag else [flag, given]
    if flag != "--model_dir":
        args += ["--model_dir", str(work / "m")]
    code, out = _tfps(work, monkeypatch, capsys, *args, "-o", str(work / "job.sbatch"))
    if code != 0:
        assert code == 2 and out.err.count("\n") == 1 and out.err.startswith("tfps: error: "), out.err
        assert list(work.iterdir()) == [], list(work.iterdir())     # nothing written, no directory made
        return
    script = work / "job.sbatch"
    text = script.read_text()
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    if sbatch is not None:
        words = [w for line in text.splitlines() if line.startswith("#SBATCH") for w in sbatch_words(line)
                 if w.startswith(sbatch + "=")]
        expected = os.path.join(given + ".slurm", "slurm-%j.out") if flag == "--model_dir" else given
        assert words == [f"{sbatch}={expected}"], (words, text)
    argv = _srun_argv(tmp_path, str(script))
    assert not (tmp_path / "x").exists() and not (work / "x").exists()   # no injected command ran
    if flag in ("--model_dir", "--export_dir", "--run_name"):
        assert argv[argv.index(flag) + 1] == given, argv


def test_a_working_directory_with_blanks_is_quoted_and_one_with_a_line_break_refused(tmp_path, monkeypatch, capsys):
    odd = tmp_path / "my runs $x"
    odd.mkdir()
    code, out = _tfps(odd, monkeypatch, capsys, "--model_dir", "m")
    assert code == 0, out.err
    lines = [line for line in (odd / "m.slurm" / "job.sbatch").read_text().splitlines() if "--chdir" in line]
    assert [w for line in lines for w in sbatch_words(line)] == [f"--chdir={odd}"]
    bad = tmp_path / "a\nb"
    bad.mkdir()
    code, out = _tfps(bad, monkeypatch, capsys, "--model_dir", str(tmp_path / "m2"))
    assert code == 2 and "directory: " in out.err and out.err.count("\n") == 1, out.err
    assert list(bad.iterdir()) == [] and not (tmp_path / "m2.slurm").exists()


def test_o_never_overwrites_a_file_tfps_did_not_write(tmp_path, monkeypatch, capsys):
    mine = tmp_path / "run.sh"
    mine.write_text("#!/bin/bash\necho my own script\n")
    code, out = _tfps(tmp_path, monkeypatch, capsys, "--model_dir", "m", "-o", str(mine))
    assert code == 2 and out.err.count("\n") == 1, out.err
    assert "output: " in out.err and "tfps slurm did not write it" in out.err
    assert mine.read_text() == "#!/bin/bash\necho my own script\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.sh"]     # no m.slurm/ either
    ours = tmp_path / "job.sbatch"
    assert _tfps(tmp_path, monkeypatch, capsys, "--model_dir", "m", "-o", str(ours))[0] == 0
    assert _tfps(tmp_path, monkeypatch, capsys, "--model_dir", "m", "--train_steps", "7", "-o", str(ours))[0] == 0
    assert "--train_steps 7" in ours.read_text()                          # a script of tfps's own is rewritten


def test_an_unwritable_o_is_named_as_output_and_leaves_no_directory(tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("")
    code, out = _tfps(tmp_path, monkeypatch, capsys, "--model_dir", "m", "-o", str(tmp_path / "file" / "job.sbatch"))
    assert code == 2 and out.err.startswith("tfps: error: output: cannot write "), out.err
    assert "give -o a path" in out.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]      # no empty m.slurm/ left

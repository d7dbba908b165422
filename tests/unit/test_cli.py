"""The command line itself: dispatch, exit codes, -v, the TensorFlow check, the logging setup."""

from __future__ import annotations

import importlib.util
import io
import logging
import os

import pytest

from tfps import cli, logs
from tfps.exitcodes import ExitCode


@pytest.mark.parametrize("command", [["run", "--ps_hosts", "h:1", "--worker_hosts", "h:2", "--job_name", "worker",
                                      "--task_index", "0"], ["local", "--ps", "1", "--workers", "2"]])
def test_without_tensorflow_run_and_local_refuse_with_the_extras_to_install(command, monkeypatch, capsys, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, **kw: None if name == "tensorflow" else real(name, *a, **kw))
    monkeypatch.chdir(tmp_path)
    assert cli.main(command) == ExitCode.BAD_CONFIG == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("tfps: error: TensorFlow is not installed")
    assert "pip install 'tfps[cpu]'" in err[0] and "'tfps[gpu]'" in err[0]
    assert list(tmp_path.iterdir()) == []   # nothing started, nothing written


def test_verbose_before_or_after_the_command():
    p = cli.build_parser()
    assert p.parse_args(["-v", "demo_data", "d"]).verbose is True
    assert p.parse_args(["demo_data", "d", "-v"]).verbose is True
    assert p.parse_args(["demo_data", "d"]).verbose is False
    assert p.parse_args(["local", "--verbose"]).verbose is True
    assert p.parse_args(["plan", "-i", "x"]).verbose is False
    # Every command, not just some: -v after plan and compose too.
    for command in (["plan", "-i", "x"], ["compose"], ["run"], ["notify_test"], ["healthcheck"]):
        assert p.parse_args([*command, "-v"]).verbose is True, command
        assert p.parse_args(["-v", *command]).verbose is True, command


def test_every_command_dispatches_to_a_function():
    p = cli.build_parser()
    sub = next(a for a in p._actions if a.dest == "command")
    for name, parser in sub.choices.items():
        assert callable(parser.get_default("func")), name


def test_notify_test_error_goes_to_stderr(capsys, monkeypatch):
    monkeypatch.delenv("APPRISE_URLS", raising=False)
    assert cli.main(["notify-test"]) == ExitCode.BAD_CONFIG
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("tfps: error: no notification service configured")


def test_logging_goes_to_stderr_on_the_tfps_logger_and_quiets_tensorflow():
    stream = io.StringIO()
    root = logging.getLogger()
    root_before = (list(root.handlers), root.level)
    logs.setup(False, stream=stream)
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "2"
    logging.getLogger("tfps").info("tfps line")
    logging.getLogger("tfps.notify").info("notify line")
    assert "tfps line" in stream.getvalue() and "notify line" in stream.getvalue()
    assert (root.handlers, root.level) == root_before   # the root logger is left alone: TensorFlow inherits nothing
    tf_log = logging.getLogger("tensorflow")
    assert tf_log.level == logging.WARNING
    deprecation = tf_log.makeRecord("tensorflow", logging.WARNING, __file__, 1,
                                    "From x.py:1: calling f (from m) is deprecated and will be removed in a "
                                    "future version.\nInstructions for updating:\nUse g.", (), None)
    assert not all(f.filter(deprecation) for f in tf_log.filters)
    step_noise = tf_log.makeRecord("tensorflow", logging.WARNING, __file__, 1,
                                   "It seems that global step (tf.train.get_global_step) has not been increased. "
                                   "Current value (could be stable): 17 vs previous value: 17.", (), None)
    assert not all(f.filter(step_noise) for f in tf_log.filters)
    other = tf_log.makeRecord("tensorflow", logging.WARNING, __file__, 1, "a real warning", (), None)
    assert all(f.filter(other) for f in tf_log.filters)


def test_verbose_logging_lets_tensorflow_speak():
    logs.setup(True, stream=io.StringIO())
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "0"
    assert logging.getLogger("tfps").level == logging.DEBUG
    assert logging.getLogger("tensorflow").level == logging.INFO
    assert not logging.getLogger("tensorflow").filters


def test_a_tf_cpp_level_set_by_the_user_wins(monkeypatch):
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "1")
    logs.setup(False, stream=io.StringIO())
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "1"


def test_tfps_imports_tensorflow_without_a_word_on_stderr():
    """Whatever the CPU: ``import_tensorflow`` in a fresh process, quiet as ``tfps.logs`` sets it."""
    pytest.importorskip("tensorflow")
    import subprocess
    import sys
    code = "from tfps.task import import_tensorflow\nimport_tensorflow()\nprint('imported')\n"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert p.returncode == 0 and p.stdout.strip() == "imported", p.stderr
    # Only TensorFlow's import banner, which TF_CPP_MIN_LOG_LEVEL cannot hide (on CPUs with
    # oneDNN): tfps leaves it out where it reads the output (tfps local, tfps logs).
    assert [line for line in p.stderr.splitlines() if not logs.is_tf_noise(line)] == [], p.stderr

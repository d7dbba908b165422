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


BANNER = ["WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
          "I0000 00:00:1796519428.142621    3792 port.cc:153] oneDNN custom operations are on. You may see "
          "slightly different numerical results due to floating-point round-off errors from different "
          "computation orders. To turn them off, set the environment variable `TF_ENABLE_ONEDNN_OPTS=0`."]


@pytest.mark.parametrize("level, dropped", [("2", True), ("1", True), ("0", False)])
def test_tensorflows_import_banner_is_dropped_unless_its_info_lines_are_asked_for(level, dropped):
    """TensorFlow 2.21 prints its oneDNN banner on stderr at import on CPUs where oneDNN is
    on, whatever TF_CPP_MIN_LOG_LEVEL says: ``tfps run``'s one-line errors would come after
    four lines of it. In a fresh process (file descriptor 2 itself): the banner's lines,
    written while a module imports, are dropped; every other line is kept, in order."""
    import subprocess
    import sys
    code = ("import os, sys\n"
            "from tfps.logs import tf_import_banner_dropped\n"
            "with tf_import_banner_dropped():\n"
            "    os.write(2, (sys.argv[1] + '\\nkept 1\\n' + sys.argv[2] + '\\n').encode())\n"
            "    print('kept 2', file=sys.stderr)\n"
            "print('after', file=sys.stderr)\n")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": level}
    p = subprocess.run([sys.executable, "-c", code, *BANNER], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    expected = ["kept 1", "kept 2", "after"] if dropped else [BANNER[0], "kept 1", BANNER[1], "kept 2", "after"]
    assert p.stderr.splitlines() == expected


def test_the_last_words_of_an_import_that_aborts_the_process_reach_stderr():
    """TensorFlow's import can end the process from C++ (a failed check: abort()), with its
    reason as the last line on stderr. Inside ``tf_import_banner_dropped`` that line still
    reaches stderr (the banner before it does not), and the process dies of SIGABRT."""
    import signal
    import subprocess
    import sys
    code = ("import os, sys\n"
            "from tfps.logs import tf_import_banner_dropped\n"
            "with tf_import_banner_dropped():\n"
            "    os.write(2, (sys.argv[1] + '\\n' + sys.argv[2] + '\\n').encode())\n"
            "    os.write(2, b'F0000 op_registry.cc:42] Check failed: duplicate op Foo\\n')\n"
            "    os.abort()\n")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    p = subprocess.run([sys.executable, "-c", code, *BANNER], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == -signal.SIGABRT, (p.returncode, p.stderr)
    assert p.stderr.splitlines() == ["F0000 op_registry.cc:42] Check failed: duplicate op Foo"]


@pytest.mark.parametrize("root, dropped", [(None, True), ("/nonexistent", False)])
def test_the_banner_filter_passes_every_other_line_and_everything_when_it_cannot_import_tfps(root, dropped):
    """The filter process itself: the banner out, every other line through, in order. One that
    cannot import tfps (a tfps it cannot find) still reads the pipe and passes it all on:
    an importing process is never left writing to a pipe nobody reads."""
    import subprocess
    given = "\n".join([BANNER[0], "kept 1", BANNER[1], "kept 2"]) + "\n"
    p = subprocess.run(logs.banner_filter_command(root), input=given, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stderr == ""
    assert p.stdout.splitlines() == (["kept 1", "kept 2"] if dropped else given.splitlines())


@pytest.mark.parametrize("to_devnull", [True, False])
def test_no_banner_filter_is_started_when_stderr_goes_nowhere(to_devnull):
    """The launcher imports TensorFlow with stderr on /dev/null (unless -v): there is nothing
    to filter, so no filter process is started; with stderr on a pipe, one is."""
    import subprocess
    import sys
    code = ("import os\n"
            "from tfps.logs import tf_import_banner_dropped\n"
            "with tf_import_banner_dropped():\n"
            "    print(open(f'/proc/self/task/{os.getpid()}/children').read().split())\n")
    p = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, timeout=60,
                       stderr=subprocess.DEVNULL if to_devnull else subprocess.PIPE,
                       env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert p.returncode == 0
    children = p.stdout.strip()
    assert (children == "[]") if to_devnull else (children != "[]"), children


def test_tfps_imports_tensorflow_without_a_word_on_stderr():
    """Whatever the CPU: ``import_tensorflow`` in a fresh process, quiet as ``tfps.logs`` sets it."""
    pytest.importorskip("tensorflow")
    import subprocess
    import sys
    code = "from tfps.task import import_tensorflow\nimport_tensorflow()\nprint('imported')\n"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert p.returncode == 0 and p.stdout.strip() == "imported", p.stderr
    assert p.stderr == ""

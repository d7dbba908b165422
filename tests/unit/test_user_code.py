"""A user's model code cannot decide tfps's outcome by ending the process (tfps.errors.user_code).

``sys.exit``, ``os._exit`` and a ``KeyboardInterrupt`` that no Ctrl-C caused, in a model
module's import, a Keras builder or a model_fn, become one line naming the code and what it
did (a ``ConfigError``: exit 2 before start, a failed job after it). In-process: the guard
is what keeps ``os._exit`` from ending this very test.
"""

from __future__ import annotations

import os
import signal
import sys

import pytest

from tfps import models
from tfps.errors import UserCodeExit, real_os_exit, user_code

FIXTURES = "tests.fixtures.exiting_models"


@pytest.fixture(autouse=True)
def _repo_on_path():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.path.insert(0, root)
    yield
    sys.path.remove(root)


@pytest.mark.parametrize("fn, said", [
    ("exit_model_fn", "the model function tests.fixtures.exiting_models:exit_model_fn called sys.exit(3)"),
    ("os_exit_model_fn", "called os._exit(0)"),
])
def test_a_model_fn_that_ends_the_process_is_one_line(fn, said):
    model_fn = models.resolve(f"{FIXTURES}:{fn}")
    with pytest.raises(UserCodeExit) as e:
        model_fn(None, None, "train", None)
    assert said in str(e.value)
    assert str(e.value).startswith("model: ") and "\n" not in str(e.value)
    assert os._exit is real_os_exit


def test_os_exit_cannot_be_swallowed_by_a_users_except_exception():
    model_fn = models.resolve(f"{FIXTURES}:swallowing_model_fn")
    with pytest.raises(UserCodeExit, match=r"called os\._exit\(0\)"):
        model_fn(None, None, "train", None)


@pytest.mark.parametrize("fn, said", [
    ("exit_builder", "the model builder tests.fixtures.exiting_models:exit_builder called sys.exit(0)"),
    ("os_exit_builder", "called os._exit(0)"),
    ("interrupt_builder", "raised KeyboardInterrupt (no Ctrl-C was pressed)"),
])
def test_a_keras_builder_that_ends_the_process_is_one_line(fn, said):
    builder = models.resolve(f"{FIXTURES}:{fn}")
    with pytest.raises(UserCodeExit) as e:
        builder.call(None)
    assert said in str(e.value)


def test_a_real_ctrl_c_during_user_code_stays_a_keyboard_interrupt():
    before = signal.signal(signal.SIGINT, signal.default_int_handler)   # Python's own, as in a fresh CLI
    try:
        with pytest.raises(KeyboardInterrupt):
            with user_code("the model builder x"):
                os.kill(os.getpid(), signal.SIGINT)
                for _ in range(1000):   # the handler runs between bytecodes
                    pass
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, before)


def test_a_module_that_exits_on_import_is_one_line(tmp_path):
    (tmp_path / "exits_on_import.py").write_text("import sys\nsys.exit(0)\n")
    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(UserCodeExit, match=r"importing exits_on_import called sys\.exit\(0\)"):
            models.resolve("exits_on_import:build")
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("exits_on_import", None)

"""--run_name names one directory under runs/: a path, a control character, a blank or a long name is refused;
so is a --model_dir with a newline."""

from __future__ import annotations

import pytest

from tfps.config import MAX_RUN_NAME, RunConfig
from tfps.errors import ConfigError


@pytest.mark.parametrize("name, words", [
    ("../..", "path separator"),
    ("/etc/passwd", "path separator"),
    ("a/b", "path separator"),
    ("a\\b", "path separator"),
    ("exp\nx-injected: 1", "control character"),
    ("exp\x00", "control character"),
    ("exp\x1b[31m", "control character"),
    ("exp\u2028", "control character"),
    (".", "is not a name"),
    (" ", "is not a name"),
    ("", "is not a name"),
    (" exp", "white space"),
    ("..", "is not a name"),
    ("x" * (MAX_RUN_NAME + 1), f"at most {MAX_RUN_NAME}"),
    ("é" * MAX_RUN_NAME + "x", f"at most {MAX_RUN_NAME}"),
    ("\U0001F600" * 60, "bytes"),      # 60 characters, 240 bytes: over a file name's 255 with runs/NAME-TIME
])
def test_a_bad_run_name_is_refused_before_start(name, words):
    with pytest.raises(ConfigError) as e:
        RunConfig(run_name=name).validate()
    assert e.value.field == "run_name"
    assert words in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("name", ["exp[lr=0.01]", "tfps-mlp", "run.1", "a*b?c", "x" * MAX_RUN_NAME, "jöb ü", None])
def test_a_plain_name_is_accepted(name):
    assert RunConfig(run_name=name).validate().run_name == name


@pytest.mark.parametrize("field, path, words", [
    ("model_dir", "runs/exp\n1", "control character ('\\n')"),
    ("model_dir", "runs/exp\r", "control character"),
    ("model_dir", " ", "only white space"),
    ("export_dir", "out\nput", "control character"),
])
def test_a_directory_with_a_newline_or_only_blanks_is_refused(field, path, words):
    with pytest.raises(ConfigError) as e:
        RunConfig(**{field: path}).validate()
    assert e.value.field == field
    assert words in str(e.value), str(e.value)
    assert "\n" not in str(e.value)


def test_a_directory_with_spaces_inside_is_accepted():
    assert RunConfig(model_dir="runs/my exp").validate().model_dir == "runs/my exp"

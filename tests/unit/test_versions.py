"""One TensorFlow version (issue 36 item 4): ``tfps.compat.TENSORFLOW_VERSION``.

pyproject.toml, the Makefile, the Dockerfile, the README, the docs and the examples cannot
import Python, so they write the version as text; this test reads them all and checks that
every pin of tensorflow, tensorflow-cpu, tensorflow[and-cuda], tf_keras and tensorboard names
that version, and that tfps's own code writes no pin but derives it from the constant.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tfps import compat

REPO = Path(__file__).resolve().parents[2]

#: A pin of a TensorFlow package: its name, the operator and the version's major.minor.
PIN = re.compile(r"\b(tensorflow(?:-cpu|-gpu|\[and-cuda\])?|tf_keras|tensorboard)\s*(==|>=|~=)\s*(\d+\.\d+)")

#: The files that pin TensorFlow as text, with how many pins each holds at least (a pin
#: rewritten into a form the pattern misses fails here rather than going unchecked).
TEXT_FILES = {"pyproject.toml": 5, "Makefile": 1, "Dockerfile": 4, "README.md": 3, ".ci/build-image.sh": 1,
              "examples/keras_model.py": 1}


def _pins(text: str) -> list[tuple[str, str, str]]:
    return PIN.findall(text)


def test_the_version_is_one_constant():
    assert re.fullmatch(r"\d+\.\d+", compat.TENSORFLOW_VERSION)
    assert compat.TF_KERAS_VERSION == compat.TENSORFLOW_VERSION
    assert f"tf_keras=={compat.TENSORFLOW_VERSION}.*" in compat.TF_KERAS_INSTALL


def test_every_text_file_pins_the_same_tensorflow():
    want = compat.TENSORFLOW_VERSION
    files = {**TEXT_FILES, **{str(p.relative_to(REPO)): 0 for p in sorted((REPO / "docs").rglob("*.md"))}}
    wrong = []
    for name, at_least in files.items():
        pins = _pins((REPO / name).read_text())
        assert len(pins) >= at_least, f"{name}: {len(pins)} TensorFlow pin(s) found, expected {at_least} or more"
        wrong += [f"{name}: {pkg}{op}{version}" for pkg, op, version in pins if version != want]
    assert not wrong, f"pins other than TensorFlow {want} (tfps.compat.TENSORFLOW_VERSION): {wrong}"


def test_pyprojects_extras_install_that_tensorflow():
    tomllib = pytest.importorskip("tomllib")   # Python 3.11+
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    want = compat.TENSORFLOW_VERSION
    # "tensorflow", the distribution tf_keras requires: tfps[cpu,keras] installs one TensorFlow.
    assert extras["cpu"] == [f"tensorflow=={want}.*"]
    assert extras["gpu"] == [f"tensorflow[and-cuda]=={want}.*"]
    assert extras["keras"] == [f"tf_keras=={want}.*"]
    assert f"tensorboard>={want},<3" in project["dependencies"]


def test_the_makefile_and_the_dockerfile_install_that_tensorflow():
    want = compat.TENSORFLOW_VERSION
    make = (REPO / "Makefile").read_text()
    assert re.search(rf"^TF_KERAS \?= 'tf_keras=={re.escape(want)}\.\*'$", make, re.M)
    docker = (REPO / "Dockerfile").read_text()
    assert re.search(rf"^ARG TF_PACKAGE=tensorflow-cpu=={re.escape(want)}\.\d+$", docker, re.M)
    assert re.search(rf"^ARG TF_KERAS_PACKAGE=tf_keras=={re.escape(want)}\.\*$", docker, re.M)


def test_tfps_code_derives_the_version_and_writes_no_pin():
    pins = {str(p.relative_to(REPO)): _pins(p.read_text()) for p in sorted((REPO / "tfps").rglob("*.py"))}
    assert {name: found for name, found in pins.items() if found} == {}
    literal = re.compile(rf"""["']{re.escape(compat.TENSORFLOW_VERSION)}["']""")
    written = [str(p.relative_to(REPO)) for p in sorted((REPO / "tfps").rglob("*.py")) if literal.search(p.read_text())]
    assert written == ["tfps/compat/__init__.py"]


def test_the_changelog_dates_this_version_and_the_collection_takes_it():
    """tfps's own version, tfps.__version__, has a dated CHANGELOG.md section (Keep a Changelog),
    and the Galaxy collection writes no version of its own (galaxy/build.py fills it in)."""
    import yaml

    import tfps
    changelog = (REPO / "CHANGELOG.md").read_text()
    assert re.search(rf"^## \[{re.escape(tfps.__version__)}\] - \d{{4}}-\d{{2}}-\d{{2}}$", changelog, re.M)
    assert "version" not in yaml.safe_load((REPO / "galaxy" / "galaxy.yml").read_text())

"""A Keras model where tf_keras is missing: one line with the install command that fits
this environment, never "fix the builder"."""

from __future__ import annotations

import sys
from importlib import metadata

import pytest

from tfps import models
from tfps.errors import ConfigError
from tfps.models import keras_model


@pytest.mark.parametrize("have_tensorflow, command", [
    (False, "pip install --no-deps 'tf_keras==2.21.*'"),   # next to tensorflow-cpu: no second TensorFlow
    (True, "pip install 'tf_keras==2.21.*'"),
])
def test_the_install_command_fits_the_tensorflow_installed(monkeypatch, have_tensorflow, command):
    real = metadata.version

    def version(name):
        if name == "tensorflow" and not have_tensorflow:
            raise metadata.PackageNotFoundError(name)
        return "2.21.0" if name == "tensorflow" else real(name)
    monkeypatch.setattr(metadata, "version", version)
    assert keras_model.tf_keras_install() == command


def test_tf_keras_asked_for_by_tf_keras_and_not_installed_is_named(monkeypatch):
    """TensorFlow's own error for tf.keras without tf_keras, raised in the builder."""
    monkeypatch.setattr(keras_model, "tf_keras_install", lambda: "pip install X")
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tf_keras" else real(name, *a))

    def build_model():
        raise ImportError("Keras cannot be imported. Check that it is installed.")
    with pytest.raises(ConfigError) as e:
        keras_model.KerasBuilder(build_model, "mymodels.small:build_model").call(None)
    assert str(e.value) == ("model: mymodels.small:build_model builds a Keras model, and tf_keras (Keras 2, what "
                            "tf.keras is under tfps) is not installed here; install it: pip install X")


def test_a_model_module_importing_missing_tf_keras_is_named(monkeypatch, tmp_path):
    (tmp_path / "kerasmod_missing.py").write_text("import tf_keras as keras\n\ndef build_model():\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, "tf_keras", None)
    monkeypatch.setattr(keras_model, "tf_keras_install", lambda: "pip install X")
    with pytest.raises(ConfigError) as e:
        models.resolve("kerasmod_missing:build_model")
    assert str(e.value) == ("model: kerasmod_missing imports Keras, and tf_keras (Keras 2, what tf.keras is under "
                            "tfps) is not installed here; install it: pip install X")
    assert "fix the builder" not in str(e.value) and "PYTHONPATH" not in str(e.value)


def test_other_errors_still_name_the_builder():
    def build_model():
        raise ValueError("bad units")
    with pytest.raises(ConfigError, match="raised ValueError: bad units.*fix the builder"):
        keras_model.KerasBuilder(build_model, "m:build_model").call(None)

#!/usr/bin/env bash
# `make test-next`: the compat self-check and the unit and integration suites against the newest
# TensorFlow pre-release (or NEXT_TF=...), in a venv of its own (.venv-next), before its users arrive.
# tf_keras follows TensorFlow minor for minor; while no tf_keras of the pre-release's minor exists,
# it is left out and the Keras tests are deselected by name (KERAS_TESTS). Not part of `make test`.
# What broke on the last try, and why it stays: docs/design/next-tensorflow.md.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${NEXT_VENV:-.venv-next}
PYTHON=${PYTHON:-python3}
NEXT_TF=${NEXT_TF:-}
if [ -z "$NEXT_TF" ]; then
  NEXT_TF=$("$PYTHON" -m pip index versions tensorflow-cpu --pre 2>/dev/null | sed -n 's/^tensorflow-cpu (\(.*\))$/\1/p')
fi
[ -n "$NEXT_TF" ] || { echo "test-next: cannot read the newest tensorflow-cpu from the package index" >&2; exit 2; }
minor=${NEXT_TF%.*}; minor=${minor%%rc*}
stamp="$VENV/.tfps-next-$NEXT_TF"
if [ ! -e "$stamp" ]; then
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --upgrade pip
  "$VENV/bin/pip" install --quiet --pre "tensorflow-cpu==$NEXT_TF"
  # tfps's own dependencies and the dev tools, without letting pip move TensorFlow back.
  "$VENV/bin/pip" install --quiet -e '.[dev]' "tensorflow-cpu==$NEXT_TF"
  if "$VENV/bin/pip" install --quiet --no-deps "tf_keras==$minor.*" 2>/dev/null; then
    echo "test-next: tf_keras $minor installed"
  else
    echo "test-next: no tf_keras $minor on the package index: the Keras tests are deselected"
  fi
  touch "$stamp"
fi
# Tests that build a Keras model without saying so in their names are listed too.
KERAS_TESTS="keras or Keras or clipnorm or tf_keras or text_column or one_sigmoid_unit or lambda_metric"
select=()
"$VENV/bin/python" -c "import tf_keras" 2>/dev/null || select=(-k "not ($KERAS_TESTS)")
echo "test-next: TensorFlow $("$VENV/bin/python" -c 'import tensorflow as tf; print(tf.__version__)' 2>/dev/null)"
TF_CPP_MIN_LOG_LEVEL=3 "$VENV/bin/python" -c "
import tfps.task as t; t.import_tensorflow()
from tfps import compat
compat.check_tensorflow()
print('test-next: the compat self-check passes:', len(compat.PATCHES), 'run-time patches fit')"
# NEXT_TESTS narrows the run (e.g. NEXT_TESTS=tests/unit); arguments go to pytest.
read -r -a tests <<< "${NEXT_TESTS:-tests/unit tests/integration}"
exec "$VENV/bin/pytest" -q -rs -p no:cacheprovider "${tests[@]}" "${select[@]}" "$@"

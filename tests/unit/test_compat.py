"""tfps.compat: the one home of TensorFlow's and tf_keras's internals, and its start-up check.

The check passes on the TensorFlow and tf_keras installed here; with one internal taken
away it names that one, and a task refuses to start with that one line. The accessors
return what the real objects hold. And no other tfps module names an internal.
"""

from __future__ import annotations

import ast
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tfps import compat
from tfps.errors import ConfigError

tf = pytest.importorskip("tensorflow")
v1 = tf.compat.v1

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "tfps"

#: The private names of TensorFlow and tf_keras that tfps uses: only tfps/compat/ may name them.
PRIVATE = {
    "_sync_token_queue", "_timer", "_global_step_tensor", "_session_manager",
    "_get_session_manager", "_master", "_config", "_checkpoint_dir", "_scaffold", "_compile_config",
    "_fn", "_fn_kwargs", "_apply_sparse", "_resource_apply_sparse", "_get_beta_accumulators", "_lr_t",
    "_beta1_t", "_beta2_t", "_epsilon_t", "_use_locking", "_create_slots", "_zeros_slot",
    "_exclude_from_weight_decay", "_exclude_from_weight_decay_names",
}
#: Internal modules and files of TensorFlow and tf_keras.
INTERNAL_PREFIXES = ("tensorflow.python", "tensorflow.core", "tf_keras.src", "keras.src", "libtensorflow")
#: Private attributes that are tfps's own, set on objects of other libraries.
OWN_PRIVATE = {"_tfps"}   # tfps.logs marks its logging handler


def _needs(what: str, where: str, package: str = "TensorFlow") -> str:
    return rf"^tfps needs {re.escape(what)} from {package} 2\.21's {re.escape(where)}; this is {package} \S+"


# ----------------------------------------------------------------------- the self-check
def test_the_check_passes_on_this_tensorflow_and_tf_keras():
    compat.check_tensorflow()
    pytest.importorskip("tf_keras")
    compat.check_tf_keras()


def test_a_missing_optimizer_internal_is_named(monkeypatch):
    monkeypatch.delattr(v1.train.Optimizer, "_resource_apply_sparse")
    with pytest.raises(ConfigError, match=_needs("_resource_apply_sparse", "tf.compat.v1.train.Optimizer")) as e:
        compat.check_tensorflow()
    assert "\n" not in str(e.value)
    assert tf.__version__ in str(e.value)


def test_several_missing_internals_are_one_line(monkeypatch):
    monkeypatch.delattr(v1.train.Optimizer, "_resource_apply_sparse")
    monkeypatch.delattr(v1.train.AdamOptimizer, "_get_beta_accumulators")
    with pytest.raises(ConfigError, match=r"_resource_apply_sparse .*\(and 1 more\)\. Install TensorFlow 2\.21") as e:
        compat.check_tensorflow()
    assert "\n" not in str(e.value)


def test_a_missing_tf_keras_internal_is_named(monkeypatch):
    keras = pytest.importorskip("tf_keras")

    def init(self, fn, name=None, dtype=None, **kwargs):   # keeps its function elsewhere
        keras.metrics.Mean.__init__(self, name=name, dtype=dtype)

    monkeypatch.setattr(keras.metrics.MeanMetricWrapper, "__init__", init)
    with pytest.raises(ConfigError, match=_needs("_fn", "tf_keras.metrics.MeanMetricWrapper.__init__",
                                                 "tf_keras")):
        compat.check_tf_keras()
    # A task's start checks tf_keras too once it is loaded.
    with pytest.raises(ConfigError, match="from tf_keras 2.21's"):
        compat.check_tensorflow()


def test_a_task_refuses_to_start_with_one_line():
    """``tfps run`` on a TensorFlow without an internal: exit code 2 and the one line, no traceback."""
    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    code = ("import sys, tensorflow as tf\n"
            "del tf.compat.v1.train.Optimizer._resource_apply_sparse\n"
            "from tfps.cli import main\n"
            f"sys.exit(main(['run', '--ps_hosts', '127.0.0.1:{ports[0]}', '--worker_hosts', "
            f"'127.0.0.1:{ports[1]}', '--job_name', 'ps', '--task_index', '0']))\n")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, env=env, cwd=REPO,
                       check=False)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("tfps")]
    assert len(lines) == 1, r.stderr
    assert re.match(r"^tfps: error: " + _needs("_resource_apply_sparse", "tf.compat.v1.train.Optimizer")[1:],
                    lines[0]), lines[0]
    assert "Traceback" not in r.stderr


# ----------------------------------------------------------------------- the accessors
def test_session_creators_give_back_what_they_were_given():
    config = v1.ConfigProto(intra_op_parallelism_threads=1)
    scaffold = v1.train.Scaffold()
    chief = v1.train.ChiefSessionCreator(scaffold=scaffold, master="grpc://127.0.0.1:1", config=config,
                                         checkpoint_dir="/some/dir")
    assert compat.session_creator_master(chief) == "grpc://127.0.0.1:1"
    assert compat.session_creator_config(chief) is config
    assert compat.session_creator_checkpoint_dir(chief) == "/some/dir"
    assert compat.session_creator_scaffold(chief) is scaffold
    worker = v1.train.WorkerSessionCreator(master="grpc://127.0.0.1:2")
    assert isinstance(compat.session_creator_scaffold(worker), v1.train.Scaffold)   # TensorFlow's default one
    assert compat.session_creator_session_manager(worker) is None
    manager = v1.train.SessionManager(recovery_wait_secs=1)
    compat.set_session_creator_session_manager(worker, manager)
    assert compat.session_creator_session_manager(worker) is manager


def test_the_checkpoint_hook_timer_counts_from_a_given_step():
    hook = v1.train.CheckpointSaverHook("/tmp/unused", save_steps=100)
    timer = compat.checkpoint_saver_timer(hook)
    timer.update_last_triggered_step(40)
    assert not timer.should_trigger_for_step(139)
    assert timer.should_trigger_for_step(140)


def test_lazy_adam_touches_only_the_given_rows():
    from tfps.task.graph.optimizers import lazy_adam_class
    cls = lazy_adam_class()
    assert issubclass(cls, v1.train.AdamOptimizer) and cls.__name__ == "LazyAdamOptimizer"
    g = tf.Graph()
    with g.as_default():
        table = v1.get_variable("table", initializer=tf.ones([4, 2]))
        loss = tf.reduce_sum(tf.nn.embedding_lookup(table, [1]))
        train = cls(0.1).minimize(loss)
        with v1.Session(graph=g) as s:
            s.run(v1.global_variables_initializer())
            s.run(train)
            rows = s.run(table)
    assert (rows[[0, 2, 3]] == 1.0).all()
    assert rows[1] == pytest.approx([0.9, 0.9], abs=1e-4)   # Adam's first step: lr * sign


def test_keras_compile_config_and_metric_functions():
    keras = pytest.importorskip("tf_keras")
    top3 = keras.metrics.SparseTopKCategoricalAccuracy(k=3)

    def mine(y, p):
        return p

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5)])
    assert compat.keras_compile_config(model) == {}
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=[top3, mine])
    assert compat.keras_compile_config(model)["metrics"] == [top3, mine]   # the objects themselves
    fn, kwargs = compat.keras_metric_fn(top3)
    assert callable(fn) and kwargs == {"k": 3}
    assert compat.keras_metric_fn(mine) == (None, {})


def test_keras_weights_are_wrapped_only_inside():
    keras = pytest.importorskip("tf_keras")
    seen = []

    def wrap(original):
        def add_weight(self, *args, **kwargs):
            seen.append(kwargs.get("name") or args[0])
            return original(self, *args, **kwargs)
        return add_weight

    with compat.keras_add_weight_wrapped(wrap):
        keras.layers.Dense(2, name="inside")(tf.zeros([1, 3]))
    keras.layers.Dense(2, name="outside")(tf.zeros([1, 3]))
    assert seen == ["kernel", "bias"]


# ----------------------------------------------------------------------- the quarantine
def _offences(path: Path, root: Path = REPO) -> list[str]:
    found = []
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        where = f"{path.relative_to(root)}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Attribute) and node.attr in PRIVATE:
            found.append(f"{where} .{node.attr}")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in PRIVATE:
            found.append(f"{where} def {node.name} (overrides an internal)")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value in PRIVATE or node.value.startswith(INTERNAL_PREFIXES):
                found.append(f"{where} {node.value!r}")
        elif isinstance(node, ast.Import):
            found += [f"{where} import {a.name}" for a in node.names if a.name.startswith(INTERNAL_PREFIXES)]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(INTERNAL_PREFIXES):
            found.append(f"{where} from {node.module} import")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "hasattr", "setattr", "delattr") and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
              and node.args[1].value.startswith("_") and not node.args[1].value.startswith("__")
              and node.args[1].value not in OWN_PRIVATE):
            found.append(f"{where} {node.func.id}(..., {node.args[1].value!r})")
    return found


def test_no_module_but_compat_names_an_internal():
    # The playbooks' plugins (and the collections installed next to them) run inside ansible-core.
    offences = [o for path in sorted(PACKAGE.rglob("*.py"))
                if PACKAGE / "compat" not in path.parents
                and "ansible" not in path.relative_to(PACKAGE).parts
                for o in _offences(path)]
    assert offences == [], "move these into tfps/compat/ as named accessors:\n" + "\n".join(offences)


def test_the_quarantine_test_sees_an_offence(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from tensorflow.python.ops import array_ops\n"
                   "def f(op, opt, m):\n"
                   "    op._zeros_slot(None, 'm', 'm')\n"
                   "    return getattr(opt, '_sync_token_queue', None), getattr(m, '_anything')\n")
    found = " ".join(_offences(bad, tmp_path))
    for word in ("tensorflow.python.ops", "._zeros_slot", "'_sync_token_queue'", "'_anything'"):
        assert word in found

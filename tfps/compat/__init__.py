"""Every private attribute of TensorFlow and tf_keras that tfps touches, in one place.

tfps trains with ``tf.compat.v1`` machinery whose public API leaves a few things out
(a session creator's master, a Keras model's compile() arguments as given). Each such
access is a named function here, and nothing else in tfps names a private attribute,
imports ``tensorflow.python...`` or ``tf_keras.src...``, or patches their classes
(``tests/unit/test_compat.py`` keeps it so). Every patch tfps applies to another library at run
time is named in ``tfps.compat.patches`` and checked when a task starts
(``tests/unit/test_patches.py`` finds one applied anywhere else).

A new TensorFlow or tf_keras may rename any of them. Rather than fail in the middle of a
job (or, worse, silently train differently), every task checks them when it starts:
``check_tensorflow()`` (and ``check_tf_keras()`` where tf_keras is used) refuses to run
with one line, ``tfps needs X from TensorFlow <TENSORFLOW_VERSION>'s Y; this is TensorFlow Z``. The checks
look at classes and their code only (no graph, no session), a few milliseconds.

This module imports neither TensorFlow nor tf_keras at the top: ``import tensorflow`` is
``tfps.task.import_tensorflow``'s job, and the CLI must stay light.
"""

from __future__ import annotations

import contextlib
import contextvars
import dis
import functools
import glob
import importlib
import importlib.util
import inspect
import os
import sys
from typing import NoReturn

from tfps.errors import ConfigError

#: The TensorFlow release whose internals this module was written against: tfps's one
#: TensorFlow version. pyproject.toml's extras and tensorboard pin, the Makefile, the
#: Dockerfile, the README and the examples write it as text and follow this constant
#: (``tests/unit/test_versions.py`` reads them all); tfps's own code derives it from here.
TENSORFLOW_VERSION = "2.21"
#: tf_keras is released with TensorFlow, minor for minor.
TF_KERAS_VERSION = TENSORFLOW_VERSION
#: How to add tf_keras to tensorflow-cpu: without its dependencies (it requires the package
#: "tensorflow", which tensorflow-cpu is under another name).
TF_KERAS_INSTALL = f"pip install --no-deps 'tf_keras=={TF_KERAS_VERSION}.*'"

_INSTALL = {"TensorFlow": f"pip install 'tfps[cpu]' (tensorflow=={TENSORFLOW_VERSION}.*)",
            "tf_keras": TF_KERAS_INSTALL}


def _refuse(package: str, have: str, missing: list[tuple[str, str]]) -> NoReturn:
    """Refuse with one line that names the first missing internal (and how many more there are)."""
    what, where = missing[0]
    want = TENSORFLOW_VERSION if package == "TensorFlow" else TF_KERAS_VERSION
    more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
    raise ConfigError(f"tfps needs {what} from {package} {want}'s {where}; this is {package} {have}{more}. "
                       f"Install {package} {want}: {_INSTALL[package]}")


def _code_objects(func):
    code = getattr(inspect.unwrap(func), "__code__", None)
    stack = [code] if code is not None else []
    while stack:
        c = stack.pop()
        yield c
        stack.extend(k for k in c.co_consts if inspect.iscode(k))


def _stores(func, attr: str) -> bool:
    """Whether ``func`` (or a function nested in it) assigns ``self.<attr>``: how an attribute
    that exists on instances only is checked without building one."""
    return any(i.opname == "STORE_ATTR" and i.argval == attr
               for code in _code_objects(func) for i in dis.get_instructions(code))


# =================================================================== TensorFlow
#: The library whose gRPC server calls ``bind`` (tfps.task.net.loopback patches its GOT entry).
TF_CC_LIBRARY = "libtensorflow_cc.so"

#: What ``import tensorflow`` imports eagerly only to register Keras's optimizers
#: (tensorflow/__init__.py): ``tfps.task.import_tensorflow`` blocks them during the import.
#: Should a new TensorFlow stop importing them, the block does nothing; no check needed.
TF_EAGER_KERAS_MODULES = ("keras.src.optimizers", "tf_keras.src.optimizers")


def _tensorflow_missing(tf) -> list[tuple[str, str]]:
    """(internal, where) of each internal this TensorFlow lacks."""
    v1 = tf.compat.v1
    t = v1.train
    missing: list[tuple[str, str]] = []

    def has(owner, attr: str, where: str) -> None:
        if not hasattr(owner, attr):
            missing.append((attr, where))

    def stored(func, attr: str, where: str) -> None:
        if func is None or not _stores(func, attr):
            missing.append((attr, where))

    for cls, attrs in ((t.ChiefSessionCreator, ("_scaffold", "_master", "_config", "_checkpoint_dir",
                                                "_session_manager")),
                       (t.WorkerSessionCreator, ("_scaffold", "_master", "_config", "_session_manager"))):
        for attr in attrs:
            stored(cls.__init__, attr, f"tf.compat.v1.train.{cls.__name__}.__init__")
        # Its create_session takes the session manager set here (set_session_creator_session_manager).
        has(cls, "_get_session_manager", f"tf.compat.v1.train.{cls.__name__}")
        stored(getattr(cls, "_get_session_manager", None), "_session_manager",
               f"tf.compat.v1.train.{cls.__name__}._get_session_manager")
    stored(t.CheckpointSaverHook.__init__, "_timer", "tf.compat.v1.train.CheckpointSaverHook.__init__")
    stored(t.CheckpointSaverHook.begin, "_global_step_tensor", "tf.compat.v1.train.CheckpointSaverHook.begin")
    has(t.CheckpointSaverHook, "_save", "tf.compat.v1.train.CheckpointSaverHook")
    has(t.SecondOrStepTimer, "update_last_triggered_step", "tf.compat.v1.train.SecondOrStepTimer")
    for attr in ("_apply_sparse", "_resource_apply_sparse"):
        has(t.Optimizer, attr, "tf.compat.v1.train.Optimizer")
    stored(t.Optimizer.__init__, "_use_locking", "tf.compat.v1.train.Optimizer.__init__")
    has(t.AdamOptimizer, "_get_beta_accumulators", "tf.compat.v1.train.AdamOptimizer")
    for attr in ("_create_slots", "_zeros_slot"):
        has(t.Optimizer, attr, "tf.compat.v1.train.Optimizer")
    stored(t.Optimizer.__init__, "_name", "tf.compat.v1.train.Optimizer.__init__")
    rms_slots = {c for code in _code_objects(getattr(t.RMSPropOptimizer, "_create_slots", None))
                 for c in code.co_consts if isinstance(c, str)}
    if not {"rms", "mg", "momentum"} <= rms_slots:
        missing.append(("the slots rms, mg, momentum", "tf.compat.v1.train.RMSPropOptimizer._create_slots"))
    for attr in ("_lr_t", "_beta1_t", "_beta2_t", "_epsilon_t"):
        stored(getattr(t.AdamOptimizer, "_prepare", None), attr, "tf.compat.v1.train.AdamOptimizer._prepare")
    step_read_key = getattr(importlib.import_module(_TRAINING_UTIL), "GLOBAL_STEP_READ_KEY", None)
    if step_read_key != GLOBAL_STEP_READ_KEY:
        missing.append((f"GLOBAL_STEP_READ_KEY {GLOBAL_STEP_READ_KEY!r}", _TRAINING_UTIL))
    saveables = importlib.import_module(_SAVEABLE_OBJECT)
    for attr in ("SaveableObject", "SaveSpec"):
        if not isinstance(getattr(saveables, attr, None), type):
            missing.append((attr, _SAVEABLE_OBJECT))
    if not callable(getattr(getattr(importlib.import_module(_SAVER), "BulkSaverBuilder", None), "bulk_restore", None)):
        missing.append(("BulkSaverBuilder.bulk_restore", _SAVER))
    if not glob.glob(os.path.join(os.path.dirname(tf.__file__), TF_CC_LIBRARY + "*")):
        missing.append((TF_CC_LIBRARY, "package directory"))
    return missing


def check_tensorflow() -> None:
    """Refuse (ConfigError, one line) a TensorFlow that lacks an internal tfps uses.

    Run at the start of every task (``tfps.task.run_task``), after TensorFlow is imported;
    also checks tf_keras when it is already loaded.
    """
    import tensorflow as tf
    missing = _tensorflow_missing(tf)
    if missing:
        _refuse("TensorFlow", tf.__version__, missing)
    check_patches()
    if "tf_keras" in sys.modules:
        check_tf_keras()


# --------------------------------------------------------------- saveables of our own
_SAVEABLE_OBJECT = "tensorflow.python.training.saving.saveable_object"


def saveable_classes() -> tuple[type, type]:
    """(SaveableObject, SaveSpec): what a ``tf.compat.v1.train.Saver`` takes besides variables.

    ``tfps.layers.DynamicEmbedding`` saves its live rows through one (the Saver's public
    ``var_list`` accepts them; the classes themselves have no public name)."""
    module = importlib.import_module(_SAVEABLE_OBJECT)
    return module.SaveableObject, module.SaveSpec


_SAVER = "tensorflow.python.training.saver"


def bulk_saver_builder() -> type:
    """TensorFlow's ``BulkSaverBuilder``: what a ``tf.compat.v1.train.Saver(builder=...)`` builds
    its save and restore ops with (one RestoreV2 for every tensor, in ``bulk_restore``).
    ``tfps.layers.dynamic_embedding.saver_builder`` subclasses it to restore a table's
    admission counts that a checkpoint lacks as zeros."""
    return importlib.import_module(_SAVER).BulkSaverBuilder


# --------------------------------------------------------------- the global step's read
_TRAINING_UTIL = "tensorflow.python.training.training_util"
#: The collection in which TensorFlow's hooks (StopAtStepHook, CheckpointSaverHook,
#: SummarySaverHook, StepCounterHook) look for the global step's read tensor, and where the
#: first of them makes one when it is empty.
GLOBAL_STEP_READ_KEY = "global_step_read_op_cache"


def share_global_step_read(graph, tensor) -> None:
    """Make ``tensor`` the global step's read that TensorFlow's hooks fetch.

    The one they make themselves, a ``cond`` on whether the variable is initialised built
    outside any device scope, is split between the worker and the ps: 6 transfers every
    ``session.run``. A graph whose own read is there already is left as it is.
    """
    if not graph.get_collection(GLOBAL_STEP_READ_KEY):
        graph.add_to_collection(GLOBAL_STEP_READ_KEY, tensor)


# --------------------------------------------------------------- checkpoint paths taken literally
_CHECKPOINT_MANAGEMENT = "tensorflow.python.checkpoint.checkpoint_management"
#: What a TensorFlow file pattern (fnmatch) reads as other than itself; a backslash quotes one.
GLOB_SPECIAL = "*?[]\\"


def parser_actions(parser) -> list:
    """Every action (option, positional, subcommand group) of an ``argparse`` parser, in
    order: argparse keeps them in ``_actions`` and has no public way to list them."""
    return list(parser._actions)


def subcommands(parser) -> dict:
    """Command name -> sub-parser of an ``argparse`` parser's ``add_subparsers()`` group
    (aliases included), {} when it has none."""
    import argparse
    return {name: sub for a in parser._actions if isinstance(a, argparse._SubParsersAction)
            for name, sub in a.choices.items()}


def escape_glob_directory(pattern: str) -> str:
    """``pattern`` with its directory taken literally (``exp[lr=0.01]/model.ckpt-1.data-?????`` ->
    ``exp\\[lr=0.01\\]/model.ckpt-1.data-?????``): its last part keeps TensorFlow's own wildcards."""
    head, tail = os.path.split(pattern)
    return os.path.join("".join("\\" + c if c in GLOB_SPECIAL else c for c in head), tail) if head else pattern


class _LiteralDirectories:
    """TensorFlow's ``file_io`` as its checkpoint bookkeeping sees it: every pattern's directory
    is a path, not a glob (what it globs is the checkpoint's own name: ``.data-?????-of-?????``)."""

    def __init__(self, file_io):
        self.file_io = file_io

    def __getattr__(self, name: str):
        return getattr(self.file_io, name)

    def get_matching_files(self, filename):
        if isinstance(filename, str):
            filename = escape_glob_directory(filename)
        elif isinstance(filename, (list, tuple)):
            filename = [escape_glob_directory(f) if isinstance(f, str) else f for f in filename]
        return self.file_io.get_matching_files(filename)


def literal_checkpoint_directories() -> None:
    """Make TensorFlow find, restore and delete checkpoints in a directory whose name holds
    ``[``, ``]``, ``*``, ``?`` or ``\\`` (``runs/exp[lr=0.01]-...``).

    ``tf.train.latest_checkpoint``, ``Saver.restore`` (via ``checkpoint_exists_internal``) and
    the Saver's removal of old checkpoints glob the checkpoint's path: ``exp[lr=0.01]`` is then
    a character class, the newest checkpoint is "not found" and old ones are never removed.
    Their module's ``file_io`` is given patterns whose directory is quoted. Idempotent; run at
    the start of every task (``tfps.task.run_task``).
    """
    module = importlib.import_module(_CHECKPOINT_MANAGEMENT)
    if not isinstance(module.file_io, _LiteralDirectories):
        module.file_io = _LiteralDirectories(module.file_io)


# --------------------------------------------------------------- session creators
def session_creator_scaffold(creator):
    """The Scaffold of a Chief/WorkerSessionCreator (a default one when none was given)."""
    return creator._scaffold


def session_creator_master(creator) -> str:
    """The target (``grpc://host:port``) a Chief/WorkerSessionCreator opens sessions on."""
    return creator._master


def session_creator_config(creator):
    """The ConfigProto a Chief/WorkerSessionCreator opens sessions with."""
    return creator._config


def session_creator_checkpoint_dir(creator) -> str | None:
    """The directory a ChiefSessionCreator restores from."""
    return creator._checkpoint_dir


def session_creator_session_manager(creator):
    """The SessionManager a Chief/WorkerSessionCreator has made so far, or None."""
    return creator._session_manager


def set_session_creator_session_manager(creator, manager) -> None:
    """Give a Chief/WorkerSessionCreator the SessionManager its ``create_session`` uses
    (TensorFlow makes one with a 30 s ``recovery_wait_secs`` and no way to pass another)."""
    creator._session_manager = manager


# --------------------------------------------------------------- hooks
def checkpoint_saver_timer(hook):
    """The SecondOrStepTimer that decides when a CheckpointSaverHook saves next."""
    return hook._timer


def checkpoint_saver_save(hook, session, step: int) -> bool:
    """A CheckpointSaverHook's save of ``step`` with its listeners (True: one asks to stop)."""
    return hook._save(session, step)


def checkpoint_saver_global_step(hook):
    """The global step tensor a CheckpointSaverHook reads (set in its ``begin``)."""
    return hook._global_step_tensor


# --------------------------------------------------------------- v1 optimizers
def adam_hyper_tensors(opt) -> tuple:
    """(learning rate, beta1, beta2, epsilon) tensors of a v1 AdamOptimizer, as its
    ``_prepare`` made them for the update being built."""
    return opt._lr_t, opt._beta1_t, opt._beta2_t, opt._epsilon_t


def adam_beta_powers(opt) -> tuple:
    """(beta1 ** t, beta2 ** t) accumulators of a v1 AdamOptimizer."""
    return opt._get_beta_accumulators()


def optimizer_use_locking(opt) -> bool:
    """The ``use_locking`` a v1 optimizer was made with."""
    return opt._use_locking


def with_sparse_updates(base: type, name: str, apply_sparse, resource_apply_sparse) -> type:
    """A subclass of the v1 optimizer ``base`` whose sparse updates are the given functions.

    ``apply_sparse(self, grad, var)`` (an IndexedSlices gradient of a ref variable) and
    ``resource_apply_sparse(self, grad, var, indices)`` (of a resource variable) are the
    methods TensorFlow's v1 ``Optimizer`` documents for subclasses to override.
    """
    return type(name, (base,), {"_apply_sparse": apply_sparse, "_resource_apply_sparse": resource_apply_sparse,
                                "__module__": getattr(apply_sparse, "__module__", __name__),
                                "__qualname__": name, "__doc__": base.__doc__})


def with_zeros_slots(base: type, name: str, slots: tuple) -> type:
    """A subclass of the v1 optimizer ``base`` whose ``slots`` (names) all start at zero.

    ``tf.compat.v1.train.RMSPropOptimizer`` starts its mean square ("rms") at one; Keras's
    RMSprop starts it at zero, and with this subclass the update is Keras's, step for step.
    ``_create_slots`` and ``_zeros_slot`` are what TensorFlow's v1 optimizers build their
    slots with.
    """
    def create_slots(self, var_list):
        for v in var_list:
            for slot in slots:
                self._zeros_slot(v, slot, self._name)
    return type(name, (base,), {"_create_slots": create_slots, "__module__": __name__, "__qualname__": name,
                                "__doc__": base.__doc__})


# =================================================================== tf_keras
#: tf_keras's graph-mode layer bases, whose ``add_weight`` tfps.task.graph.keras_weights wraps.
TF_KERAS_LAYER_MODULES = ("tf_keras.src.engine.base_layer", "tf_keras.src.engine.base_layer_v1")


def _tf_keras_missing(keras) -> list[tuple[str, str]]:
    missing: list[tuple[str, str]] = []
    if not _stores(keras.Model.compile, "_compile_config"):
        missing.append(("_compile_config", "tf_keras.Model.compile"))
    wrapper = getattr(keras.metrics, "MeanMetricWrapper", None)
    for attr in ("_fn", "_fn_kwargs"):
        if wrapper is None or not _stores(wrapper.__init__, attr):
            missing.append((attr, "tf_keras.metrics.MeanMetricWrapper.__init__"))
    exclude = getattr(getattr(keras.optimizers, "Optimizer", None), "exclude_from_weight_decay", None)
    for attr in ("_exclude_from_weight_decay", "_exclude_from_weight_decay_names"):
        if exclude is None or not _stores(exclude, attr):
            missing.append((attr, "tf_keras.optimizers.Optimizer.exclude_from_weight_decay"))
    base = getattr(keras.optimizers, "Optimizer", None)
    if not callable(getattr(base, "_serialize_hyperparameter", None)):
        missing.append(("_serialize_hyperparameter", "tf_keras.optimizers.Optimizer"))
    for name in TF_KERAS_LAYER_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            missing.append((name, "modules"))
            continue
        if not callable(getattr(getattr(module, "Layer", None), "add_weight", None)):
            missing.append(("Layer.add_weight", name))
    return missing


def check_tf_keras() -> None:
    """Refuse (ConfigError, one line) a tf_keras that lacks an internal tfps uses.

    Run where tf_keras is used: a Keras model's set-up, the wrapping of ``add_weight``,
    and a task's start when tf_keras is loaded. Imports tf_keras (about 0.2 s after
    TensorFlow).
    """
    import tf_keras
    missing = _tf_keras_missing(tf_keras)
    if missing:
        _refuse("tf_keras", getattr(tf_keras, "__version__", "?"), missing)


def keras_compile_config(model) -> dict:
    """The arguments of the model's ``compile()`` as the user gave them (metric objects and
    functions themselves), {} for a model never compiled. The public ``get_compile_config()``
    serialises them, which loses a user's own metric functions."""
    return getattr(getattr(model, "_compile_config", None), "config", None) or {}


def keras_metric_fn(metric) -> tuple:
    """(function, keyword arguments) of a tf_keras metric that wraps a function
    (``MeanMetricWrapper``: ``SparseTopKCategoricalAccuracy(k=3)``...); (None, {}) for others."""
    return getattr(metric, "_fn", None), dict(getattr(metric, "_fn_kwargs", None) or {})


def keras_weight_decay_exclusions(opt) -> tuple[list, list]:
    """(variables, name patterns) a tf_keras optimizer's ``exclude_from_weight_decay()`` was
    given: they keep their value under its ``weight_decay``. ([], []) when never called."""
    return (list(getattr(opt, "_exclude_from_weight_decay", None) or []),
            list(getattr(opt, "_exclude_from_weight_decay_names", None) or []))


def keras_optimizer_config(opt, serialize_variable) -> dict:
    """``opt.get_config()`` with each hyperparameter that is a ``tf.Variable`` serialised by
    ``serialize_variable(variable)`` (a value, or None for tf_keras's own way): in a graph,
    tf_keras's ``get_config()`` reads a variable with ``numpy()``, which needs eager
    execution. Its private ``_serialize_hyperparameter`` is replaced on this object only,
    while the config is read."""
    import tensorflow as tf
    own = opt._serialize_hyperparameter

    def serialize(value):
        if isinstance(value, tf.Variable):
            read = serialize_variable(value)
            if read is not None:
                return read
        return own(value)

    opt._serialize_hyperparameter = serialize
    try:
        return dict(opt.get_config())
    finally:
        del opt._serialize_hyperparameter


def keras_installed() -> bool:
    """Whether tf_keras can be imported (looked up, not imported)."""
    return "tf_keras" in sys.modules or importlib.util.find_spec("tf_keras") is not None


#: True while tf_keras's ``Layer.add_weight`` runs under tfps's wrapper (``keras_add_weight_wrapped``):
#: a variable created then is a Keras layer's weight. Set where Keras creates the weight, so the
#: answer depends on no file name of the code around it (a user's package may be named keras).
_IN_KERAS_ADD_WEIGHT: contextvars.ContextVar[bool] = contextvars.ContextVar("tfps_in_keras_add_weight",
                                                                            default=False)


def in_keras_add_weight() -> bool:
    """Whether the variable created now is a tf_keras layer's weight (``add_weight`` is running)."""
    return _IN_KERAS_ADD_WEIGHT.get()


def _marking(add_weight):
    @functools.wraps(add_weight)
    def marked(*args, **kwargs):
        token = _IN_KERAS_ADD_WEIGHT.set(True)
        try:
            return add_weight(*args, **kwargs)
        finally:
            _IN_KERAS_ADD_WEIGHT.reset(token)
    return marked


@contextlib.contextmanager
def keras_add_weight_wrapped(wrap=None):
    """While inside: tf_keras's layer bases create weights with ``wrap(original_add_weight)``
    (``None``: the original), and :func:`in_keras_add_weight` is True while one runs.

    Does nothing when tf_keras is not installed. Both bases are patched because a model
    built in a ``tf.Graph`` may use either (TF2 layers, or the v1 graph-mode ones).
    """
    if not keras_installed():
        yield
        return
    check_tf_keras()
    classes = [importlib.import_module(name).Layer for name in TF_KERAS_LAYER_MODULES]
    originals = {cls: cls.add_weight for cls in classes}
    for cls, original in originals.items():
        cls.add_weight = _marking(wrap(original) if wrap else original)
    try:
        yield
    finally:
        for cls, original in originals.items():
            cls.add_weight = original


# The run-time patches and ansible-core's internals, one module each (imported last: they use the above).
from tfps.compat.ansible import ANSIBLE_CORE_OLDEST as ANSIBLE_CORE_OLDEST  # noqa: E402
from tfps.compat.ansible import ansible_origin as ansible_origin  # noqa: E402
from tfps.compat.ansible import ansible_play_facts as ansible_play_facts  # noqa: E402
from tfps.compat.ansible import ansible_play_variables as ansible_play_variables  # noqa: E402
from tfps.compat.ansible import ansible_task_role as ansible_task_role  # noqa: E402
from tfps.compat.ansible import check_ansible as check_ansible  # noqa: E402
from tfps.compat.patches import PATCHES as PATCHES  # noqa: E402
from tfps.compat.patches import Patch as Patch  # noqa: E402
from tfps.compat.patches import check_patches as check_patches  # noqa: E402
from tfps.compat.patches import clear_critical_section_collections as clear_critical_section_collections  # noqa: E402

"""The optimizer a tf_keras model was compiled with, mapped to tfps's ``tf.compat.v1`` one.

``compiled_optimizer`` reads the compiled optimizer's class and config when the model is
inspected (``tfps.models.keras_model.inspect_model``) and maps it to a tfps optimizer, its learning
rate (or schedule) and the options ``tfps.task.graph.optimizers.make`` applies; an option tfps
cannot honour is a refusal, raised unless ``--optimizer`` replaces the model's optimizer.
``describe_options`` words the options for the optimizer log line.
"""

from __future__ import annotations

import math
from typing import NoReturn

from tfps import compat
from tfps.errors import ConfigError

#: Per Keras optimizer tfps trains with (lower-cased class name): the options it maps to the
#: ``tf.compat.v1.train`` optimizer (``tfps.task.graph.optimizers.make``), in Keras's names.
MAPPED_OPTIONS = {
    "sgd": ("momentum", "nesterov"),
    "adam": ("beta_1", "beta_2", "epsilon"),
    "adamw": ("beta_1", "beta_2", "epsilon"),
    "rmsprop": ("rho", "momentum", "epsilon", "centered"),
    "adagrad": ("initial_accumulator_value",),
    "ftrl": ("learning_rate_power", "initial_accumulator_value", "l1_regularization_strength",
             "l2_regularization_strength", "l2_shrinkage_regularization_strength", "beta"),
}
#: Options of every Keras optimizer that tfps applies itself (clipping on the worker, decoupled
#: weight decay with the update; a legacy optimizer's ``decay`` as an InverseTimeDecay schedule).
COMMON_OPTIONS = ("learning_rate", "clipnorm", "clipvalue", "global_clipnorm", "weight_decay", "decay")
#: Config keys that are not training settings: the name, the class kind, and ``jit_compile``
#: (whether Keras compiles its update with XLA: the same update, which tfps builds as v1 ops).
NOT_SETTINGS = ("name", "is_legacy_optimizer", "jit_compile")
#: The built-in Keras learning-rate schedules: tfps evaluates them on the v1 global step.
SCHEDULES = ("ExponentialDecay", "PiecewiseConstantDecay", "CosineDecay", "CosineDecayRestarts",
             "InverseTimeDecay", "PolynomialDecay")
#: Why an option has no ``tf.compat.v1`` counterpart tfps can apply (beyond "not supported").
WHY_NOT = {
    "amsgrad": "tf.compat.v1's AdamOptimizer has no AMSGrad variant",
    "use_ema": "tfps keeps no exponential moving average of the weights",
    "epsilon": "tf.compat.v1's AdagradOptimizer has no epsilon (it divides by the square root of an "
               "accumulator that starts at initial_accumulator_value); only Keras's default 1e-07, whose "
               "effect is below float32 precision there, is accepted",
    "initial_accumulator_value": "tf.compat.v1's AdagradOptimizer needs an initial_accumulator_value above 0",
}


def _same(a, b) -> bool:
    if isinstance(a, (bool, str, type(None), dict)) or isinstance(b, (bool, str, type(None), dict)):
        return a == b
    try:
        return math.isclose(float(a), float(b), rel_tol=1e-6, abs_tol=0.0)
    except (TypeError, ValueError):
        return a == b


def _number(v):
    """A config value as the user wrote it: 0.005, not float32 0.004999999888."""
    if isinstance(v, bool) or v is None:
        return v
    try:
        f = float(f"{float(v):.7g}")
    except (TypeError, ValueError):
        return v
    return int(f) if isinstance(v, int) else f


def _keras_optimizer_classes() -> dict:
    """The tf_keras optimizer classes tfps maps, by class: (tfps name, legacy?)."""
    import tf_keras as keras
    found = {}
    for legacy, module in ((False, keras.optimizers), (True, getattr(keras.optimizers, "legacy", None))):
        for cls_name in ("SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "Ftrl"):
            cls = getattr(module, cls_name, None) if module is not None else None
            if cls is not None:
                found[cls] = (cls_name.lower(), legacy)
    return found


def format_value(v) -> str:
    if isinstance(v, float):
        return f"{v:.7g}"
    return str(v)


def describe_schedule(config: dict) -> str:
    """``ExponentialDecay(decay_steps 100, decay_rate 0.5, staircase False)``."""
    cfg = {k: v for k, v in (config.get("config") or {}).items() if k not in ("name", "initial_learning_rate")}
    return f"{config.get('class_name')}({', '.join(f'{k} {format_value(_number(v))}' for k, v in cfg.items())})"


def compiled_optimizer(model, name: str) -> tuple:
    """(tfps optimizer, learning rate, note, options, Keras class name, refusal) of the
    compiled optimizer. ``refusal`` names an option tfps cannot honour (raised unless
    ``--optimizer`` replaces the model's optimizer, ``tfps.task.setup.choose_optimizer``)."""
    opt = getattr(model, "optimizer", None)
    if opt is None:
        return None, None, "", {}, "", None
    cls = type(opt).__name__
    known = _keras_optimizer_classes().get(type(opt))
    try:
        cfg = _optimizer_config(opt)
    except Exception:  # noqa: BLE001 - a custom optimizer: nothing to map
        cfg = {}
    try:
        return (*_map_optimizer(opt, cfg, known, name), cls, None)
    except ConfigError as refusal:   # raised unless --optimizer replaces the model's optimizer
        return None, None, "", {}, cls, refusal


def _optimizer_config(opt) -> dict:
    """``opt.get_config()``, also in a graph: the launcher's memory estimate binds the model in
    a throwaway graph (weights as shapes), where tf_keras's optimizers cannot read their
    learning-rate variable (``numpy()`` needs eager execution). There a variable
    hyperparameter is read from its initial value instead, the value it was compiled with."""
    try:
        return dict(opt.get_config())
    except NotImplementedError:
        import tensorflow as tf

        def initial_value(variable):
            initial = tf.get_static_value(variable.initial_value)
            return None if initial is None else initial.item()

        return compat.keras_optimizer_config(opt, initial_value)


def _map_optimizer(opt, cfg: dict, known, name: str) -> tuple:
    """(tfps optimizer, learning rate, note, options); ConfigError names what cannot be honoured."""
    cls = type(opt).__name__
    if known is None:
        names = "SGD, Adam, AdamW, RMSprop, Adagrad, Ftrl"
        raise ConfigError(f"{name} was compiled with the optimizer {type(opt).__module__}.{cls}, which tfps cannot "
                          f"apply: it trains with tf.compat.v1 optimizers, the counterparts of tf_keras's {names} "
                          "(tf_keras.optimizers or tf_keras.optimizers.legacy, no subclass or wrapper). Compile "
                          "with one of those, or give --optimizer", "model")
    mapped, legacy = known
    defaults = _optimizer_config(type(opt)())

    def refuse(key, value, why=None) -> NoReturn:
        why = why or WHY_NOT.get(key) or "tfps has no counterpart of it"
        raise ConfigError(f"{name} was compiled with {cls}({key}={value!r}), which tfps cannot honour: {why}. "
                           "Remove it from compile(), or give --optimizer to train with one of tfps's optimizers "
                           "(without the model's options)", "model")

    options: dict = {"legacy": legacy} if legacy else {}
    note = ""
    for key, value in cfg.items():
        if key in NOT_SETTINGS:
            if key == "jit_compile" and value:
                note += "; jit_compile does not apply (tfps builds the update as tf.compat.v1 ops)"
            continue
        if key in ("ema_momentum", "ema_overwrite_frequency") and not cfg.get("use_ema"):
            continue   # settings of use_ema, which is off
        if key in MAPPED_OPTIONS[mapped] or key in COMMON_OPTIONS:
            if key == "learning_rate":
                continue
            if value is not None and not (key in COMMON_OPTIONS and not value):
                options[key] = _number(value)
            continue
        if _same(value, defaults.get(key)):
            continue
        refuse(key, value)
    lr = cfg.get("learning_rate")
    if isinstance(lr, dict):   # a schedule: evaluated on the global step
        if lr.get("class_name") not in SCHEDULES:
            refuse("learning_rate", lr.get("class_name"), "a custom learning-rate schedule; tfps evaluates only "
                   f"tf_keras's own ({', '.join(SCHEDULES)}) on the global step")
        import tf_keras as keras
        schedule = keras.optimizers.schedules.deserialize(lr)
        if type(schedule) is not getattr(keras.optimizers.schedules, lr["class_name"], None):
            refuse("learning_rate", type(schedule).__name__, "a custom learning-rate schedule")
        options["schedule"] = {"class_name": lr["class_name"], "config": dict(lr.get("config") or {})}
        lr = float(schedule(0))
    decay = options.pop("decay", None)
    if decay:   # a legacy optimizer's time decay: lr / (1 + decay * step), Keras's InverseTimeDecay
        if "schedule" in options:
            refuse("decay", decay, "a legacy optimizer's decay on top of a learning-rate schedule")
        options["schedule"] = {"class_name": "InverseTimeDecay",
                               "config": {"initial_learning_rate": _number(lr), "decay_steps": 1,
                                          "decay_rate": decay, "staircase": False}}
    if options.get("clipnorm") and options.get("global_clipnorm"):
        refuse("global_clipnorm", options["global_clipnorm"], "it cannot be combined with clipnorm")
    if options.get("weight_decay"):
        excluded_vars, excluded_names = compat.keras_weight_decay_exclusions(opt)
        if excluded_vars:
            refuse("exclude_from_weight_decay", "var_list",
                   "variables are told apart by name in tfps's graphs; pass var_names=[...] instead")
        options["weight_decay_excluded"] = list(excluded_names)
    for key in MAPPED_OPTIONS[mapped]:
        if key not in options and key in cfg:
            options[key] = _number(cfg[key])
    if mapped == "adagrad" and float(options.get("initial_accumulator_value", 0.1)) <= 0:
        refuse("initial_accumulator_value", options["initial_accumulator_value"])
    lr = _number(lr) if lr is not None else None
    return mapped, lr, note, options


def describe_options(options: dict) -> str:
    """The options in force, for the optimizer log line: ``beta_1 0.9, epsilon 1e-07, clipnorm 1``."""
    parts = []
    if options.get("schedule"):
        parts.append(f"{describe_schedule(options['schedule'])} on the global step")
    shown = [k for k in options if k not in ("schedule", "legacy", "weight_decay_excluded")]
    for key in sorted(shown, key=lambda k: k in COMMON_OPTIONS):   # the class's own, then clipping, decay
        parts.append(f"{key} {format_value(options[key])}")
    if options.get("weight_decay_excluded"):
        parts.append(f"no weight decay for {', '.join(options['weight_decay_excluded'])}")
    return ", ".join(parts)

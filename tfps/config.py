"""Run options shared by ``tfps run`` and ``tfps local``, and their validation.

One dataclass, one argparse definition: the launcher forwards the same options to every
task it starts, so a flag means the same thing however a job is launched. Every timeout
that can cut the chief's final save derives from ``final_save_timeout`` (see
``tfps.timeouts``).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re

from tfps import compat
from tfps.errors import ConfigError
from tfps.names import MAX_RUN_NAME, check_directory_name, check_run_name  # noqa: F401

# Re-exported: compose generation and the tests read these from tfps.config.
from tfps.timeouts import (  # noqa: F401
    DEFAULT_FINAL_SAVE_TIMEOUT,
    DEFAULT_STALL_TIMEOUT,
    DEFAULT_SYNC_TIMEOUT,
    GRACE_MARGIN,
    MIN_FINAL_SAVE_TIMEOUT,
    grace_period,
)

#: The built-in models' names. Their functions are tfps.models.BUILTIN, a layer above this
#: one (tests/unit/test_imports.py checks that the two name the same models).
BUILTIN_MODELS = ("linear", "mlp", "cnn", "wide_deep")
#: Every optimizer tfps trains with (``--optimizer``): the one list of their names, which
#: tfps.task.optimizers maps to ``tf.compat.v1.train`` classes.
OPTIMIZERS = ("sgd", "adam", "adagrad", "ftrl")
#: How wide_deep (and a model_fn that reads params.embedding) keeps its id embeddings
#: (``--embedding``): a fixed number of shared hash buckets, or a row per admitted id
#: (tfps.layers.DynamicEmbedding).
EMBEDDINGS = ("hashed", "dynamic")
#: The built-in models that have id tables, the only ones --embedding changes.
EMBEDDING_MODELS = ("wide_deep",)
#: Used when neither the command line nor a Keras model's compile() chooses
#: (``tfps.task.setup.choose_optimizer``); RunConfig keeps None for "not given".
DEFAULT_OPTIMIZER = "adam"
DEFAULT_LEARNING_RATE = 0.01
#: The largest step count or size a flag may hold: the global step is an int64, and an async
#: worker's loop adds up to a run's steps to it (tfps.task.steps), so keep headroom.
MAX_INT64_FLAG = 2**62
#: The longest timeout or interval in seconds (about 31 years, i.e. never): threading's waits
#: (threading.TIMEOUT_MAX) and TensorFlow's int64 milliseconds hold it, 1e308 holds in neither.
MAX_SECONDS = 10**9
#: The largest --partition_mb: its bytes (MB * 2**20) must be a 64-bit integer.
MAX_PARTITION_MB = 2**42
#: The largest --learning_rate: TensorFlow trains in 32-bit floats, whose largest finite value this is.
MAX_LEARNING_RATE = 3.4028234663852886e38
#: The largest --tf_threads: TensorFlow's ConfigProto holds thread counts in 32-bit integers.
MAX_TF_THREADS = 2**31 - 1

#: Upper bounds of the numeric options, (largest value, why): checked before anything starts,
#: since a value past them fails every task only after the start (an OverflowError).
NUMERIC_LIMITS = {
    "learning_rate": (MAX_LEARNING_RATE, "TensorFlow trains in 32-bit floats"),
    "partition_mb": (MAX_PARTITION_MB, "its size in bytes must be a 64-bit integer"),
    "tf_threads": (MAX_TF_THREADS, "TensorFlow counts threads in 32-bit integers"),
    **{f: (MAX_INT64_FLAG, "TensorFlow counts in 64-bit integers")
       for f in ("min_count", "steps_to_live", "expected_ids", "epochs")},
    **{f: (MAX_SECONDS, "a longer wait is never (about 31 years)")
       for f in ("sync_timeout", "startup_timeout", "final_save_timeout", "notify_every", "stall_timeout")},
}


def check_replicas(cfg: RunConfig, num_workers: int) -> None:
    """Refuse --replicas_to_aggregate or --backup_workers that do not fit the number of
    workers before anything starts."""
    if cfg.replicas_to_aggregate and cfg.replicas_to_aggregate > num_workers:
        raise ConfigError(f"{cfg.replicas_to_aggregate} is more than the {num_workers} worker(s) of the cluster, so "
                          "no sync step could ever complete; use at most the number of workers",
                          "replicas_to_aggregate")
    if cfg.backup_workers is None:
        return
    if cfg.backup_workers >= num_workers:
        raise ConfigError(f"{cfg.backup_workers} backup worker(s) of {num_workers} worker(s) leave no gradient to "
                          f"aggregate; use at most {num_workers - 1}", "backup_workers")
    if cfg.replicas_to_aggregate and cfg.replicas_to_aggregate != num_workers - cfg.backup_workers:
        raise ConfigError(f"{cfg.backup_workers} backup worker(s) of {num_workers} mean "
                          f"{num_workers - cfg.backup_workers} gradient(s) per step, and --replicas_to_aggregate "
                          f"says {cfg.replicas_to_aggregate}; give one of the two", "backup_workers")


def replicas_per_step(cfg: RunConfig, num_workers: int) -> int:
    """Gradients a sync step aggregates: --replicas_to_aggregate, else the workers less the
    backup workers (whose gradients, the slowest of each step, are dropped)."""
    return cfg.replicas_to_aggregate or num_workers - (cfg.backup_workers or 0)


@dataclasses.dataclass
class RunConfig:
    """Everything a task needs besides its place in the cluster."""

    model: str = "mlp"
    train_data: str | None = None
    eval_data: str | None = None
    label_column: str = "label"
    num_classes: int | None = None
    hidden_units: str = "64,32"
    model_dir: str = "tfps-model"
    export_dir: str | None = None
    run_name: str | None = None
    train_steps: int = 1000
    epochs: int | None = None       # each worker reads its own share of the data N times, then ends; None: no bound
    batch_size: int = 64
    learning_rate: float | None = None     # None: the Keras model's, else DEFAULT_LEARNING_RATE
    optimizer: str | None = None           # None: the Keras model's, else DEFAULT_OPTIMIZER
    sync_replicas: bool = False
    replicas_to_aggregate: int | None = None
    backup_workers: int | None = None      # sync: aggregate workers - K gradients per step
    model_args: dict | None = None         # --model_arg KEY=VALUE: the model builder's keyword arguments
    checkpoint_steps: int | None = None
    checkpoint_secs: int | None = None
    summary_steps: int = 50
    log_steps: int = 50
    final_save_timeout: float = DEFAULT_FINAL_SAVE_TIMEOUT
    sync_timeout: float = DEFAULT_SYNC_TIMEOUT
    startup_timeout: float = 600.0
    tf_threads: int | None = None   # None: tfps.task.lifecycle.auto_threads
    seed: int = 7
    notify: list[str] = dataclasses.field(default_factory=list)
    notify_config: str | None = None
    notify_started: bool = False
    notify_every: float = 0.0
    stall_timeout: float = DEFAULT_STALL_TIMEOUT
    partition_mb: float = 64.0      # variables above this are split over every ps (tfps.task.placement)
    hash_buckets: int = 1 << 20     # wide_deep: rows of its shared id tables
    embedding_dim: int = 16         # wide_deep: embedding width
    embedding: str = "hashed"       # wide_deep: "hashed" buckets or "dynamic" rows per id (EMBEDDINGS)
    min_count: int = 1              # dynamic: times an id is seen before it gets its own row
    steps_to_live: int = 0          # dynamic: free the rows of ids not seen for N global steps; 0 never
    expected_ids: int = 0           # dynamic: live ids expected per table (the memory plan); 0 unknown

    # ------------------------------------------------------------------ derived
    @property
    def export_path(self) -> str:
        return self.export_dir or os.path.join(self.model_dir, "export")

    @property
    def name(self) -> str:
        return self.run_name or f"tfps-{os.path.basename(self.model.split(':')[-1])}"

    @property
    def hidden(self) -> list[int]:
        return [int(x) for x in self.hidden_units.split(",") if x.strip()]

    @property
    def checkpoint_every_steps(self) -> int | None:
        if self.checkpoint_secs:
            return None
        return self.checkpoint_steps or max(1, min(500, self.train_steps // 5))

    # --------------------------------------------------------------- validation
    def validate(self) -> RunConfig:
        """Raise ConfigError naming the first bad field and what to change."""
        def positive(field: str, value, kind=int):
            if value is None:
                return
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ConfigError(f"must be a positive {'integer' if kind is int else 'number'}, got {value!r}", field)
            if kind is int and value > MAX_INT64_FLAG:
                raise ConfigError(f"{value} is too large: TensorFlow counts in 64-bit integers, so use at most "
                                  f"{MAX_INT64_FLAG}", field)

        positive("train_steps", self.train_steps)
        positive("epochs", self.epochs)
        positive("batch_size", self.batch_size)
        positive("learning_rate", self.learning_rate, float)
        positive("checkpoint_steps", self.checkpoint_steps)
        positive("checkpoint_secs", self.checkpoint_secs)
        positive("summary_steps", self.summary_steps)
        positive("log_steps", self.log_steps)
        positive("replicas_to_aggregate", self.replicas_to_aggregate)
        positive("sync_timeout", self.sync_timeout, float)
        positive("startup_timeout", self.startup_timeout, float)
        positive("tf_threads", self.tf_threads)
        positive("partition_mb", self.partition_mb, float)
        positive("hash_buckets", self.hash_buckets)
        positive("embedding_dim", self.embedding_dim)
        self._check_embedding()
        if self.epochs is not None and self.sync_replicas:
            raise ConfigError("counts each worker's own passes over its data, which synchronous training cannot "
                              "end on: a sync step waits for the gradients of workers that ran out; drop "
                              "--sync_replicas (asynchronous), or drop --epochs and size --train_steps", "epochs")
        if self.replicas_to_aggregate is not None and not self.sync_replicas:
            raise ConfigError("is used only by synchronous training; add --sync_replicas, or drop "
                              "--replicas_to_aggregate", "replicas_to_aggregate")
        if self.model_args is not None:
            if not isinstance(self.model_args, dict):
                raise ConfigError(f"must be a mapping of the builder's keyword arguments, got {self.model_args!r}",
                                  "model_args")
            for key, value in self.model_args.items():
                if not isinstance(key, str) or not key.isidentifier():
                    raise ConfigError(f"{key!r} is not a Python name; name a keyword argument of the builder",
                                      "model_args")
                if isinstance(value, (dict, list, tuple, set)):
                    raise ConfigError(f"{key}: the value must be one number, string, true/false or null, "
                                      f"got {value!r}", "model_args")
        if self.backup_workers is not None:
            if isinstance(self.backup_workers, bool) or not isinstance(self.backup_workers, int) \
                    or self.backup_workers < 0:
                raise ConfigError(f"must be a whole number of workers (0 or more), got {self.backup_workers!r}",
                                  "backup_workers")
            if not self.sync_replicas:
                raise ConfigError("is used only by synchronous training (asynchronous training never waits for "
                                  "a slow worker); add --sync_replicas, or drop --backup_workers", "backup_workers")
        for field in ("notify_every", "stall_timeout"):
            value = getattr(self, field)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ConfigError(f"must be a number of seconds, 0 to turn it off; got {value!r}", field)
        if self.num_classes is not None and self.num_classes < 0:
            raise ConfigError("must be 0 (regression) or the number of classes (>= 2)", "num_classes")
        if self.num_classes == 1:
            raise ConfigError("1 class cannot be learned; use 0 for regression or >= 2 classes", "num_classes")
        if self.checkpoint_steps and self.checkpoint_secs:
            raise ConfigError("give checkpoint_steps or checkpoint_secs, not both", "checkpoint_secs")
        if (not isinstance(self.final_save_timeout, (int, float)) or not math.isfinite(self.final_save_timeout)
                or self.final_save_timeout < MIN_FINAL_SAVE_TIMEOUT):
            raise ConfigError(
                f"{self.final_save_timeout!r} s is too short to write a final checkpoint and export; "
                f"use at least {MIN_FINAL_SAVE_TIMEOUT} (default {DEFAULT_FINAL_SAVE_TIMEOUT})",
                "final_save_timeout")
        for field, (most, why) in NUMERIC_LIMITS.items():
            value = getattr(self, field)
            if value is not None and value > most:
                most = most if isinstance(most, int) else f"{most:g}"
                raise ConfigError(f"{value!r} is too large: {why}; use at most {most}", field)
        if self.optimizer is not None and self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"unknown optimizer {self.optimizer!r}; use one of {', '.join(OPTIMIZERS)}", "optimizer")
        try:
            hidden = self.hidden
        except ValueError:
            raise ConfigError(f"{self.hidden_units!r} is not a comma-separated list of integers, e.g. 64,32",
                              "hidden_units") from None
        if any(h <= 0 for h in hidden):
            raise ConfigError("layer sizes must be positive, e.g. 64,32", "hidden_units")
        if ":" not in self.model and self.model not in BUILTIN_MODELS:
            import difflib
            near = difflib.get_close_matches(self.model, BUILTIN_MODELS, n=1)
            hint = f"did you mean {near[0]!r}? " if near else ""
            raise ConfigError(f"unknown model {self.model!r}; {hint}use one of {', '.join(BUILTIN_MODELS)} "
                              "or package.module:function", "model")
        if not self.model_dir:
            raise ConfigError("must name a directory for checkpoints and results", "model_dir")
        check_directory_name(self.model_dir, "model_dir")
        if self.export_dir:
            check_directory_name(self.export_dir, "export_dir")
        if self.run_name is not None:
            check_run_name(self.run_name)
        return self

    def _check_embedding(self) -> None:
        """--embedding and the dynamic table's options: one line each for what to change."""
        if self.embedding not in EMBEDDINGS:
            raise ConfigError(f"unknown embedding {self.embedding!r}; use hashed (shared hash buckets) or dynamic "
                              "(a row per id, with admission and eviction)", "embedding")
        for field, least, what in (("min_count", 1, "the times an id is seen before it gets its own row, 1 or more"),
                                   ("steps_to_live", 0, "global steps, 0 to never evict"),
                                   ("expected_ids", 0, "live ids per table, 0 when unknown")):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ConfigError(f"must be a whole number of {what}; got {value!r}", field)
        builtin = ":" not in self.model
        if self.embedding == "dynamic" and builtin and self.model not in EMBEDDING_MODELS:
            raise ConfigError(f"the built-in model {self.model} has no id tables; --embedding dynamic is for "
                              f"{', '.join(EMBEDDING_MODELS)} or your own model (tfps.layers.DynamicEmbedding)",
                              "embedding")
        if self.embedding == "hashed" and builtin:
            for field in ("min_count", "steps_to_live", "expected_ids"):
                if getattr(self, field) != getattr(RunConfig, field):
                    raise ConfigError(f"is an option of dynamic tables; add --embedding dynamic, or drop "
                                      f"--{field}", field)

    # ------------------------------------------------------------ command line
    def to_args(self) -> list[str]:
        """The flags that reproduce this config (secrets excluded: URLs travel in the environment)."""
        out: list[str] = []
        for f in dataclasses.fields(self):
            if f.name in ("notify", "notify_config"):
                continue
            value = getattr(self, f.name)
            if value is None or value == f.default:
                continue
            if f.name == "model_args":
                out += [f"--model_arg={k}={yaml_scalar(v)}" for k, v in value.items()]
            elif isinstance(value, bool):
                out.append(f"--{f.name}" if value else f"--no-{f.name}")
            elif isinstance(value, float) and value.is_integer():
                out.append(f"--{f.name}={int(value)}")   # 60, not 60.0: the same flag however it was given
            else:
                out.append(f"--{f.name}={value}")
        if self.notify_config:
            out.append(f"--notify_config={self.notify_config}")
        return out


#: An option name with underscores as help shows it: with dashes (both spellings are accepted).
_UNDERSCORED = re.compile(r"(?<![\w-])--([a-z0-9-]*_[a-z0-9_-]*)")


def dashed(text: str) -> str:
    """``--train_steps`` -> ``--train-steps`` in a help text, and a name listed twice once."""
    text = _UNDERSCORED.sub(lambda m: "--" + m.group(1).replace("_", "-"), text)
    return re.sub(r"(--[a-z0-9-]+)(?: \S+)?, \1\b( \S+)?", lambda m: m.group(0).split(", ")[0], text)


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser whose errors are one line, as every other refusal of bad input.

    argparse prints its whole usage (20 lines and more for ``tfps local``) before a type error
    such as ``--train_steps 1e20``; here it is ``tfps: error: train_steps: invalid int value:
    '1e20' (see tfps local --help)`` and exit 2, and an unknown option gets "did you mean"
    (difflib, among every option of every command). Help shows option names with dashes,
    the canonical spelling (``normalize_argv`` accepts both). ``examples``, when set, ends the
    help. ``tfps`` builds its subcommands' parsers with this class too (argparse makes
    subparsers of the parent parser's class).
    """

    examples: str = ""
    command: str | None = None

    def format_help(self) -> str:   # noqa: D102 - argparse's hook
        text = dashed(super().format_help())
        return text + (f"\nexamples:\n{self.examples.rstrip()}\n" if self.examples else "")

    def format_usage(self) -> str:   # noqa: D102 - argparse's hook
        return dashed(super().format_usage())

    def option_names(self) -> set[str]:
        """Every long option of this parser and of its subcommands, as typed after normalize_argv."""
        names: set[str] = set()
        for action in compat.parser_actions(self):
            names.update(o for o in action.option_strings if o.startswith("--"))
        for sub in compat.subcommands(self).values():
            if isinstance(sub, ArgumentParser):
                names |= sub.option_names()
        return names

    def commands(self) -> list[str]:
        return list(compat.subcommands(self))

    def error(self, message: str):   # noqa: D102 - argparse's hook
        field, sep, rest = message.partition(": ")
        if sep and field.startswith("argument "):   # "argument --train_steps: invalid int value: '1e20'"
            names = field.removeprefix("argument ").split("/")   # "-n/--lines": the long name
            name = next((n for n in names if n.startswith("--")), names[0]).lstrip("-")
            message = f"{name}: {rest}"   # the field's name, as every other refusal names it
        hint = self._did_you_mean(message)
        choice = re.search(r"invalid choice: '([^']+)' \(choose from", message)
        if choice and field == "argument COMMAND":
            message = f"{choice.group(1)!r} is not a tfps command"
        prog = f"{self.prog} {self.command}" if self.command else self.prog
        self.exit(2, f"tfps: error: {' '.join(dashed(message).split())}{hint} (see {prog} --help)\n")

    def _did_you_mean(self, message: str) -> str:
        import difflib
        unknown = re.search(r"unrecognized arguments: (--?[\w-]+)", message)
        if unknown:
            scope = self
            given = compat.subcommands(self).get(getattr(self, "command", None))
            if given is not None:   # the options of the command given (main sets .command)
                scope = given
            word, choices = unknown.group(1).split("=")[0], sorted(scope.option_names())
        else:
            choice = re.search(r"invalid choice: '([^']+)'", message)
            if not choice:
                return ""
            word, choices = choice.group(1), self.commands()
        close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
        return f"; did you mean {dashed(close[0])}?" if close else ""


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """The options common to ``tfps run`` and ``tfps local``."""
    d = RunConfig()
    g = parser.add_argument_group("model and data")
    g.add_argument("--model", default=d.model,
                   help="built-in model (linear, mlp, cnn, wide_deep) or package.module:function (default %(default)s)")
    g.add_argument("--train_data",
                   help="glob of training files: .csv, .tfrecord, .npz, MNIST idx (default: demo data); "
                        "or @FILE, a file listing them one a line (each worker needs only its own shard)")
    g.add_argument("--eval_data", help="glob of evaluation files, same format as train_data")
    g.add_argument("--model_arg", action="append", metavar="KEY=VALUE",
                   help="a keyword argument of the model's builder (VALUE read as a YAML scalar); repeatable. "
                        "A model_fn finds them in params.model_args")
    g.add_argument("--label_column", default=d.label_column, help="label column or feature key (default %(default)s)")
    g.add_argument("--num_classes", type=int, help="0 for regression; inferred from the labels when not given")
    g.add_argument("--hidden_units", default=d.hidden_units, help="MLP layer sizes (default %(default)s)")
    g.add_argument("--hash_buckets", type=int, default=d.hash_buckets,
                   help="wide_deep: rows of the shared tables its text ids are hashed into (default %(default)s)")
    g.add_argument("--embedding_dim", type=int, default=d.embedding_dim,
                   help="wide_deep: width of each id's embedding (default %(default)s)")
    g.add_argument("--embedding", default=d.embedding, metavar="{hashed,dynamic}",
                   help="wide_deep: hashed shares --hash_buckets rows among all ids (fixed memory, collisions); "
                        "dynamic gives each admitted id its own row on the ps that owns it, freed when unseen "
                        "for --steps_to_live steps (default %(default)s)")
    g.add_argument("--min_count", type=int, default=d.min_count, metavar="N",
                   help="dynamic: times an id must be seen before it gets its own row; until then it reads "
                        "zeros (default %(default)s)")
    g.add_argument("--steps_to_live", type=int, default=d.steps_to_live, metavar="STEPS",
                   help="dynamic: free the rows (and optimizer slots) of ids not seen for STEPS global steps; "
                        "0 never frees them (default %(default)s)")
    g.add_argument("--expected_ids", type=int, default=d.expected_ids, metavar="N",
                   help="dynamic: live ids expected per table, for the memory plan printed per ps "
                        "(tfps plan, tfps local); 0 when unknown (default %(default)s)")
    g = parser.add_argument_group("training")
    g.add_argument("--train_steps", type=int, default=d.train_steps, help="global steps to train (default %(default)s)")
    g.add_argument("--epochs", type=int, metavar="N",
                   help="asynchronous: each worker reads its own share of the training data N times, then is "
                        "done (the chief saves once the other workers are done too); --train_steps stays an "
                        "upper bound, whichever comes first (default: no bound, the data repeats)")
    g.add_argument("--batch_size", type=int, default=d.batch_size,
                   help="examples per step per worker (default %(default)s)")
    g.add_argument("--learning_rate", type=float,
                   help=f"(default: a Keras model's compiled one, else {DEFAULT_LEARNING_RATE})")
    g.add_argument("--optimizer", help=f"one of {', '.join(OPTIMIZERS)} (default: a Keras model's compiled one, "
                                      f"else {DEFAULT_OPTIMIZER})")
    g.add_argument("--sync_replicas", "--issync", dest="sync_replicas", action=argparse.BooleanOptionalAction,
                   default=False, help="synchronous updates (SyncReplicasOptimizer); default asynchronous")
    g.add_argument("--replicas_to_aggregate", type=int,
                   help="gradients averaged per sync step (default: number of workers)")
    g.add_argument("--backup_workers", type=int, metavar="K",
                   help="sync: each step aggregates the first workers - K gradients and drops the K slowest, "
                        "so a slow or frozen worker does not hold every step (default 0)")
    g.add_argument("--sync_timeout", type=float, default=d.sync_timeout,
                   help="seconds a sync step may wait for missing workers before the job fails (default %(default)s)")
    g.add_argument("--startup_timeout", type=float, default=d.startup_timeout,
                   help="seconds from a worker's start to its first training step before it gives up and, "
                        "on the chief, reports the job failed: a ps or worker that can never start (bad "
                        "image, port taken) must not hang the job (default %(default)s)")
    g.add_argument("--seed", type=int, default=d.seed, help=argparse.SUPPRESS)
    g.add_argument("--partition_mb", type=float, default=d.partition_mb, metavar="MB",
                   help="a variable larger than this (an embedding table) is split row-wise into one shard "
                        "per ps task; the others are placed whole on the ps with the fewest bytes "
                        "(default %(default)g)")
    g.add_argument("--tf_threads", type=int, default=d.tf_threads,
                   help="TensorFlow intra/inter-op threads per task (default: the CPUs this task may "
                        "use, shared among the tfps tasks that listen on the same host: a worker shares "
                        "them with the other workers there, a ps with every task there)")
    g = parser.add_argument_group("checkpoints, export and results")
    g.add_argument("--model_dir", help="checkpoints, TensorBoard summaries and results.json "
                                       f"(default {d.model_dir}; for tfps local runs/JOB-TIME)")
    g.add_argument("--export_dir", help="SavedModel directory (default MODEL_DIR/export)")
    g.add_argument("--run_name", help="name of the job in results and messages (default tfps-MODEL)")
    g.add_argument("--checkpoint_steps", type=int,
                   help="checkpoint every N global steps (default train_steps/5, max 500)")
    g.add_argument("--checkpoint_secs", type=int, help="checkpoint every N seconds instead")
    g.add_argument("--summary_steps", type=int, default=d.summary_steps, help="TensorBoard summaries every N steps")
    g.add_argument("--log_steps", type=int, default=d.log_steps, help="progress line every N steps")
    g.add_argument("--final_save_timeout", type=float, default=d.final_save_timeout,
                   help="seconds the final checkpoint + export may take; every stop grace derives from it "
                        "(default %(default)s)")
    g = parser.add_argument_group("notifications (apprise)")
    g.add_argument("--notify", action="append", default=[], metavar="URL",
                   help="apprise URL, repeatable; prefer APPRISE_URLS or --notify_config: "
                        "command lines are visible to every user of the machine")
    g.add_argument("--notify_config", metavar="FILE", help="apprise YAML/text config file (tags route events)")
    g.add_argument("--notify_started", action="store_true", help="also send a message when training starts")
    g.add_argument("--notify_every", type=float, default=d.notify_every, metavar="SECONDS",
                   help="send a progress message (step, loss, metrics, examples/s, ETA; tag progress) at most "
                        "every SECONDS; 0 sends none (default %(default)g)")
    g.add_argument("--stall_timeout", type=float, default=d.stall_timeout, metavar="SECONDS",
                   help="send one \"stalled\" message (tag stalled) when a worker, or the whole job, makes no "
                        "progress for SECONDS; it never fails the job; 0 turns it off (default %(default)g)")


def add_replace_option(parser, who: str = "") -> None:
    """``--replace`` of ``tfps local``, ``tfps compose`` and ``tfps run``: not a RunConfig
    field, since it says how this start treats the job's record (tfps.cluster.settings), not
    what the job is."""
    parser.add_argument("--replace", action="store_true",
                        help=f"{who}when model_dir holds a job with other settings (steps, batch, optimizer, data, "
                             "worker count, ...): go on from its checkpoint with these settings, and record them, "
                             "instead of refusing (more --train_steps continue its training; another --ps count "
                             "needs no --replace: the tables are split again)")


def from_args(ns: argparse.Namespace) -> RunConfig:
    names = {f.name for f in dataclasses.fields(RunConfig)}
    given = {k: v for k, v in vars(ns).items() if k in names and v is not None}
    if getattr(ns, "model_arg", None):
        given["model_args"] = parse_model_args(ns.model_arg)
    return RunConfig(**given).validate()


def parse_model_args(pairs: list[str]) -> dict:
    """``["units=128", "dropout=0.2"]`` -> ``{"units": 128, "dropout": 0.2}``: each value a YAML scalar."""
    import yaml
    out: dict = {}
    for pair in pairs:
        key, eq, text = pair.partition("=")
        key = key.strip()
        if not eq or not key.isidentifier():
            raise ConfigError(f"{pair!r} is not KEY=VALUE with KEY a Python name (e.g. --model_arg units=128)",
                              "model_args")
        try:
            value = yaml.safe_load(text) if text.strip() else ""
        except yaml.YAMLError:
            value = None
        if isinstance(value, (dict, list)) or (value is None and text.strip() not in ("null", "~")):
            raise ConfigError(f"{key}={text!r}: the value must be one number, string, true/false or null",
                              "model_args")
        if key in out:
            raise ConfigError(f"{key} is given twice; give each builder argument once", "model_args")
        out[key] = value
    return out


def yaml_scalar(value) -> str:
    """A value as the YAML scalar that :func:`parse_model_args` reads back to the same value."""
    import yaml
    for kind in (bool, int, float, str):   # plain types: an inventory's values are subclasses of them
        if isinstance(value, kind):
            value = kind(value)
            break
    return yaml.safe_dump(value, default_flow_style=True, width=10**9).strip().removesuffix("...").strip()


def normalize_argv(argv: list[str]) -> list[str]:
    """``--train-steps=5`` -> ``--train_steps=5``; nothing after a bare ``--`` is touched."""
    out = []
    for i, a in enumerate(argv):
        if a == "--":
            return out + argv[i:]
        if a.startswith("--") and len(a) > 2:
            name, eq, value = a[2:].partition("=")
            if name.startswith("no-"):
                name = "no-" + name[3:].replace("-", "_")
            else:
                name = name.replace("-", "_")
            a = f"--{name}{eq}{value}"
        out.append(a)
    return out


def load_job_file(path: str, field: str = "config") -> dict:
    """A ``--config`` job file (``tfps local/run/compose/slurm --config``, the role's
    ``tfps_config``): a YAML mapping of option: value; anything else is one clear line
    (about ``field``)."""
    import yaml
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except OSError as e:
        raise ConfigError(f"cannot read {path} ({e.strerror}); give a YAML file of option: value lines",
                          field) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise ConfigError(f"{path} is not valid YAML{where}; give option: value lines", field) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} holds a {type(data).__name__}; give a mapping of option: value lines, "
                          "e.g. train_steps: 1000", field)
    return data


def did_you_mean(key, options) -> str:
    """``"; did you mean train-steps?"`` for a job file's unknown key, or nothing."""
    import difflib
    close = difflib.get_close_matches(str(key).replace("-", "_"), list(options), n=1)
    return f"; did you mean {close[0].replace('_', '-')}?" if close else ""


def job_flags(action: argparse.Action, value) -> list[str]:
    """A job file's ``option: value`` as the command-line flags that give it."""
    names = [o[2:] for o in action.option_strings if o.startswith("--")]
    flag = action.option_strings[-1] if not names else f"--{names[0]}"
    if isinstance(action, argparse.BooleanOptionalAction):
        return [flag if value else f"--no-{names[0]}"]
    if action.nargs == 0:   # store_true and the like
        return [flag] if value else []
    if isinstance(value, list):
        return [f"{flag}={item}" for item in value]
    if isinstance(value, dict):   # model_arg: {depth: 3}
        return [f"{flag}={k}={v}" for k, v in value.items()]
    return [f"{flag}={'true' if value is True else 'false' if value is False else value}"]


def run_option_actions() -> dict[str, argparse.Action]:
    """dest -> action of every run option (:func:`add_run_options`): a job's settings, the
    keys a job file may give ``tfps run`` besides its cluster flags."""
    parser = argparse.ArgumentParser(add_help=False)
    add_run_options(parser)
    return {a.dest: a for a in compat.parser_actions(parser) if a.option_strings}

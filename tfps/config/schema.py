"""The settings of a job: ``RunConfig``, its bounds and its validation (no argparse, no YAML).

One dataclass: the launcher forwards the same options to every task it starts, so a setting
means the same thing however a job is launched. Every timeout that can cut the chief's final
save derives from ``final_save_timeout`` (see ``tfps.timeouts``).
"""

from __future__ import annotations

import dataclasses
import math
import os

from tfps.config.durations import parse_duration, parse_every
from tfps.config.jobfile import yaml_scalar
from tfps.data import stream
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
#: tfps.task.graph.optimizers maps to ``tf.compat.v1.train`` classes.
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
#: worker's loop adds up to a run's steps to it (tfps.task.graph.steps), so keep headroom.
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
#: The largest --min_count (and DynamicEmbedding's min_count): a dynamic table counts the ids
#: that have no row yet in a sketch of 32-bit integers, which a larger count would wrap.
MAX_MIN_COUNT = 2**31 - 1
#: The most ids one dynamic table may hold (--expected_ids, DynamicEmbedding's capacity): a ps
#: keeps its share of the rows in one variable, and TensorFlow sizes the pass that frees the
#: oldest rows (top_k) in 32-bit integers.
MAX_TABLE_IDS = 2**31 - 1

#: A followed job ignores --train_steps: it ends by --until, --follow_idle or a stop.
MAX_FOLLOW_STEPS = 2**53

#: Upper bounds of the numeric options, (largest value, why): checked before anything starts,
#: since a value past them fails every task only after the start (an OverflowError).
#: --progressive_window: the job's last N examples (tfps.task.monitor.progressive), and the most a
#: window may hold (each worker keeps its share in memory, a few floats per example).
DEFAULT_PROGRESSIVE_WINDOW = 100_000
MAX_PROGRESSIVE_WINDOW = 10_000_000

NUMERIC_LIMITS = {
    "progressive_window": (MAX_PROGRESSIVE_WINDOW, "each worker holds its share of the window in memory, "
                           "a few numbers per example"),
    "learning_rate": (MAX_LEARNING_RATE, "TensorFlow trains in 32-bit floats"),
    "partition_mb": (MAX_PARTITION_MB, "its size in bytes must be a 64-bit integer"),
    "tf_threads": (MAX_TF_THREADS, "TensorFlow counts threads in 32-bit integers"),
    "min_count": (MAX_MIN_COUNT, "a dynamic table counts unadmitted ids in 32-bit integers"),
    "expected_ids": (MAX_TABLE_IDS, "a dynamic table's rows are sized in 32-bit integers by TensorFlow"),
    **{f: (MAX_INT64_FLAG, "TensorFlow counts in 64-bit integers") for f in ("steps_to_live", "epochs")},
    **{f: (MAX_SECONDS, "a longer wait is never (about 31 years)")
       for f in ("sync_timeout", "startup_timeout", "final_save_timeout", "notify_every", "stall_timeout",
                 "follow_idle")},
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
    progressive_window: int = DEFAULT_PROGRESSIVE_WINDOW   # the last N examples, scored before they trained; 0 off
    final_save_timeout: float = DEFAULT_FINAL_SAVE_TIMEOUT
    export_every: str | None = None     # versions while training: "10m", "90s", "2h" or "500" global steps
    keep_exports: int | None = None     # --export_every: the newest K versions stay; None keeps every one
    delta_checkpoint_secs: int | None = None   # between full checkpoints, what changed every N s (output.delta)
    sync_timeout: float = DEFAULT_SYNC_TIMEOUT
    startup_timeout: float = 600.0
    tf_threads: int | None = None   # None: tfps.task.runtime.session.auto_threads
    seed: int = 7
    notify: list[str] = dataclasses.field(default_factory=list)
    notify_config: str | None = None
    notify_started: bool = False
    notify_every: float = 0.0
    stall_timeout: float = DEFAULT_STALL_TIMEOUT
    partition_mb: float = 64.0      # variables above this are split over every ps (tfps.task.graph.placement)
    hash_buckets: int = 1 << 20     # wide_deep: rows of its shared id tables
    embedding_dim: int = 16         # wide_deep: embedding width
    embedding: str = "hashed"       # wide_deep: "hashed" buckets or "dynamic" rows per id (EMBEDDINGS)
    min_count: int = 1              # dynamic: times an id is seen before it gets its own row
    steps_to_live: int = 0          # dynamic: free the rows of ids not seen for N global steps; 0 never
    expected_ids: int = 0           # dynamic: live ids expected per table (the memory plan); 0 unknown
    input_split: str | None = None  # "queue" (slices from one queue on ps 0) or "static" halves; None: auto
    follow: bool = False            # --train_data names partitions that keep arriving (tfps.data.stream)
    until: str | None = None        # follow: the job succeeds once this partition is trained
    follow_idle: float | None = None   # follow: the job succeeds when no partition arrived for this long
    skip_bad_partitions: bool = False  # follow: a malformed partition is skipped whole, not the job's end

    def _check_stream(self) -> None:
        """The slice queue and a followed input (tfps.data.stream): what goes with what."""
        if self.input_split not in (None, "queue", "static"):
            raise ConfigError(f"must be queue (slices from one queue on ps 0) or static (each worker reads its own "
                              f"fixed share, the default), got {self.input_split!r}", "input_split")
        if self.input_split == "queue" and self.sync_replicas:
            raise ConfigError("queue hands slices to whichever worker asks next, which synchronous training "
                              "cannot wait on; drop --input_split queue or --sync_replicas", "input_split")
        for name in ("until", "follow_idle", "skip_bad_partitions"):
            if getattr(self, name) not in (None, False) and not self.follow:
                raise ConfigError(f"is used only with --follow; add --follow, or drop --{name}", name)
        if self.follow_idle is not None:
            self.follow_idle = parse_duration(self.follow_idle, "follow_idle")
            if not math.isfinite(self.follow_idle) or self.follow_idle <= 0:
                raise ConfigError(f"must be a positive duration (90s, 10m, 2h), got {self.follow_idle!r}",
                                  "follow_idle")
        self.stall_timeout = parse_duration(self.stall_timeout, "stall_timeout")
        if not self.follow:
            return
        if not self.train_data or self.train_data.startswith("@"):
            raise ConfigError("needs --train_data GLOB: the files or partition directories that keep arriving, "
                              "such as 'stream/dt=*/hour=*'", "follow")
        for name, why in (("input_split", self.input_split == "static"), ("sync_replicas", self.sync_replicas),
                          ("epochs", self.epochs is not None)):
            if why:
                raise ConfigError(f"a followed job trains asynchronously from the slice queue until it is told to "
                                  f"end; drop --{name}", "follow")
        if self.until:
            stream.check_until(self.until, self.train_data)
        self.train_steps = MAX_FOLLOW_STEPS

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
    def export_cadence(self) -> tuple[str, float] | None:
        """--export_every as ("secs", seconds) or ("steps", global steps); None: no versions."""
        return None if self.export_every is None else parse_every(self.export_every, "export_every")

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
        if isinstance(self.progressive_window, bool) or not isinstance(self.progressive_window, int) \
                or self.progressive_window < 0:
            raise ConfigError(f"must be a whole number of examples, 0 to turn progressive validation off; got "
                              f"{self.progressive_window!r}", "progressive_window")
        positive("replicas_to_aggregate", self.replicas_to_aggregate)
        positive("sync_timeout", self.sync_timeout, float)
        positive("startup_timeout", self.startup_timeout, float)
        positive("tf_threads", self.tf_threads)
        positive("partition_mb", self.partition_mb, float)
        positive("hash_buckets", self.hash_buckets)
        positive("embedding_dim", self.embedding_dim)
        positive("keep_exports", self.keep_exports)
        positive("delta_checkpoint_secs", self.delta_checkpoint_secs)
        self.export_cadence   # noqa: B018 - refuses a malformed --export_every
        if self.keep_exports is not None and self.export_every is None:
            raise ConfigError("bounds the versions that --export_every writes; add --export_every (e.g. 10m), "
                              "or drop --keep_exports", "keep_exports")
        self._check_embedding()
        self._check_stream()
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

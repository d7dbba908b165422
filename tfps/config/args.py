"""The command line of ``tfps run`` and ``tfps local``: one argparse definition of the run
options (the fields of ``tfps.config.schema.RunConfig``), their one-line errors, and the flags
a job file's ``option: value`` stands for."""

from __future__ import annotations

import argparse
import dataclasses
import re

from tfps import compat
from tfps.config.schema import DEFAULT_LEARNING_RATE, DEFAULT_OPTIMIZER, OPTIMIZERS, RunConfig
from tfps.errors import ConfigError

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
    g.add_argument("--input_split", choices=("queue", "static"),
                   help="queue: slices of the training data go from one queue on ps 0 to whichever worker "
                        "asks next, in order (always with --follow; asynchronous CSV, TFRecord and npz files that "
                        "every worker host can read); static: each worker reads its own fixed share (default)")
    g.add_argument("--follow", action="store_true",
                   help="--train_data names partitions that keep arriving (files, or directories complete "
                        "once they hold _SUCCESS); train each once, in sorted path order, until --until, "
                        "--follow_idle or a stop; --train_steps is ignored")
    g.add_argument("--until", metavar="PARTITION",
                   help="follow: the job succeeds once this partition is trained")
    g.add_argument("--follow_idle", metavar="DURATION",
                   help="follow: the job succeeds once every partition is trained and none arrived for "
                        "DURATION (90s, 10m, 2h)")
    g.add_argument("--skip_bad_partitions", action="store_true",
                   help="follow: skip a malformed partition whole (recorded in results.json, one message) "
                        "instead of ending the job with its path and line")
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
    g.add_argument("--progressive_window", type=int, default=d.progressive_window, metavar="N",
                   help="progressive validation: every training batch is scored before it trains, and the job "
                        "reports AUC (binary labels), log loss and accuracy, or the model's own loss and metrics, "
                        "over its last N examples: status line, progress lines and messages, results.json, "
                        "TensorBoard run MODEL_DIR/progressive; 0 turns it off (default %(default)s)")
    g.add_argument("--export_every", metavar="DURATION|STEPS",
                   help="also export a SavedModel version while the job trains, every DURATION (90s, 10m, 2h) "
                        "or every STEPS global steps, into EXPORT_DIR/<version>/ as TF Serving reads it "
                        "(the final export is then the last version; default: one export at the end)")
    g.add_argument("--keep_exports", type=int, metavar="K",
                   help="--export_every: keep the newest K versions, remove older ones (default: keep all)")
    g.add_argument("--delta_checkpoint_secs", type=int, metavar="N",
                   help="between full checkpoints, every N seconds save only what changed since the last save "
                        "(the dynamic tables' touched rows with their slots, dense variables whole, the position); "
                        "a restore applies them to the newest full checkpoint (default: full checkpoints only)")
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
    g.add_argument("--stall_timeout", default=d.stall_timeout, metavar="DURATION",
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


def job_flags(action: argparse.Action, value, where: str = "the job file", field: str = "config") -> list[str]:
    """A job file's ``option: value`` as the command-line flags that give it. A switch takes
    YAML's true or false only: ``"false"`` (quoted, a string) used to turn it on."""
    names = [o[2:] for o in action.option_strings if o.startswith("--")]
    flag = action.option_strings[-1] if not names else f"--{names[0]}"
    if (action.nargs == 0 and isinstance(action.const, bool)) or isinstance(action, argparse.BooleanOptionalAction):
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: {action.dest}: {value!r} is not true or false; write true or false "
                              "without quotes", field)
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

"""The job's curves as small PNGs in its model_dir: ``loss.png`` (and ``metrics.png`` when the
model reports metrics), written by every job's chief and attached to the completion message.

Each shows the whole job (global step 0 to its last), the chief's history records as thin
raw lines, a smoothed curve over them (an exponential moving average, debiased as
TensorBoard's smoothing is), and the evaluation of the final checkpoint as a point at its
step when ``--eval_data`` is given.

Drawn with matplotlib's Agg canvas directly (no ``pyplot``, no global backend switch),
so it works on headless hosts and does not disturb anything else in the process.
A plot is a nicety: every failure is logged and turns into ``None``, never an exception.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import tempfile

log = logging.getLogger("tfps.plot")

#: 640x360 pixels: readable in a mail client, a few tens of kB as PNG.
FIGSIZE_IN = (6.4, 3.6)
DPI = 100
#: History keys that are not training metrics.
NOT_METRICS = frozenset({"step", "time", "examples_per_sec", "steps_per_sec", "learning_rate", "lr", "mean"})
#: Keys drawn against the left (loss) axis; everything else goes on the right axis.
LOSS_KEYS = ("loss", "eval_loss")
#: At most this many series on the right axis, so the plot stays readable.
MAX_RIGHT_SERIES = 3


def _series(history: list[dict], key: str, mean: bool = False) -> tuple[list[float], list[float]]:
    """(steps, values) of the finite numeric values of ``key``, in step order; with ``mean``,
    the record's mean over the chief's steps since the record before (``rec["mean"][key]``,
    tfps.task.runtime.hooks.ProgressHook), where the record has one, else its value."""
    points = []
    for rec in history:
        try:
            means = rec.get("mean") if mean else None
            value = means[key] if isinstance(means, dict) and key in means else rec[key]
            step, value = float(rec["step"]), float(value)
        except (KeyError, TypeError, ValueError):
            continue
        if math.isfinite(step) and math.isfinite(value):
            points.append((step, value))
    points.sort()
    return [p[0] for p in points], [p[1] for p in points]


#: The smoothed curve averages over about this fraction of the records (at least 3).
SMOOTHING_SPAN = 0.1
EVAL_COLOR = "tab:red"


def smoothed(values: list[float]) -> list[float]:
    """An exponential moving average of ``values`` spanning about ``SMOOTHING_SPAN`` of them,
    debiased at the start (the first value is not pulled towards zero)."""
    span = max(3.0, SMOOTHING_SPAN * len(values))
    weight = 1.0 - 2.0 / (span + 1.0)
    out, acc = [], 0.0
    for k, v in enumerate(values, 1):
        acc = weight * acc + (1.0 - weight) * v
        out.append(acc / (1.0 - weight ** k))
    return out


def plot_history(history: list[dict], path: str, evaluation: dict | None = None,
                 eval_step: float | None = None) -> str | None:
    """Draw the loss against the global step into ``path`` (PNG).

    Args:
        history: records like ``{"step": 120, "loss": 0.53, "accuracy": 0.81}``; records
            without a finite loss are skipped. ``eval_loss`` in a record is an evaluation point.
        path: where to write the PNG (its directory is created).
        evaluation: the final evaluation (``{"loss": ..., "accuracy": ...}``), drawn at ``eval_step``.

    Returns:
        ``path`` when the PNG was written (always, for a history without a loss too: the
        plot then says that the chief recorded no step); ``None`` when drawing failed (the
        reason is logged). Never raises.
    """
    try:
        return _plot(history or [], path, ["loss"], _evaluations(history or [], evaluation, eval_step), "loss")
    except Exception as e:  # noqa: BLE001 - a plot must never cost a message or a job
        log.warning("could not draw the loss plot %s: %s: %s", path, type(e).__name__, e)
        return None


def plot_metrics(history: list[dict], path: str, evaluation: dict | None = None,
                 eval_step: float | None = None) -> str | None:
    """The model's metrics (accuracy, auc, ...) as ``plot_history`` draws the loss; ``None``
    when the history has none."""
    try:
        keys = _metric_keys(history or [])
        if not keys:
            return None
        return _plot(history or [], path, keys, _evaluations(history or [], evaluation, eval_step), "metric")
    except Exception as e:  # noqa: BLE001
        log.warning("could not draw the metrics plot %s: %s: %s", path, type(e).__name__, e)
        return None


def draw_plots(model_dir: str, history: list[dict], evaluation: dict | None = None,
               eval_step: float | None = None) -> list[str]:
    """loss.png and (when there are metrics) metrics.png in ``model_dir``: the paths written."""
    found = [plot_history(history, os.path.join(model_dir, "loss.png"), evaluation, eval_step),
             plot_metrics(history, os.path.join(model_dir, "metrics.png"), evaluation, eval_step)]
    return [p for p in found if p]


def _metric_keys(history: list[dict]) -> list[str]:
    keys: dict[str, None] = {}
    for rec in history:
        for k, v in rec.items():
            if (k not in NOT_METRICS and k not in LOSS_KEYS and not k.startswith("eval_")
                    and isinstance(v, (int, float)) and not isinstance(v, bool)):
                keys.setdefault(k, None)
    return sorted(keys, key=lambda k: (k != "accuracy", k))[:MAX_RIGHT_SERIES]


def _evaluations(history: list[dict], evaluation: dict | None, eval_step: float | None) -> dict:
    """{metric: [(step, value), ...]}: ``eval_*`` keys of the history and the final evaluation."""
    points: dict[str, list] = {}
    for rec in history:
        for k, v in rec.items():
            if k.startswith("eval_"):
                try:
                    step, value = float(rec["step"]), float(v)
                except (KeyError, TypeError, ValueError):
                    continue
                if math.isfinite(step) and math.isfinite(value):
                    points.setdefault(k.removeprefix("eval_"), []).append((step, value))
    if evaluation and eval_step is not None:
        for k, v in evaluation.items():
            if isinstance(v, (int, float)) and math.isfinite(float(v)):
                points.setdefault(k, []).append((float(eval_step), float(v)))
    return points


def _plot(history: list[dict], path: str, keys: list[str], evals: dict, what: str) -> str | None:
    fig = figure(history, keys, evals, what)
    if fig is None:
        log.info("no %s plot: the history has no step with a finite %s", what, what)
        return None
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    # Written whole or not at all: drawn into a temporary file of the same directory, then
    # renamed over ``path``. On a full disk, savefig leaves a truncated (often 0-byte) PNG.
    fd, tmp = tempfile.mkstemp(prefix=f".tmp-{os.path.basename(path)}-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            fig.savefig(fh, format="png", dpi=DPI)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def figure(history: list[dict], keys: list[str], evals: dict, what: str = "loss"):
    """The matplotlib Figure of ``keys`` (None when the history has none of them): per key a
    faint line of the records' single batches, its smoothed curve, and the ``evals`` points
    ({key: [(step, value), ...]})."""
    series = {k: _series(history, k) for k in keys}
    series = {k: s for k, s in series.items() if s[0]}
    means = {k: _series(history, k, mean=True) for k in series}
    if not series and what != "loss":
        return None

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=FIGSIZE_IN, dpi=DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    colors = iter(["tab:blue", "tab:orange", "tab:green", "tab:purple"])
    last_step = 0.0
    values_seen: list[float] = []
    if not series:
        # Every job has its loss.png: one whose chief recorded no step (the other workers
        # took every step of a short job before its first) shows the evaluation, and says so.
        ax.text(0.5, 0.5, "no training step recorded by the chief\n(the other workers took every step)",
                transform=ax.transAxes, ha="center", va="center", color="gray")
    for key in keys:
        ev = evals.get(key)
        if not series and ev:
            ax.plot([p[0] for p in ev], [p[1] for p in ev], "o", color=EVAL_COLOR, markeredgecolor="black",
                    markersize=7, label=f"eval {key}", zorder=5)
            last_step = max([last_step] + [p[0] for p in ev])
    for key, (steps, values) in series.items():
        color = next(colors)
        ax.plot(steps, values, color=color, alpha=0.3, linewidth=0.8, label=f"{key} (one batch)")
        mean_steps, mean_values = means[key]
        curve = smoothed(mean_values)
        ax.plot(mean_steps, curve, color=color, linewidth=1.8, label=f"{key} (smoothed)")
        last_step = max(last_step, steps[-1])
        values_seen += curve
        ev = evals.get(key)
        if ev:
            ax.plot([p[0] for p in ev], [p[1] for p in ev], "o", color=EVAL_COLOR if len(series) == 1 else color,
                    markeredgecolor="black", markersize=7, label=f"eval {key}", zorder=5)
            last_step = max([last_step] + [p[0] for p in ev])
            values_seen += [p[1] for p in ev]
    ax.set_xlim(0, max(last_step, 1) * 1.02)   # the whole job, from its first step
    ax.set_xlabel("global step")
    ax.set_ylabel(next(iter(series)) if len(series) == 1 else keys[0] if len(keys) == 1 else "value")
    ax.set_title(("training loss" if what == "loss" else "training metrics")
                 + (" and evaluation" if any(k in evals for k in keys) else ""), fontsize="medium")
    ax.grid(True, alpha=0.3)
    # The axis follows the smoothed curve and the evaluation (single batches may go far
    # beyond: they are the faint line's context); a log scale only when the curve spans more
    # than two decades.
    if values_seen:
        low, high = min(values_seen), max(values_seen)
        if what == "loss" and low > 0 and high / low > 100:
            ax.set_yscale("log")
            ax.set_ylim(low / 1.5, high * 1.5)
        else:
            pad = (high - low) * 0.1 or abs(high) * 0.05 or 0.1
            ax.set_ylim(low - pad, high + pad)
    if ax.lines:
        ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    return fig

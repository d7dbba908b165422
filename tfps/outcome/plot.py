"""The loss curve as a small PNG, attached to the completion message.

Drawn with matplotlib's Agg canvas directly (no ``pyplot``, no global backend switch),
so it works on headless hosts and does not disturb anything else in the process.
A plot is a nicety: every failure is logged and turns into ``None``, never an exception.
"""

from __future__ import annotations

import logging
import math
import os

log = logging.getLogger("tfps.plot")

#: 640x360 pixels: readable in a mail client, a few tens of kB as PNG.
FIGSIZE_IN = (6.4, 3.6)
DPI = 100
#: History keys that are not training metrics.
NOT_METRICS = frozenset({"step", "time", "examples_per_sec", "steps_per_sec", "learning_rate", "lr"})
#: Keys drawn against the left (loss) axis; everything else goes on the right axis.
LOSS_KEYS = ("loss", "eval_loss")
#: At most this many series on the right axis, so the plot stays readable.
MAX_RIGHT_SERIES = 3


def _series(history: list[dict], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of the finite numeric values of ``key``, in step order."""
    points = []
    for rec in history:
        try:
            step, value = float(rec["step"]), float(rec[key])
        except (KeyError, TypeError, ValueError):
            continue
        if math.isfinite(step) and math.isfinite(value):
            points.append((step, value))
    points.sort()
    return [p[0] for p in points], [p[1] for p in points]


def _right_keys(history: list[dict]) -> list[str]:
    keys: dict[str, None] = {}
    for rec in history:
        for k, v in rec.items():
            if k not in NOT_METRICS and k not in LOSS_KEYS and isinstance(v, (int, float)):
                keys.setdefault(k, None)
    # accuracy first, then its eval twin, then the rest alphabetically
    order = sorted(keys, key=lambda k: (k.removeprefix("eval_") != "accuracy", k))
    return order[:MAX_RIGHT_SERIES]


def plot_history(history: list[dict], path: str) -> str | None:
    """Draw loss (and accuracy / eval metrics, if any) against the global step.

    Args:
        history: records like ``{"step": 120, "loss": 0.53, "accuracy": 0.81}``;
            ``eval_loss`` and other ``eval_*`` keys are drawn too. Records without a
            finite value for a key are skipped for that key.
        path: where to write the PNG (its directory is created).

    Returns:
        ``path`` when the PNG was written; ``None`` when there is nothing to draw or
        drawing failed (the reason is logged). Never raises.
    """
    try:
        return _plot(history or [], path)
    except Exception as e:  # noqa: BLE001 - a plot must never cost a message or a job
        log.warning("could not draw the loss plot %s: %s: %s", path, type(e).__name__, e)
        return None


def _plot(history: list[dict], path: str) -> str | None:
    left = {k: _series(history, k) for k in LOSS_KEYS}
    left = {k: s for k, s in left.items() if s[0]}
    right = {k: _series(history, k) for k in _right_keys(history)}
    right = {k: s for k, s in right.items() if s[0]}
    if not left and not right:
        log.info("no loss plot: the history has no step with a loss or metric")
        return None

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=FIGSIZE_IN, dpi=DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    lines = []
    for key, (steps, values) in left.items():
        lines += ax.plot(steps, values, label=key, color="tab:blue",
                         linestyle="-" if key == "loss" else "--", linewidth=1.4)
    ax.set_xlabel("global step")
    ax.set_ylabel("loss")
    ax.grid(True, alpha=0.3)
    loss_values = [v for _, values in left.values() for v in values]
    positive = [v for v in loss_values if v > 0]
    # Log scale only when it helps: the loss spans more than two decades.
    if positive and len(positive) == len(loss_values) and max(positive) / min(positive) > 100:
        ax.set_yscale("log")

    if right:
        ax2 = ax.twinx() if left else ax
        colors = iter(["tab:orange", "tab:green", "tab:red"])
        for key, (steps, values) in right.items():
            lines += ax2.plot(steps, values, label=key, color=next(colors),
                              linestyle="--" if key.startswith("eval_") else "-", linewidth=1.2)
        ax2.set_ylabel(", ".join(right) if len(right) == 1 else "metrics")

    ax.legend(lines, [line.get_label() for line in lines], loc="best", fontsize="small")
    fig.tight_layout()

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, format="png", dpi=DPI)
    return path

"""The loss plot attached to the completion message (tfps.outcome.plot)."""

from __future__ import annotations

import math
import struct

from tfps.outcome.plot import plot_history

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_plot_is_a_small_png_and_never_raises(tmp_path):
    history = [{"step": s, "loss": 10 * math.exp(-s / 30), "accuracy": s / 400, "eval_loss": 11 * math.exp(-s / 30),
                "time": 1.0, "examples_per_sec": 900.0} for s in range(0, 401, 10)]
    path = plot_history(history, str(tmp_path / "out" / "loss.png"))
    data = (tmp_path / "out" / "loss.png").read_bytes()
    assert path and data.startswith(PNG_SIGNATURE) and len(data) < 100_000
    width, height = struct.unpack(">II", data[16:24])  # IHDR
    assert (width, height) == (640, 360)

    # Every job has its loss.png, even one whose chief recorded no step: it says so.
    assert plot_history([], str(tmp_path / "empty.png")) == str(tmp_path / "empty.png")
    assert plot_history([{"step": 1, "loss": float("nan")}], str(tmp_path / "nan.png"), {"loss": 0.5}, 10)
    (tmp_path / "a-file").write_text("x")
    assert plot_history([{"step": 1, "loss": 1.0}], str(tmp_path / "a-file" / "loss.png")) is None


def test_the_loss_curve_is_smoothed_spans_the_whole_job_and_shows_the_evaluation(tmp_path):
    import random

    from tfps.outcome import plot
    rng = random.Random(0)
    history = [{"step": s, "loss": math.exp(-s / 300) * rng.uniform(0.2, 1.8), "accuracy": rng.random(),
                "mean": {"loss": math.exp(-s / 300) * rng.uniform(0.9, 1.1)}} for s in range(20, 1001, 20)]
    fig = plot.figure(history, ["loss"], plot._evaluations(history, {"loss": 0.3, "accuracy": 0.9}, 1001))
    ax = fig.axes[0]
    lines = {line.get_label(): line for line in ax.lines}
    raw, smooth, ev = lines["loss (one batch)"], lines["loss (smoothed)"], lines["eval loss"]
    # Smoothed: the curve moves less from point to point than the single batches do.
    def roughness(y):
        return sum(abs(a - b) for a, b in zip(y, y[1:]))
    assert roughness(list(smooth.get_ydata())) < roughness(list(raw.get_ydata())) / 3
    # The whole job: from its first record to its last step, on an axis that starts at 0.
    assert smooth.get_xdata()[0] == 20 and smooth.get_xdata()[-1] == 1000 and ax.get_xlim()[0] == 0
    assert list(ev.get_xdata()) == [1001] and list(ev.get_ydata()) == [0.3]
    assert ax.get_xlabel() == "global step" and ax.get_ylabel() == "loss"
    # Both files, with no notification involved; no metrics plot without metrics.
    assert plot.draw_plots(str(tmp_path), history, {"loss": 0.3, "accuracy": 0.9}, 1001) == [
        str(tmp_path / "loss.png"), str(tmp_path / "metrics.png")]
    assert plot.plot_metrics([{"step": 1, "loss": 1.0}], str(tmp_path / "m.png")) is None
    assert plot.smoothed([2.0, 2.0, 2.0]) == [2.0, 2.0, 2.0]


def test_earlier_evaluations_are_points_too(tmp_path):
    from tfps.outcome import plot
    history = [{"step": s, "loss": 1.0 / s, "mean": {"loss": 1.0 / s}} for s in range(10, 101, 10)]
    earlier = [{"step": 40, "eval_loss": 0.05}, {"step": 80, "eval_loss": 0.03}]
    fig = plot.figure(history + earlier, ["loss"], plot._evaluations(history + earlier, {"loss": 0.02}, 100))
    ev = {line.get_label(): line for line in fig.axes[0].lines}["eval loss"]
    assert list(ev.get_xdata()) == [40, 80, 100] and list(ev.get_ydata()) == [0.05, 0.03, 0.02]


def test_a_plot_that_cannot_be_written_whole_leaves_no_file_and_keeps_the_previous_one(tmp_path):
    """A full disk mid-write (issue 51: 0-byte loss.png): here the kernel's own bound on a file's
    size (RLIMIT_FSIZE, EFBIG once SIGXFSZ is ignored) fails the write part-way, as ENOSPC does."""
    import os
    import resource
    import signal
    history = [{"step": s, "loss": 1.0 / (1 + s)} for s in range(0, 200, 10)]
    path = tmp_path / "loss.png"
    assert plot_history(history, str(path)) == str(path)
    before = path.read_bytes()
    previous_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (2048, hard))
    try:
        again = plot_history(history + [{"step": 300, "loss": 0.001}], str(path))
        fresh = plot_history(history, str(tmp_path / "metrics.png"))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous_handler)
    assert again is None and fresh is None
    assert path.read_bytes() == before                  # the previous plot, whole
    assert sorted(os.listdir(tmp_path)) == ["loss.png"]  # no metrics.png, no temporary file

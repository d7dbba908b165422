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

    assert plot_history([], str(tmp_path / "empty.png")) is None
    assert plot_history([{"step": 1, "loss": float("nan")}], str(tmp_path / "nan.png")) is None
    (tmp_path / "a-file").write_text("x")
    assert plot_history([{"step": 1, "loss": 1.0}], str(tmp_path / "a-file" / "loss.png")) is None

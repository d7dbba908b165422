"""A slow model builder is not a silent launcher (issue 35 item 25): ``tfps local`` says it is
building the model when its checks before start take longer than a few seconds, on a terminal
and with its output piped alike (issue 51: 33 s of silence in a pipe). pytest's stderr is no
terminal: these tests run as a piped launcher does."""

from __future__ import annotations

import logging
import threading
import time

from tfps.config import RunConfig
from tfps.launch import processes


def test_the_notice_comes_only_when_the_block_is_slow(caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="tfps")
    with processes._said_when_slow("building…", after=0.05):
        time.sleep(0.3)
    with processes._said_when_slow("never said", after=5):
        pass
    assert [r.getMessage() for r in caplog.records] == ["building…"]
    assert not [t for t in threading.enumerate() if isinstance(t, threading.Timer)]


def test_preflight_says_it_builds_the_model_while_a_slow_estimate_runs(caplog, monkeypatch, tmp_path):
    caplog.set_level(logging.INFO, logger="tfps")
    data = tmp_path / "train.csv"
    data.write_text("f0,f1,label\n" + "".join(f"{i % 7}.5,{i % 3}.25,{i % 2}\n" for i in range(40)))
    monkeypatch.setattr(processes, "SLOW_CHECK_NOTICE_SECS", 0.05)
    monkeypatch.setattr(processes, "estimate_isolated", lambda *a, **kw: time.sleep(0.4) or "skipped in this test")
    cfg = RunConfig(model="mlp", model_dir=str(tmp_path / "m"), train_data=str(data)).validate()
    processes._preflight(cfg, None, num_workers=2, num_ps=1)
    said = [r.getMessage() for r in caplog.records]
    assert "tfps local: building the model mlp to check it before start…" in said, said


def test_the_notice_is_said_when_stderr_is_a_pipe(caplog, monkeypatch):
    import io
    import sys
    monkeypatch.setattr(sys, "stderr", io.StringIO())   # no terminal, as in `tfps local ... | tee`
    caplog.set_level(logging.INFO, logger="tfps")
    with processes._said_when_slow("tfps local: building the model m to check it before start…", after=0.01):
        time.sleep(0.2)
    assert [r.getMessage() for r in caplog.records] == ["tfps local: building the model m to check it before start…"]

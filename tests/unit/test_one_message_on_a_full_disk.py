"""One message per job when the disk is too full for results.json (issue 51: two failure
messages). The chief sends its message without the file and says so in a line of its own;
``tfps local``'s launcher, which reads the chief's output, then sends none in its place.
In-process, over TCP on 127.0.0.1 (the ``webhook_server`` fixture)."""

from __future__ import annotations

import io
import logging
import time

from tfps.cluster.spec import ClusterSpec, TaskRef
from tfps.config import RunConfig
from tfps.errors import DiskFull
from tfps.launch.summary import summarize
from tfps.launch.tasks import TaskProcess
from tfps.notify import Notifier
from tfps.outcome.report import Reporter
from tfps.outcome.results import SENT_WITHOUT_RESULTS


def _unwritable_model_dir(tmp_path):
    model_dir = tmp_path / "model"
    (model_dir / "results.json").mkdir(parents=True)   # open(..., "w") fails with an OSError, as on a full disk
    return model_dir


def test_the_chief_sends_its_message_without_results_json_and_says_so(tmp_path, webhook_server, caplog):
    caplog.set_level(logging.INFO, logger="tfps")
    cfg = RunConfig(model_dir=str(_unwritable_model_dir(tmp_path))).validate()
    task = TaskRef(ClusterSpec(("127.0.0.1:1",), ("127.0.0.1:2",)), "worker", 0)
    reporter = Reporter(cfg, task, None, "2030-01-01T00:00:00+00:00", time.time(),
                        notifier=Notifier([webhook_server.url()]))
    reporter.finished(status="failed", exit_code=1, step=30, checkpoint=None, export_dir=None, train_summary={},
                      eval_metrics={}, error=DiskFull("the disk of /x is full"), times={})
    assert len(webhook_server.bodies()) == 1
    assert f"chief: {SENT_WITHOUT_RESULTS}" in [r.getMessage() for r in caplog.records]


def test_the_launcher_reads_that_line_and_sends_no_second_message(tmp_path, webhook_server, caplog):
    chief = TaskProcess("worker0", [], {}, out=io.StringIO())
    chief._stream = io.StringIO("12:00:00 E chief: job j failed at step 30, but results.json could not be written\n"
                                f"12:00:01 I chief: {SENT_WITHOUT_RESULTS}\n")
    chief._copy()
    assert chief.sent_without_results
    cfg = RunConfig(model_dir=str(_unwritable_model_dir(tmp_path))).validate()
    assert summarize(cfg, 1, time.time(), [webhook_server.url()], {}, chief_sent=chief.sent_without_results)
    assert webhook_server.bodies() == []
    assert "sent the job's message, but could not write" in caplog.text
    # A chief that said nothing of the kind died without reporting: the launcher's message.
    assert not summarize(cfg, 1, time.time(), [webhook_server.url()], {}, chief_sent=False)
    assert len(webhook_server.bodies()) == 1

"""The final loss of results.json comes from the chief's late runs, not its first ones."""

from __future__ import annotations

from tfps.task.runtime.hooks import ProgressHook


def hook(records):
    h = ProgressHook.__new__(ProgressHook)
    h.recent = records
    return h


def test_a_chief_that_ran_three_steps_of_a_short_job_reports_its_late_loss():
    # tfps local --train-steps 200: the chief ran steps 0, 53 and 192; worker1 the rest.
    h = hook([{"loss": 1.3, "accuracy": 0.4, "step": 0}, {"loss": 0.07, "accuracy": 0.98, "step": 53},
              {"loss": 0.0086, "accuracy": 1.0, "step": 192}])
    assert h.summary() == {"loss": 0.0086, "accuracy": 1.0}


def test_a_chief_that_ran_the_job_averages_its_last_runs():
    h = hook([{"loss": 0.1 * (i % 2), "step": 1000 + i} for i in range(20)])
    assert h.summary() == {"loss": 0.05}
    assert hook([]).summary() == {}

"""Action tfps_memory: what each ps task of the plan will hold, estimated on the controller.

Runs on the controller and contacts no host. tfps builds the job's training graph from the
model's shapes, as a worker builds it (``tfps.launch.estimate.plan_estimate``: a throwaway
graph in a subprocess, no session, nothing allocated), and returns each ps task's share of
the variables in MB, the optimizer's slots included: the figure the chief later logs and
results.json records as ``ps_shares_mb``. check.yml compares it with each host's memory.

The estimate needs TensorFlow in the controller's Python, the model's module (on the
import path, or in ``user_model_dir``) and the training data (``data_src``, or the demo
data when the job names none). Without one of them it is skipped, with the reason in
``msg``; that never fails the play.
"""

from __future__ import annotations

from ansible.plugins.action import ActionBase


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = self._task.args
        from tfps.cluster import memory
        from tfps.errors import ConfigError
        from tfps.launch.estimate import plan_estimate

        try:
            est = plan_estimate(dict(args["plan"]), str(args.get("data_src") or "") or None,
                                          str(args.get("train_data") or "") or None,
                                          str(args.get("user_model_dir") or "") or None)
        except ConfigError as exc:   # a bad tfps_data_src: the tfps_data check reports it
            est = str(exc)
        if isinstance(est, memory.MemoryEstimate):
            result.update(changed=False, estimate=est.to_json(),
                          msg=f"{est.line()} (estimated on the controller from the model's shapes); the chief's "
                              f"export restores the model's variables once more ({memory.fmt_mb(est.export_mb)} "
                              "MB)")
        else:
            result.update(changed=False, estimate=None, msg=f"memory: not estimated: {est}")
        return result

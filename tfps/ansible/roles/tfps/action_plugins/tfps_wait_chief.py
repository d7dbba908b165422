"""Action tfps_wait_chief: wait for the chief's container to exit, one progress line per look.

Each look (every ``poll`` seconds) is one short module run on the chief's host, as an
``until`` loop's would be, so no SSH session stays open for the hours a job may take:
``docker_container_info`` of the chief, and the last two records of the job's
history.jsonl (``tail``). Instead of Ansible's "FAILED - RETRYING", the play shows where
the job stands (``tfps.outcome.results.progress_line``)::

    host2: job train step 1200/3000 (40%) | loss 0.4121 | 5123 examples/s | ETA 37 s

The result is the last ``docker_container_info`` result (``exists``, ``container``), as the
task's ``until`` loop returned before; it holds the container's configuration, so the task
keeps ``no_log``. The lines hold no setting, only the job's progress.
"""

from __future__ import annotations

import json
import time

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

display = Display()


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = False
    _supports_async = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        from tfps.outcome.results import progress_line

        args = self._task.args
        container, history = str(args["container"]), str(args["history"])
        total, job = int(args["train_steps"]), str(args.get("job", ""))
        poll, timeout = max(float(args.get("poll", 15)), 0.5), float(args.get("timeout", 86400))
        host = task_vars.get("inventory_hostname", "")
        end = time.monotonic() + timeout
        info: dict = {}
        shown = None
        while True:
            info = self._execute_module(module_name="community.docker.docker_container_info",
                                        module_args={"name": container}, task_vars=task_vars)
            if info.get("failed"):
                break
            state = ((info.get("container") or {}).get("State") or {}).get("Status")
            if not info.get("exists") or state in ("exited", "dead"):
                break
            line = (progress_line(*self._last_records(history, task_vars), total) if history
                    else "running (a classic script: tfps records no progress)")
            if line != shown:
                display.display(f"{host}: job {job} {line}")
                shown = line
            if time.monotonic() + poll > end:
                break
            time.sleep(poll)
        result.update({k: v for k, v in info.items() if k not in ("invocation", "_ansible_no_log")})
        result["changed"] = False
        return result

    def _last_records(self, history: str, task_vars) -> tuple[dict | None, dict | None]:
        """(newest, the one before) of history.jsonl on the host; Nones before the first."""
        out = self._execute_module(module_name="ansible.legacy.command",
                                   module_args={"argv": ["tail", "-n", "2", history]}, task_vars=task_vars)
        records = []
        for line in str(out.get("stdout", "")).splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                continue   # a line being written
        if not records:
            return None, None
        return records[-1], (records[-2] if len(records) > 1 else None)

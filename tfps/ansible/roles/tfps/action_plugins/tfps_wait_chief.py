"""Action tfps_wait_chief: wait for the chief's container to exit, one progress line per look.

Each look is one short run of the role's ``tfps_containers`` module on the chief's host,
which waits there (asking the Docker engine's socket every half second) until the chief
has exited or ``poll`` seconds have passed, then reads the last two records of the job's
history.jsonl. So no SSH session stays open for the hours a job may take, the play sees
the chief's exit within half a second, and a look costs the host a small Python module of
the standard library (docker_container_info and a ``tail`` had cost about 0.8 s of CPU
there). Instead of Ansible's "FAILED - RETRYING", the play shows where the job stands
(``tfps.outcome.results.progress_line``)::

    host2: job train step 1200/3000 (40%) | loss 0.4121 | 5123 examples/s | ETA 37 s

The result has ``exists`` and ``container`` (the chief's ``docker inspect``), as
docker_container_info's had; the container's configuration is in it, so the task keeps
``no_log``. The lines hold no setting, only the job's progress.
"""

from __future__ import annotations

import time

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

display = Display()


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = False
    _supports_async = False

    def _module(self, name: str) -> str:
        """``name`` in the namespace this action was found in: the role's library when the role
        is used from a checkout (ansible.legacy), tfps.tfps.<name> inside the collection."""
        resolved = getattr(self._task, "resolved_action", None) or self._task.action
        return f"{resolved.rsplit('.', 1)[0]}.{name}" if "." in resolved else name

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        from tfps.outcome.results import progress_line

        args = self._task.args
        container, history = str(args["container"]), str(args["history"])
        total, job = int(args["train_steps"]), str(args.get("job", ""))
        poll, timeout = max(float(args.get("poll", 15)), 0.5), float(args.get("timeout", 86400))
        host = task_vars.get("inventory_hostname", "")
        end = time.monotonic() + timeout
        module = self._module("tfps_containers")
        look: dict = {}
        shown = None
        while True:
            wait = max(min(poll, end - time.monotonic()), 0.0)
            look = self._execute_module(module_name=module, task_vars=task_vars,
                                        module_args={"names": [container], "wait": wait, "history": history})
            if look.get("failed"):
                result.update({k: v for k, v in look.items() if k not in ("invocation", "_ansible_no_log")})
                break
            chief = (look.get("containers") or {}).get(container)
            result.update(exists=chief is not None, container=chief or {})
            if container not in look.get("running", []):
                break
            records = look.get("records") or []
            line = (progress_line(records[-1] if records else None, records[-2] if len(records) > 1 else None, total)
                    if history else "running (a classic script: tfps records no progress)")
            if line != shown:
                display.display(f"{host}: job {job} {line}")
                shown = line
            if time.monotonic() >= end:
                break
        result["changed"] = False
        return result

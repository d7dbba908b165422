"""Filters of the GPU readiness check (tasks/gpu.yml): tfps's own decision logic,
tfps.cluster.gpu, on the controller."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError


def _gpu():
    try:
        from tfps.cluster import gpu
    except ImportError as exc:
        raise AnsibleFilterError(f"the tfps role needs tfps on the controller ({exc})") from None
    return gpu


def tfps_gpu_smoke_argv(image, gpu):
    """``docker run`` argv of the nvidia-smi smoke run of a task on GPU ``gpu``."""
    return _gpu().smoke_argv(str(image), str(gpu))


def tfps_gpu_verdict(result, host):
    """{problems, warnings} of one smoke run (a loop result of the command over GPU tasks)."""
    task = result.get("item", {})
    output = (result.get("stdout") or "") + "\n" + (result.get("stderr") or result.get("msg") or "")
    verdict = _gpu().problems(str(host), str(task.get("name", "?")), str(task.get("gpu", "?")),
                              int(result.get("rc", 1)), output)
    return {"problems": verdict.problems, "warnings": verdict.warnings}


class FilterModule:
    def filters(self):
        return {"tfps_gpu_smoke_argv": tfps_gpu_smoke_argv, "tfps_gpu_verdict": tfps_gpu_verdict}

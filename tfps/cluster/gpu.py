"""GPU readiness of a host: what a smoke run of ``nvidia-smi`` in a task's container says.

Before a GPU task starts, the Ansible role (tasks/gpu.yml) runs :func:`smoke_argv` on its
host: a throw-away container of the job's image with the task's device request (its GPU
only), which prints ``nvidia-smi``'s view of that GPU, the processes on it, the driver's
CUDA version and the CUDA version the image's TensorFlow was built for. :func:`problems`
turns that output into what must be fixed before the job can use the GPU:

* the smoke run failed (no NVIDIA Container Toolkit, an unknown device, a driver/library
  mismatch): the task could not have started either;
* the image's TensorFlow has no CUDA build (a ``tensorflow-cpu`` image would train on the
  CPU without a word);
* the driver supports an older CUDA than the image's TensorFlow was built for (another
  major version: it cannot run; an older minor version of the same major: only under CUDA's
  minor version compatibility, reported as a warning);
* another process already uses the GPU (TensorFlow takes nearly all of a GPU's memory, so
  the task would fail with out-of-memory, or starve the other job).

No GPU was available where this was written: the parsing is tested against recorded
``nvidia-smi`` outputs (tests/fixtures/nvidia-smi/).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: Run in the smoke container: one section per view, each after a ``### name`` line.
#: A failing nvidia-smi ends the script with its exit code.
SMOKE_SCRIPT = """\
echo '### query-gpu'
nvidia-smi --query-gpu=index,uuid,name,driver_version,memory.used,memory.total --format=csv,noheader || exit $?
echo '### compute-apps'
nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory --format=csv,noheader || exit $?
echo '### q'
nvidia-smi -q || exit $?
echo '### image-cuda'
python3 -c 'import tensorflow as tf; print(tf.sysconfig.get_build_info().get("cuda_version", ""))' 2>/dev/null
"""


@dataclass(frozen=True)
class Gpu:
    index: str
    uuid: str
    name: str
    driver: str
    used_mib: int
    total_mib: int


@dataclass(frozen=True)
class GpuProcess:
    gpu_uuid: str
    pid: str
    name: str
    used_mib: int


def smoke_argv(image: str, gpu: str) -> list[str]:
    """``docker run`` of the smoke script in ``image`` with the device request of a task on GPU ``gpu``."""
    return ["docker", "run", "--rm", "--gpus", f"device={gpu}",
            # nvidia-smi is the "utility" capability: mounted into the container only with it.
            "-e", "NVIDIA_DRIVER_CAPABILITIES=compute,utility",
            "--entrypoint", "/bin/sh", image, "-c", SMOKE_SCRIPT]


def sections(output: str) -> dict[str, str]:
    """The ``### name`` sections of the smoke script's output."""
    found: dict[str, list[str]] = {}
    current = None
    for line in output.splitlines():
        m = re.fullmatch(r"### ([a-z-]+)\s*", line)
        if m:
            current = found.setdefault(m[1], [])
        elif current is not None:
            current.append(line)
    return {name: "\n".join(lines).strip("\n") for name, lines in found.items()}


def _mib(value: str) -> int:
    m = re.match(r"\s*(\d+)", value)
    return int(m[1]) if m else 0


def _csv_rows(text: str, width: int) -> list[list[str]]:
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < width:
            continue
        # A process name may itself hold commas: the first and the last cells are fixed.
        if len(cells) > width:
            cells = cells[:2] + [",".join(cells[2:len(cells) - 1])] + cells[-1:]
        rows.append(cells)
    return rows


def parse_query_gpu(text: str) -> list[Gpu]:
    """``nvidia-smi --query-gpu=index,uuid,name,driver_version,memory.used,memory.total --format=csv,noheader``."""
    return [Gpu(i, u, n, d, _mib(used), _mib(total)) for i, u, n, d, used, total in _csv_rows(text, 6)
            if re.fullmatch(r"\d+", i)]


def parse_compute_apps(text: str) -> list[GpuProcess]:
    """``nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory --format=csv,noheader``."""
    return [GpuProcess(u, pid, name, _mib(used)) for u, pid, name, used in _csv_rows(text, 4)
            if u.startswith(("GPU-", "MIG-"))]


def parse_version(text: str, key: str) -> tuple[int, ...] | None:
    """The version after ``key :`` in ``nvidia-smi -q`` (e.g. "CUDA Version") or a bare version line."""
    pattern = rf"^\s*{re.escape(key)}\s*:\s*(\d+(?:\.\d+)*)" if key else r"^\s*(\d+(?:\.\d+)*)\s*$"
    m = re.search(pattern, text, re.M)
    return tuple(int(p) for p in m[1].split(".")) if m else None


def _v(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))


@dataclass
class Verdict:
    problems: list[str]
    warnings: list[str]


def problems(host: str, task: str, gpu: str, rc: int, output: str) -> Verdict:
    """What the smoke run (exit code ``rc``, stdout+stderr ``output``) of ``task``'s GPU ``gpu`` on ``host`` found."""
    where = f"{host}: {task} (GPU {gpu})"
    verdict = Verdict([], [])
    parts = sections(output)
    if rc != 0 or "q" not in parts:
        last = [line.strip() for line in output.splitlines() if line.strip() and not line.startswith("###")]
        detail = " / ".join(last[-2:]) if last else "no output"
        verdict.problems.append(
            f"{where}: nvidia-smi does not run in a container with its device request (exit {rc}: {detail}); "
            f"check the NVIDIA driver and the NVIDIA Container Toolkit there (a driver/library mismatch "
            f"needs a reboot after a driver upgrade), or fix tfps_gpus of this host")
        return verdict
    # The device request shows the container its GPU only (renumbered from 0).
    mine = parse_query_gpu(parts.get("query-gpu", ""))
    if not mine:
        verdict.problems.append(f"{where}: nvidia-smi sees no GPU with this device request; fix tfps_gpus of this host")
        return verdict
    uuids = {g.uuid for g in mine}
    driver_cuda = parse_version(parts["q"], "CUDA Version")
    image_cuda = parse_version(parts.get("image-cuda", ""), "")
    if image_cuda is None:
        verdict.problems.append(
            f"{where}: the image's TensorFlow has no CUDA build, so the task would train on the CPU; build the "
            f"image with --build-arg TF_PACKAGE=\"tensorflow[and-cuda]==...\"")
    elif driver_cuda is None:
        verdict.warnings.append(f"{where}: nvidia-smi -q does not say which CUDA version the driver supports")
    elif driver_cuda[0] < image_cuda[0]:
        verdict.problems.append(
            f"{where}: the driver ({mine[0].driver}) supports CUDA {_v(driver_cuda)}, but the image's TensorFlow was "
            f"built for CUDA {_v(image_cuda[:2])}; install a driver for CUDA {image_cuda[0]}.{image_cuda[1]} or newer "
            f"there, or use an image built for CUDA {driver_cuda[0]}")
    elif driver_cuda[0] == image_cuda[0] and driver_cuda[:2] < image_cuda[:2]:
        verdict.warnings.append(
            f"{where}: the driver ({mine[0].driver}) supports CUDA {_v(driver_cuda)}, older than the image's "
            f"CUDA {_v(image_cuda[:2])}: it runs only under CUDA's minor version compatibility (no PTX JIT); "
            f"upgrade the driver if kernels fail to load")
    busy = [p for p in parse_compute_apps(parts.get("compute-apps", "")) if p.gpu_uuid in uuids]
    if busy:
        who = ", ".join(f"pid {p.pid} ({p.name}, {p.used_mib} MiB)" for p in busy)
        used = ", ".join(f"{g.used_mib} of {g.total_mib} MiB" for g in mine)
        verdict.problems.append(
            f"{where} is busy: {who} already use(s) it ({used} in use); TensorFlow takes nearly all of a GPU's "
            f"memory, so stop that process or give this host other tfps_gpus")
    return verdict

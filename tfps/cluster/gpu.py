"""GPU readiness of a host: what a smoke run of ``nvidia-smi`` in a task's container says.

:func:`smoke_argv` (run by the Ansible role on a GPU task's host) and :func:`problems` (what
must be fixed before the job can use the GPU); ``tfps local --gpus`` checks this machine
with the same parsing (:func:`check_local`, :func:`process_env`). What is checked and why,
and how it is tested without a GPU: docs/design/gpu.md.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tfps.errors import ConfigError

#: ``nvidia-smi``'s arguments for the view :func:`parse_query_gpu` reads: one line per GPU.
QUERY_GPU_ARGS = ("--query-gpu=index,uuid,name,driver_version,memory.used,memory.total", "--format=csv,noheader")

#: Run in the smoke container: one section per view, each after a ``### name`` line.
#: A failing nvidia-smi ends the script with its exit code.
SMOKE_SCRIPT = f"""\
echo '### query-gpu'
nvidia-smi {' '.join(QUERY_GPU_ARGS)} || exit $?
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


def _tail(output: str) -> str:
    """The last two lines of a failed run's output (where nvidia-smi and docker say what went wrong)."""
    last = [line.strip() for line in output.splitlines() if line.strip() and not line.startswith("###")]
    return " / ".join(last[-2:]) if last else "no output"


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
        verdict.problems.append(
            f"{where}: nvidia-smi does not run in a container with its device request (exit {rc}: {_tail(output)}); "
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


# ----------------------------------------------------------------------------- GPUs of this machine
# `tfps local --gpus` and `tfps compose --gpus`: which GPUs the workers get, checked before anything starts.


def parse_ids(text: str, uuids: bool = True) -> list[str]:
    """The GPU ids of ``--gpus TEXT``, one worker per id, in order.

    nvidia-smi's device indices, or (``uuids``: compose's device requests take them) its
    GPU-/MIG- UUIDs. An empty item, an id that is neither, or an id given twice is refused.
    """
    kind = "device indices such as 0,1 (nvidia-smi -L)" + (" or GPU UUIDs (GPU-...)" if uuids else "")
    if not text.strip():
        raise ConfigError(f"{text!r} names no GPU; give {kind}", "gpus")
    ids: list[str] = []
    for item in text.split(","):
        gpu = item.strip()
        if not gpu:
            raise ConfigError(f"{text!r} has an empty item; give {kind}, separated by single commas", "gpus")
        if re.fullmatch(r"\d+", gpu):
            gpu = str(int(gpu))      # "01" is GPU 1, as nvidia-smi numbers it
        elif not (uuids and re.fullmatch(r"(?:GPU|MIG)-[A-Za-z0-9/-]+", gpu)):
            raise ConfigError(f"{gpu!r} is not a GPU {'id' if uuids else 'index'}; use {kind}", "gpus")
        if gpu in ids:
            raise ConfigError(f"{text!r} lists GPU {gpu} twice; one worker per GPU", "gpus")
        ids.append(gpu)
    return ids


def worker_gpus(text: str, workers: int | None, uuids: bool = True) -> list[str]:
    """:func:`parse_ids` of ``--gpus``, which sets the number of workers: a ``--workers`` that differs is refused."""
    ids = parse_ids(text, uuids)
    if workers is not None and workers != len(ids):
        raise ConfigError(
            f"--workers {workers} does not match {len(ids)} GPU id(s) in --gpus; a GPU worker per GPU, "
            "so drop --workers",
            "workers",
        )
    return ids


#: What a GPU task's TensorFlow runs with: it takes the GPU's memory as it needs it, instead of
#: nearly all of it at the start.
GROWTH_ENV = {"TF_FORCE_GPU_ALLOW_GROWTH": "true"}
#: CUDA_VISIBLE_DEVICES of a task without a GPU: CUDA sees none, so TensorFlow stays on the CPU.
NO_GPU = "-1"


def process_env(gpu: str | None) -> dict[str, str]:
    """The environment of a task process on a machine whose GPUs it would all see (``tfps local``).

    A worker with GPU ``gpu`` sees that GPU only, by nvidia-smi's index (CUDA numbers GPUs
    fastest first unless CUDA_DEVICE_ORDER says PCI_BUS_ID, nvidia-smi's order), with memory
    growth on; a task without one (every ps) sees none. In a container the device request
    does this instead: it shows the container its GPU only.
    """
    if gpu is None:
        return {"CUDA_VISIBLE_DEVICES": NO_GPU}
    return {"CUDA_VISIBLE_DEVICES": gpu, "CUDA_DEVICE_ORDER": "PCI_BUS_ID", **GROWTH_ENV}


def nvidia_smi(args: Sequence[str]) -> tuple[int, str]:
    """Run this machine's ``nvidia-smi`` with ``args``: its exit code and output (stdout, then stderr).

    Raises FileNotFoundError when there is no nvidia-smi (no NVIDIA driver)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise FileNotFoundError("nvidia-smi")
    try:
        proc = subprocess.run([exe, *args], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return 124, "nvidia-smi did not answer within 60 s"
    return proc.returncode, proc.stdout + proc.stderr


def check_local(ids: Sequence[str], run: Callable[[Sequence[str]], tuple[int, str]] = nvidia_smi) -> list[Gpu]:
    """The GPUs of this machine that ``ids`` (nvidia-smi indices) name, as ``nvidia-smi`` lists them.

    ``run`` runs nvidia-smi (:func:`nvidia_smi`; tests give it recorded outputs). No
    nvidia-smi, one that fails, or an index it does not list is refused before anything starts.
    """
    try:
        rc, output = run(QUERY_GPU_ARGS)
    except (FileNotFoundError, PermissionError):
        raise ConfigError(
            "no NVIDIA driver found (no nvidia-smi on PATH); install the NVIDIA driver, which brings nvidia-smi, "
            "and a CUDA build of TensorFlow (pip install 'tfps[gpu]'), or drop --gpus to train on the CPU",
            "gpus",
        ) from None
    found = parse_query_gpu(output)
    if rc != 0 or not found:
        raise ConfigError(
            f"nvidia-smi lists no GPU (exit {rc}: {_tail(output)}); check the NVIDIA driver (a driver/library "
            "mismatch needs a reboot after a driver upgrade), or drop --gpus to train on the CPU",
            "gpus",
        )
    by_index = {g.index: g for g in found}
    missing = [i for i in ids if i not in by_index]
    if missing:
        have = ", ".join(f"{g.index} ({g.name})" for g in found)
        raise ConfigError(
            f"this machine has no GPU {', '.join(missing)}; nvidia-smi lists {have}: give --gpus from these",
            "gpus",
        )
    return [by_index[i] for i in ids]

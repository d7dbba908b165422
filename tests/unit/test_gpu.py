"""GPU readiness decisions (tfps/cluster/gpu.py) on recorded nvidia-smi outputs.

No GPU is available to these tests: tests/fixtures/nvidia-smi/ holds what nvidia-smi
prints on real hosts (an A100 pair under driver 535 / CUDA 12.2 with one GPU busy, a V100
under driver 470 / CUDA 11.4, a device the toolkit does not know, a driver/library
mismatch). Each case assembles the smoke script's output from them, as the script does.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tfps.cluster import gpu

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-smi"


def recorded(name: str) -> str:
    return (FIXTURES / name).read_text()


def smoke(query: str, apps: str, q: str, image_cuda: str) -> str:
    """The smoke script's output: the recorded views under its section markers."""
    return (f"### query-gpu\n{recorded(query)}### compute-apps\n{recorded(apps)}### q\n{recorded(q)}"
            f"### image-cuda\n{image_cuda}\n")


def test_recorded_outputs_parse():
    gpus = gpu.parse_query_gpu(recorded("query-gpu-2xa100.csv"))
    assert [(g.index, g.name, g.driver, g.used_mib, g.total_mib) for g in gpus] == [
        ("0", "NVIDIA A100-PCIE-40GB", "535.161.07", 4, 40960),
        ("1", "NVIDIA A100-PCIE-40GB", "535.161.07", 38921, 40960)]
    apps = gpu.parse_compute_apps(recorded("compute-apps-gpu1-busy.csv"))
    assert apps == [gpu.GpuProcess("GPU-a1d9f07e-3c55-41b2-8e6d-7f0c4b2e9d13", "48211", "python3", 38912)]
    assert gpu.parse_compute_apps(recorded("compute-apps-idle.csv")) == []
    assert gpu.parse_version(recorded("q-driver535-cuda122.txt"), "CUDA Version") == (12, 2)
    assert gpu.parse_version(recorded("q-driver535-cuda122.txt"), "Driver Version") == (535, 161, 7)
    assert gpu.parse_version(recorded("q-driver470-cuda114.txt"), "CUDA Version") == (11, 4)
    assert gpu.parse_version("12.5.1\n", "") == (12, 5, 1)
    assert gpu.parse_version("\n", "") is None


def test_a_free_gpu_with_a_matching_driver_is_ready():
    # In a container with device=0, nvidia-smi sees GPU 0 and its (no) processes only.
    out = smoke("query-gpu-a100-device0.csv", "compute-apps-idle.csv", "q-driver535-cuda122.txt", "12.2")
    verdict = gpu.problems("gpu1", "worker0", "0", 0, out)
    assert verdict.problems == [] and verdict.warnings == []


def test_a_busy_gpu_is_reported_with_the_process():
    # In a container with device=1, host GPU 1 is the container's GPU 0; its process shows.
    out = smoke("query-gpu-a100-device1.csv", "compute-apps-gpu1-busy.csv", "q-driver535-cuda122.txt", "12.2")
    verdict = gpu.problems("gpu1", "worker1", "1", 0, out)
    assert verdict.problems == [
        "gpu1: worker1 (GPU 1) is busy: pid 48211 (python3, 38912 MiB) already use(s) it (38921 of 40960 MiB in use); "
        "TensorFlow takes nearly all of a GPU's memory, so stop that process or give this host other tfps_gpus"]


def test_a_driver_for_an_older_cuda_major_is_refused_and_an_older_minor_warned():
    old = smoke("query-gpu-1xv100.csv", "compute-apps-idle.csv", "q-driver470-cuda114.txt", "12.5.1")
    verdict = gpu.problems("v100", "worker0", "0", 0, old)
    assert len(verdict.problems) == 1, verdict
    assert "the driver (470.223.02) supports CUDA 11.4, but the image's TensorFlow was built for CUDA 12.5" \
        in verdict.problems[0]
    minor = smoke("query-gpu-a100-device0.csv", "compute-apps-idle.csv", "q-driver535-cuda122.txt", "12.5.1")
    verdict = gpu.problems("gpu1", "worker0", "0", 0, minor)
    assert verdict.problems == []
    assert len(verdict.warnings) == 1 and "minor version compatibility" in verdict.warnings[0]
    newer = smoke("query-gpu-1xv100.csv", "compute-apps-idle.csv", "q-driver470-cuda114.txt", "11.2")
    assert gpu.problems("v100", "worker0", "0", 0, newer) == gpu.Verdict([], [])


def test_a_cpu_image_is_refused():
    out = smoke("query-gpu-1xv100.csv", "compute-apps-idle.csv", "q-driver470-cuda114.txt", "")
    verdict = gpu.problems("v100", "worker0", "0", 0, out)
    assert len(verdict.problems) == 1 and "has no CUDA build" in verdict.problems[0]
    assert 'TF_PACKAGE="tensorflow[and-cuda]==..."' in verdict.problems[0]


@pytest.mark.parametrize("recording, rc, says", [
    ("smoke-no-device.txt", 125, "nvidia-container-cli: device error: 3: unknown device: unknown."),
    ("smoke-driver-mismatch.txt", 18, "Failed to initialize NVML: Driver/library version mismatch"),
])
def test_a_failed_smoke_run_names_the_error(recording, rc, says):
    verdict = gpu.problems("gpu2", "worker3", "3", rc, recorded(recording))
    assert len(verdict.problems) == 1, verdict
    assert verdict.problems[0].startswith(f"gpu2: worker3 (GPU 3): nvidia-smi does not run in a container with its "
                                          f"device request (exit {rc}: ")
    assert says in verdict.problems[0]
    assert "NVIDIA Container Toolkit" in verdict.problems[0]


def test_the_smoke_script_prints_the_sections_the_parser_reads(tmp_path):
    """The script itself, run by sh with nvidia-smi and python3 replaced by the recordings."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "nvidia-smi").write_text(
        "#!/bin/sh\ncase \"$1\" in\n"
        f"  --query-gpu=*) cat {FIXTURES / 'query-gpu-a100-device1.csv'} ;;\n"
        f"  --query-compute-apps=*) cat {FIXTURES / 'compute-apps-gpu1-busy.csv'} ;;\n"
        f"  -q) cat {FIXTURES / 'q-driver535-cuda122.txt'} ;;\n"
        "  *) exit 2 ;;\nesac\n")
    (bindir / "python3").write_text("#!/bin/sh\necho 12.3.2\n")
    for f in bindir.iterdir():
        f.chmod(0o755)
    argv = gpu.smoke_argv("tfps:gpu", "1")
    assert argv[:5] == ["docker", "run", "--rm", "--gpus", "device=1"]
    script = argv[argv.index("-c") + 1]
    proc = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True,
                          env={"PATH": f"{bindir}:/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    verdict = gpu.problems("gpu1", "worker1", "1", proc.returncode, proc.stdout)
    assert len(verdict.problems) == 1 and "is busy: pid 48211" in verdict.problems[0]
    assert len(verdict.warnings) == 1 and "older than the image's CUDA 12.3" in verdict.warnings[0]

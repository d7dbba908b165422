"""Deployment benchmark: ansible-playbook wall time on the 3-host test cluster.

Three "bare-metal hosts" (containers with sshd and their own Docker engine, as in the
system tests), a job from the image archive: the first deploy.yml run copies and loads the
archive and trains; the second run of the same play on the finished job must change
nothing. Prints one JSON line: {"first_s", "second_s", "changed"}.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "system"), str(ROOT / "tests")]

from hosts import start_hosts  # noqa: E402

RECAP = re.compile(r"^(\S+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


def play(inventory: Path, extra: dict, work: Path) -> tuple[float, str]:
    vars_file = work / f"vars-{time.time_ns()}.json"
    vars_file.write_text(json.dumps(extra))
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible/ansible.cfg"), "ANSIBLE_HOST_KEY_CHECKING": "False",
           "ANSIBLE_NOCOLOR": "1"}
    start = time.monotonic()
    p = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory),
                        str(ROOT / "ansible/deploy.yml"), "-e", f"@{vars_file}"], env=env, cwd=ROOT,
                       text=True, capture_output=True)
    if p.returncode != 0:
        raise SystemExit(f"deploy.yml failed:\n{p.stdout[-4000:]}")
    return time.monotonic() - start, p.stdout


def main() -> int:
    subprocess.run(["bash", str(ROOT / ".ci/base-images.sh")], check=True, capture_output=True)
    subprocess.run(["bash", str(ROOT / ".ci/ansible-collections.sh")], check=True, capture_output=True)
    work = Path(tempfile.mkdtemp(prefix="tfps-deploy-bench-"))
    archive = work / "tfps.tar"
    subprocess.run(["docker", "save", "tfps:latest", "-o", str(archive)], check=True)
    cluster = start_hosts(["host1", "host2", "host3"], work)
    try:
        inventory = cluster.inventory(work / "inventory", {"ps": ["host1"], "worker": ["host2", "host3"]},
                                      group_vars={"all": {"tfps_job_name": "bench", "tfps_train_steps": 300,
                                                          "tfps_image": "tfps:latest",
                                                          "tfps_image_archive": str(archive)}})
        extra = {"tfps_results_dir": str(work / "results"), "tfps_wait_poll_interval": 2}
        first, _ = play(inventory, extra, work)
        second, out = play(inventory, extra, work)
        changed = sum(int(m[3]) for m in RECAP.finditer(out))
    finally:
        cluster.close()
    print(json.dumps({"first_s": round(first, 1), "second_s": round(second, 1), "changed": changed}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

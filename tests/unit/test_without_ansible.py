"""ansible-core is an extra of the controller: what runs without it, and what says how to get it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

#: Runs tfps's CLI in a fresh interpreter where `import ansible` fails, as on a machine
#: where tfps was installed without the [ansible] extra.
_WITHOUT_ANSIBLE = """
import sys
class _NoAnsible:
    def find_spec(self, name, path=None, target=None):
        if name == "ansible" or name.startswith("ansible."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _NoAnsible())
from tfps.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _tfps(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _WITHOUT_ANSIBLE, *args], cwd=REPO, text=True,
                          capture_output=True, timeout=120)


def test_compose_and_local_layouts_need_no_ansible():
    proc = _tfps("compose", "--ps", "1", "--workers", "2")
    assert proc.returncode == 0, proc.stderr
    assert "worker1:" in proc.stdout and "TF_CONFIG" in proc.stdout


def test_plan_without_ansible_says_how_to_install_it():
    proc = _tfps("plan", "-i", str(REPO / "inventory" / "example"))
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("tfps: error: ")
    assert "pip install 'tfps[ansible]'" in lines[0]

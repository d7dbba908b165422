"""``tfps deploy``, ``stop``, ``status``, ``cleanup`` and ``collections``: the packaged playbooks.

Each command runs its playbook (``tfps/ansible/<command>.yml``) with the ``ansible-playbook``
of tfps's own environment, tfps's ansible.cfg and the inventory given, and exits with
ansible-playbook's own code (0 ok, 2 a host failed, 4 a host unreachable, ...), so that
scripts read the same codes either way. ``ansible-playbook -i INV ansible/deploy.yml``
from a checkout runs the same playbook.

The Ansible collections the playbooks need are pinned in ``requirements.yml``. When one is
missing, tfps installs them once into its own directory (``tfps.playbooks.user_collections``),
taken from PyPI's ``ansible`` package (Galaxy is not reachable from every network, PyPI
usually is): the wheel of :data:`ANSIBLE_RELEASE`, checked by its sha256, of which only the
pinned collections are unpacked.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from tfps import playbooks
from tfps.errors import ConfigError
from tfps.exitcodes import ExitCode

#: The ``ansible`` release on PyPI that ships the collection versions of requirements.yml
#: (.ci/ansible-collections.sh pins the same; a unit test checks).
ANSIBLE_RELEASE = "12.3.0"
ANSIBLE_WHEEL_SHA256 = "cd156f82fa87f7a899212b0efa9f7ca3a24d609212de9f78428a572eb01e5414"

#: What ansible-playbook's exit codes mean, for the one line tfps adds after a failure.
PLAYBOOK_EXITS = {
    1: "the play failed",
    2: "a task failed on a host (the output above says which)",
    4: "a host could not be reached over SSH: check the inventory's addresses, ansible_user and SSH keys",
    5: "ansible-playbook refused its options",
    8: "a host failed and the play stopped (any_errors_fatal)",
    99: "interrupted",
    250: "ansible-playbook failed unexpectedly",
}


def install_collections(dest: Path | None = None, say=print) -> Path:
    """Install the pinned collections into ``dest`` (tfps's own directory by default); one line."""
    dest = Path(dest or playbooks.user_collections())
    pins = playbooks.pinned_collections()
    say(f"tfps: installing the Ansible collections {', '.join(f'{n} {v}' for n, v in pins)} into {dest} "
        f"(from PyPI's ansible=={ANSIBLE_RELEASE}; once)", flush=True)
    with tempfile.TemporaryDirectory(prefix="tfps-collections-") as work:
        req = os.path.join(work, "req.txt")
        with open(req, "w") as fh:
            fh.write(f"ansible=={ANSIBLE_RELEASE} --hash=sha256:{ANSIBLE_WHEEL_SHA256}\n")
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                               "--only-binary=:all:", "--require-hashes", "-r", req, "-d", work],
                              capture_output=True, text=True)
        wheels = glob.glob(os.path.join(work, "ansible-*.whl"))
        if done.returncode or not wheels:
            last = (done.stderr.strip().splitlines() or ["no wheel"])[-1]
            raise ConfigError(f"could not download ansible=={ANSIBLE_RELEASE} from PyPI ({last}); with Galaxy "
                              f"access run: ansible-galaxy collection install -r "
                              f"{playbooks.ansible_dir() / 'requirements.yml'} -p {dest}", "collections")
        with zipfile.ZipFile(wheels[0]) as wheel:
            names = wheel.namelist()
            for name, version in pins:
                ns, coll = name.split(".")
                prefix = f"ansible_collections/{ns}/{coll}/"
                have = json.loads(wheel.read(prefix + "MANIFEST.json"))["collection_info"]["version"]
                if have != version:
                    raise ConfigError(f"ansible=={ANSIBLE_RELEASE} ships {name} {have}, requirements.yml pins "
                                      f"{version}", "collections")
                staging = os.path.join(work, "staging")
                for member in names:
                    if member.startswith(prefix):
                        wheel.extract(member, staging)
                target = dest / "ansible_collections" / ns / coll
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.rmtree(target, ignore_errors=True)
                shutil.move(os.path.join(staging, "ansible_collections", ns, coll), target)
    return dest


def ensure_collections(install: bool = True) -> None:
    """Refuse in one line, or install once, when a pinned collection is missing."""
    missing = playbooks.missing_collections()
    if not missing:
        return
    if not install or os.environ.get("TFPS_INSTALL_COLLECTIONS", "1") == "0":
        raise ConfigError(f"the Ansible collection{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                          f"{'are' if len(missing) > 1 else 'is'} not installed; install with: tfps collections "
                          "(or, in a checkout, make collections)", "collections")
    install_collections(say=lambda *a, **k: print(*a, file=sys.stderr, **k))


def playbook_argv(command: str, inventories: list[str], playbook_args: list[str], check: bool = False,
                  diff: bool = False, extra: list[str] | None = None) -> list[str]:
    """ansible-playbook's command line for ``tfps COMMAND``."""
    argv = [*playbooks.ansible_playbook(), str(playbooks.playbook(playbooks.PLAYBOOKS[command]))]
    for source in inventories:
        argv += ["-i", os.path.abspath(source) if os.path.exists(source) else source]
    argv += list(playbook_args)
    argv += ["--check"] if check else []
    argv += ["--diff"] if diff else []
    extra = list(extra or [])
    if extra and extra[0] == "--":
        extra = extra[1:]
    return argv + extra


#: How a host that cannot be reached shows in a play's output: the role's own check
#: ("h1 (192.0.2.1) cannot be reached over SSH: ...") or Ansible's ("fatal: [h1]: UNREACHABLE!").
_UNREACHABLE = (re.compile(r"([\w.:\-]+ \([^)]*\)) cannot be reached over SSH"),
                re.compile(r"^fatal: \[([^\]]+)\]: UNREACHABLE!"))


def unreachable_hosts(line: str) -> list[str]:
    """The hosts a line of ansible-playbook's output reports as unreachable (in order, once)."""
    found: list[str] = []
    line = line.replace("\\n", "\n")     # JSON output keeps a message's newlines escaped
    for pattern in _UNREACHABLE:
        for host in pattern.findall(line):
            if host not in found:
                found.append(host)
    return found


def run_playbook(command: str, inventories: list[str], playbook_args: list[str], check: bool = False,
                 diff: bool = False, extra: list[str] | None = None) -> int:
    """Run the command's playbook in the foreground; ansible-playbook's exit code.

    Its output is passed through line by line (colours kept on a terminal), so that the one
    line tfps adds after a failure can name the hosts that could not be reached."""
    argv = playbook_argv(command, inventories, playbook_args, check, diff, extra)
    ensure_collections()
    env = playbooks.playbook_env()
    if sys.stdout.isatty():
        env.setdefault("ANSIBLE_FORCE_COLOR", "1")
    unreachable: dict[str, str] = {}     # host -> how the last line names it
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True, errors="replace", bufsize=1)
    try:
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            for host in unreachable_hosts(_plain(line)):
                name = host.split(" (")[0]
                if " (" in host or name not in unreachable:    # "h1 (192.0.2.1)" over Ansible's "h1"
                    unreachable[name] = host
        code = proc.wait()
    except KeyboardInterrupt:
        # The terminal's Ctrl-C reached ansible-playbook too: let it end its own way.
        try:
            proc.wait(timeout=30)
        except (KeyboardInterrupt, subprocess.TimeoutExpired):
            proc.kill()
        return 130
    if code:
        code, line = failure(command, code, [unreachable[h] for h in sorted(unreachable)])
        print(line, file=sys.stderr, flush=True)
    return code


#: ansible-playbook's code for a host it could not reach; tfps's too (README, "Exit codes").
UNREACHABLE_EXIT = int(ExitCode.HOST_UNREACHABLE)


def failure(command: str, code: int, unreachable: list[str]) -> tuple[int, str]:
    """(the exit code, the one line) of a play that exited ``code``, ``unreachable`` naming the hosts
    it could not reach. An unreachable host makes it :data:`UNREACHABLE_EXIT` whichever way the play
    learnt it: Ansible's own UNREACHABLE (4 already) or the role's reachability check, a failed task
    (which makes ansible-playbook exit 2)."""
    if not unreachable:
        why = PLAYBOOK_EXITS.get(code, "see the output above")
        return code, f"tfps: error: {command}: ansible-playbook exited {code}: {why}"
    how = "" if code == UNREACHABLE_EXIT else f" (ansible-playbook exited {code}: the role's check failed)"
    return UNREACHABLE_EXIT, (f"tfps: error: {command}: {', '.join(unreachable)} cannot be reached over SSH{how}: "
                              "check the inventory's addresses, ansible_user and SSH access (`ansible -i INVENTORY "
                              "HOST -m ping` shows Ansible's reason)")


def _plain(line: str) -> str:
    """A line without the terminal's colour codes."""
    return re.sub(r"\x1b\[[0-9;]*m", "", line)

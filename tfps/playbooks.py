"""Where tfps's Ansible files are: the playbooks, the role, ansible.cfg, the collection pins.

They ship inside the package (``tfps/ansible``, package data) and are found through
``importlib.resources``, so a git checkout and an installed wheel behave the same (the
checkout's top-level ``ansible`` is a symlink to them, for ``ansible-playbook -i INV
ansible/deploy.yml``). The Ansible collections the playbooks need (``requirements.yml``)
are not shipped: a checkout installs them into ``tfps/ansible/collections`` (``make
collections``), an installed tfps into a directory of its own (:func:`user_collections`);
:func:`missing_collections` says which are absent from every place Ansible looks.
"""

from __future__ import annotations

import json
import os
import sys
from importlib import resources
from pathlib import Path

from tfps.errors import ConfigError

#: The commands that run a packaged playbook, and the playbook each runs.
PLAYBOOKS = {"deploy": "deploy.yml", "stop": "stop.yml", "status": "status.yml", "cleanup": "cleanup.yml",
             "jobs": "jobs.yml"}


def ansible_dir() -> Path:
    """tfps's Ansible directory: playbooks, ``roles/tfps``, ``ansible.cfg``, ``requirements.yml``."""
    return Path(str(resources.files("tfps") / "ansible"))


def role_dir() -> Path:
    """The tfps role (``TFPS_ROLE_DIR`` overrides it, for a role kept elsewhere)."""
    return Path(os.environ.get("TFPS_ROLE_DIR") or ansible_dir() / "roles" / "tfps")


def playbook(name: str) -> Path:
    """A packaged playbook by file name (``deploy.yml``); a missing one is a broken install."""
    path = ansible_dir() / name
    if not path.is_file():
        raise ConfigError(f"{path} is missing: this tfps installation is incomplete; reinstall it "
                          "(pip install --force-reinstall tfps)", "playbook")
    return path


def user_collections() -> Path:
    """The collections directory tfps owns for an installed package (``tfps collections`` fills it)."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "tfps" / "collections"


def collections_path(environ=os.environ) -> list[str]:
    """Where the playbooks look for collections, first match wins: the user's own
    ``ANSIBLE_COLLECTIONS_PATH``, the checkout's ``tfps/ansible/collections``, tfps's own
    directory, then Ansible's defaults."""
    own = environ.get("ANSIBLE_COLLECTIONS_PATH") or environ.get("ANSIBLE_COLLECTIONS_PATHS") or ""
    paths = [p for p in own.split(os.pathsep) if p]
    paths += [str(ansible_dir() / "collections"), str(user_collections()),
              os.path.join(os.path.expanduser("~"), ".ansible", "collections"), "/usr/share/ansible/collections"]
    return list(dict.fromkeys(paths))


def pinned_collections() -> list[tuple[str, str]]:
    """(name, version) of each collection in ``requirements.yml``."""
    import yaml
    data = yaml.safe_load((ansible_dir() / "requirements.yml").read_text(encoding="utf-8"))
    return [(c["name"], str(c["version"])) for c in data["collections"]]


def _installed(name: str, paths: list[str]) -> bool:
    ns, coll = name.split(".")
    # Ansible also finds collections installed as Python packages (the ``ansible`` package on PyPI).
    for base in [*paths, *sys.path]:
        manifest = os.path.join(base or ".", "ansible_collections", ns, coll, "MANIFEST.json")
        try:
            with open(manifest, encoding="utf-8") as fh:
                json.load(fh)
            return True
        except (OSError, ValueError):
            continue
    return False


def missing_collections(environ=os.environ) -> list[str]:
    """The pinned collections found nowhere Ansible will look (``name version``)."""
    paths = collections_path(environ)
    return [f"{name} {version}" for name, version in pinned_collections() if not _installed(name, paths)]


def playbook_env(environ=os.environ) -> dict[str, str]:
    """The environment for ``ansible-playbook`` running a packaged playbook: tfps's
    ansible.cfg and the collections path above."""
    # cryptography warns, when ansible-core imports its DSA key type, that DSA is deprecated:
    # someone else's notice before every play (tfps.cli filters it in-process the same way).
    warnings = ",".join(w for w in (environ.get("PYTHONWARNINGS"), "ignore:DSA is deprecated") if w)
    return dict(environ, ANSIBLE_CONFIG=str(ansible_dir() / "ansible.cfg"), PYTHONWARNINGS=warnings,
                ANSIBLE_COLLECTIONS_PATH=os.pathsep.join(collections_path(environ)))


def ansible_playbook() -> list[str]:
    """``ansible-playbook`` of this Python's environment (the one whose ansible-core tfps
    imports): its script, or ``python -m ansible playbook`` where the script is elsewhere
    (a venv that reaches ansible-core through another's site-packages)."""
    binary = Path(sys.executable).with_name("ansible-playbook")
    if binary.exists():
        return [str(binary)]
    import importlib.util
    if importlib.util.find_spec("ansible") is not None and importlib.util.find_spec("ansible.__main__"):
        return [sys.executable, "-m", "ansible", "playbook"]
    raise ConfigError("ansible-playbook is not installed next to this Python: pip install 'tfps[ansible]'",
                      "inventory")

"""Build the Ansible collection tfps.tfps from tfps/ansible: python galaxy/build.py OUTDIR.

Assembles the collection in a temporary directory from the files the wheel ships (no
second copy of the role is kept in the repository), then runs ``ansible-galaxy collection
build`` on it and prints the tarball's path:

- ``roles/tfps``: the role's tasks, defaults, vars and meta;
- ``plugins/{modules,action,filter,lookup,module_utils}``: the role's ``library/``,
  ``action_plugins/``, ``filter_plugins/``, ``lookup_plugins/`` and ``module_utils/`` (a
  role inside a collection cannot carry plugins of its own); the modules' imports of the
  role's module_utils (``from ansible.module_utils.tfps_docker import ...``) name the
  collection's instead;
- ``playbooks/``: deploy.yml, stop.yml, status.yml, cleanup.yml (``ansible-playbook
  tfps.tfps.deploy``);
- ``galaxy.yml`` (this directory's, with tfps's version), ``meta/runtime.yml``, README.md.

In the copies, the role and plugins are named by their fully qualified names
(``tfps.tfps.tfps``, ``tfps.tfps.tfps_plan``, ``| tfps.tfps.tfps_plan_row``, ...): the
standalone role finds them by their short names, a collection's role must not rely on that.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "tfps" / "ansible"
ROLE = SOURCE / "roles" / "tfps"
HERE = Path(__file__).resolve().parent
PLAYBOOKS = ("deploy.yml", "stop.yml", "status.yml", "cleanup.yml")
#: The role's plugin directories -> the collection's.
PLUGIN_DIRS = {"library": "modules", "action_plugins": "action", "filter_plugins": "filter",
               "lookup_plugins": "lookup", "module_utils": "module_utils"}
REQUIRES_ANSIBLE = ">=2.17"


def version() -> str:
    """tfps's one version (tfps/__init__.py), without importing tfps."""
    text = (REPO / "tfps" / "__init__.py").read_text(encoding="utf-8")
    return re.search(r'^__version__ = "([^"]+)"', text, re.M).group(1)


def plugin_names(directory: Path) -> set[str]:
    return {p.stem for p in directory.glob("*.py") if not p.name.startswith("_")}


def filter_names() -> set[str]:
    """The filters the role's filter plugins define (their ``filters()`` keys)."""
    names = set()
    for path in (ROLE / "filter_plugins").glob("*.py"):
        names |= set(re.findall(r'"(tfps_[a-z0-9_]+)": tfps_', path.read_text(encoding="utf-8")))
    return names


def qualify(text: str, fqcn: str, modules: set[str], filters: set[str], lookups: set[str]) -> str:
    """The role's and its plugins' short names in a task file -> fully qualified names."""
    def alt(names: set[str]) -> str:
        return "|".join(sorted(map(re.escape, names), key=len, reverse=True))

    # A task's module: a key of its own line, its arguments below it.
    text = re.sub(rf"^(\s*(?:-\s+)?)({alt(modules)}):([ \t]*(?:#.*)?)$", rf"\1{fqcn}.\2:\3", text, flags=re.M)
    # Filters: after a pipe (possibly across a line break), or named in map('...').
    text = re.sub(rf"(\|\s*)({alt(filters)})\b", rf"\1{fqcn}.\2", text)
    text = re.sub(rf"(\bmap\(\s*)(['\"])({alt(filters)})\2", rf"\1\2{fqcn}.\3\2", text)
    text = re.sub(rf"(\b(?:lookup|query)\(\s*)(['\"])({alt(lookups)})\2", rf"\1\2{fqcn}.\3\2", text)
    # The role itself, in the playbooks.
    text = re.sub(r"^(\s*(?:-\s+)?(?:role|name):\s+)tfps([ \t]*)$", rf"\1{fqcn}.tfps\2", text, flags=re.M)
    return text


def module_utils_imports(text: str, fqcn: str) -> str:
    """The role's own module_utils imports (``ansible.module_utils.tfps_*``, found in the
    role's module_utils/) -> the collection's (``ansible_collections.NS.NAME.plugins.module_utils``)."""
    ns, name = fqcn.split(".")
    return re.sub(r"^(\s*from\s+)ansible\.module_utils\.(tfps_\w+)(\s+import\b)",
                  rf"\1ansible_collections.{ns}.{name}.plugins.module_utils.\2\3", text, flags=re.M)


def assemble(dest: Path) -> Path:
    """The collection's tree under ``dest`` (returned)."""
    meta = yaml.safe_load((HERE / "galaxy.yml").read_text(encoding="utf-8"))
    fqcn = f"{meta['namespace']}.{meta['name']}"
    modules = plugin_names(ROLE / "library") | plugin_names(ROLE / "action_plugins")
    filters, lookups = filter_names(), plugin_names(ROLE / "lookup_plugins")
    root = dest / "collection"
    role = root / "roles" / "tfps"
    for sub in ("defaults", "meta", "tasks", "vars"):
        for path in sorted((ROLE / sub).glob("*.yml")):
            out = role / sub / path.name
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(qualify(path.read_text(encoding="utf-8"), fqcn, modules, filters, lookups),
                           encoding="utf-8")
    shutil.copy2(ROLE / "README.md", role / "README.md")
    for src, dst in PLUGIN_DIRS.items():
        (root / "plugins" / dst).mkdir(parents=True, exist_ok=True)
        for path in sorted((ROLE / src).glob("*.py")):
            shutil.copy2(path, root / "plugins" / dst / path.name)
            text = path.read_text(encoding="utf-8")
            shared = module_utils_imports(text, fqcn)
            if shared != text:
                (root / "plugins" / dst / path.name).write_text(shared, encoding="utf-8")
    (root / "playbooks").mkdir()
    for name in PLAYBOOKS:
        text = (SOURCE / name).read_text(encoding="utf-8")
        (root / "playbooks" / name).write_text(qualify(text, fqcn, modules, filters, lookups), encoding="utf-8")
    (root / "meta").mkdir()
    (root / "meta" / "runtime.yml").write_text(f'---\nrequires_ansible: "{REQUIRES_ANSIBLE}"\n', encoding="utf-8")
    shutil.copy2(HERE / "README.md", root / "README.md")
    shutil.copy2(REPO / "LICENSE", root / "LICENSE")
    meta["version"] = version()
    (root / "galaxy.yml").write_text(yaml.safe_dump(meta, sort_keys=False), encoding="utf-8")
    return root


def galaxy() -> list[str]:
    """``ansible-galaxy`` next to this Python, else on PATH."""
    binary = Path(sys.executable).with_name("ansible-galaxy")
    return [str(binary)] if binary.exists() else ["ansible-galaxy"]


def build(outdir: Path) -> Path:
    """Assemble and build; the tarball's path."""
    outdir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tfps-galaxy-") as tmp:
        root = assemble(Path(tmp))
        done = subprocess.run([*galaxy(), "collection", "build", str(root), "--output-path", str(outdir), "--force"],
                              capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"galaxy/build.py: ansible-galaxy collection build failed: {done.stderr.strip() or done.stdout}")
    return outdir / f"tfps-tfps-{version()}.tar.gz"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Build the Ansible collection tfps.tfps from tfps/ansible.")
    parser.add_argument("outdir", nargs="?", default=str(REPO / "dist"), help="where the tarball goes (default: dist/)")
    parser.add_argument("--tree", metavar="DIR", help="only assemble the collection's files into DIR/collection")
    args = parser.parse_args(argv)
    if args.tree:
        print(assemble(Path(args.tree)))
        return 0
    print(build(Path(args.outdir)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

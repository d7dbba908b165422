"""tfps plan reads inventories through ansible-core's public API, with no per-process state.

ansible-core's CLI keeps its arguments, extra vars and (2.19+) vault secrets once per
process. tfps builds DataLoader, InventoryManager and VariableManager itself, so plans read
one after another in one process (``tfps compose -i``, tests, a notebook) each get their own
sources, ``-e`` values and vault passwords, and ansible-core's CLI state stays as it was.
These run in the test process (no subprocess), on whatever ansible-core is installed
(2.17 to 2.21 are supported; see docs/ansible.md).
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def no_user_config(tmp_path, monkeypatch):
    """No ansible.cfg, vault password file or inventory of the machine leaks in."""
    for name in [n for n in __import__("os").environ if n.startswith("ANSIBLE_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("ANSIBLE_LOCAL_TEMP", str(tmp_path / "ansible-tmp"))


def vaulted(password: str, plaintext: str) -> str:
    """The ``!vault |`` block of one value, encrypted with ``password``."""
    from ansible.parsing.vault import VaultLib, VaultSecret

    ciphertext = VaultLib([("default", VaultSecret(password.encode()))]).encrypt(plaintext).decode()
    return "!vault |\n" + textwrap.indent(ciphertext.strip(), "  ")


def inventory(directory: Path, password: str, port: str, steps: int) -> Path:
    """An INI inventory whose worker's tfps_base_port is vaulted (inline) with ``password``."""
    directory.mkdir(parents=True)
    (directory / "hosts.ini").write_text("[ps]\np\n[worker]\nw tfps_workers=2\n")
    (directory / "host_vars").mkdir()
    (directory / "host_vars/w.yml").write_text(f"tfps_base_port: {vaulted(password, port)}\n")
    (directory / "group_vars").mkdir()
    (directory / "group_vars/all.yml").write_text(f"tfps_train_steps: {steps}\n")
    return directory / "hosts.ini"


def password_file(path: Path, password: str) -> str:
    path.write_text(password + "\n")
    return str(path)


def ports(data: dict) -> list[int]:
    return [t["port"] for t in data["tasks"]]


def test_two_inventories_with_different_vault_passwords_in_one_process(tmp_path):
    from tfps.cluster.inventory import load_plan, load_view, plan_from_view

    a = inventory(tmp_path / "a", "password-a", "3100", 11)
    b = inventory(tmp_path / "b", "password-b", "4100", 22)
    pa = password_file(tmp_path / "pa", "password-a")
    pb = password_file(tmp_path / "pb", "password-b")

    plan_a = load_plan([str(a)], vault_password_files=[pa])
    assert ports(plan_a) == [2222, 3100, 3101]
    assert "--train_steps=11" in plan_a["tasks"][0]["argv"]
    plan_b = load_plan([str(b)], vault_ids=[f"other@{pb}"])
    assert ports(plan_b) == [2222, 4100, 4101]
    assert "--train_steps=22" in plan_b["tasks"][0]["argv"]
    # And back: nothing of b's password or values stayed behind.
    assert load_plan([str(a)], vault_password_files=[pa]) == plan_a

    # A view keeps its own secrets: one read before another still decrypts with its own.
    view_a = load_view([str(a)], vault_password_files=[pa])
    view_b = load_view([str(b)], vault_password_files=[pb])
    assert ports(plan_from_view(*view_a)) == [2222, 3100, 3101]
    assert ports(plan_from_view(*view_b)) == [2222, 4100, 4101]


def test_the_wrong_or_no_password_after_the_right_one_is_refused(tmp_path):
    from tfps.cluster.inventory import load_plan
    from tfps.errors import ConfigError

    a = inventory(tmp_path / "a", "password-a", "3100", 11)
    assert ports(load_plan([str(a)], vault_password_files=[password_file(tmp_path / "pa", "password-a")])) == [
        2222, 3100, 3101]
    for options in ({}, {"vault_password_files": [password_file(tmp_path / "pb", "password-b")]}):
        with pytest.raises(ConfigError) as info:
            load_plan([str(a)], **options)
        assert info.value.field == "tfps_base_port"
        assert "host 'w'" in info.value.message and "--vault-password-file" in info.value.message


def test_extra_vars_belong_to_their_call_and_the_cli_state_is_untouched(tmp_path):
    from ansible import context
    from tfps.cluster.inventory import load_plan

    source = inventory(tmp_path / "a", "password-a", "3100", 11)
    pa = password_file(tmp_path / "pa", "password-a")
    cliargs = context.CLIARGS
    given = load_plan([str(source)], extra_vars=["tfps_train_steps=77", '{"tfps_base_port": "{{ 2000 + 600 }}"}'],
                      vault_password_files=[pa])
    assert ports(given) == [2600, 2600, 2601]
    assert "--train_steps=77" in given["tasks"][0]["argv"]
    again = load_plan([str(source)], vault_password_files=[pa])
    assert ports(again) == [2222, 3100, 3101]
    assert "--train_steps=11" in again["tasks"][0]["argv"]
    # ansible-core's process-wide CLI arguments were neither replaced nor filled in.
    assert context.CLIARGS is cliargs
    assert not context.CLIARGS.get("extra_vars")


def test_this_ansible_core_has_what_tfps_uses():
    from ansible.release import __version__

    from tfps.compat import check_ansible

    major, minor = (int(p) for p in __version__.split(".")[:2])
    assert (2, 17) <= (major, minor) < (2, 22), __version__
    check_ansible()


def test_a_missing_ansible_internal_is_named_in_one_line(monkeypatch):
    """A future ansible-core whose HostVars keeps its VariableManager elsewhere."""
    import re

    from ansible.vars.hostvars import HostVars

    from tfps import compat
    from tfps.errors import ConfigError

    def renamed(self, inventory, variable_manager, loader):
        self._inventory, self._vm, self._loader = inventory, variable_manager, loader

    monkeypatch.setattr(HostVars, "__init__", renamed)
    monkeypatch.setattr(compat.ansible, "_ANSIBLE_CHECKED", False)
    with pytest.raises(ConfigError) as info:
        compat.check_ansible()
    assert re.match(r"^tfps needs HostVars\._variable_manager from ansible-core 2\.17\+'s ansible\.vars\.hostvars; "
                    r"this is ansible-core \S+", info.value.message), info.value.message
    assert "\n" not in info.value.message


#: Private names of ansible-core that tfps used to reach; only tfps/compat/ansible.py may name
#: ansible-core's internals.
ANSIBLE_PRIVATE = {"_play_prereqs", "_Singleton__instance", "_current", "_variable_manager", "_inventory",
                   "_role", "_sources", "_init_global_context", "_extra_vars", "_options_vars"}


def _offences(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        where = f"{path.relative_to(REPO)}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Attribute) and node.attr in ANSIBLE_PRIVATE:
            found.append(f"{where} .{node.attr}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and (
                node.value in ANSIBLE_PRIVATE or node.value.startswith("ansible._internal")):
            found.append(f"{where} {node.value!r}")
        elif isinstance(node, ast.ImportFrom) and node.module and (
                node.module.startswith("ansible._internal") or ".collection_loader._" in node.module):
            found.append(f"{where} from {node.module} import")
    return found


def test_only_compat_names_ansible_internals():
    plugins = REPO / "ansible/roles/tfps"
    paths = [p for p in sorted((REPO / "tfps").rglob("*.py")) if p != REPO / "tfps/compat/ansible.py"]
    paths += [p for kind in ("action_plugins", "filter_plugins", "library", "lookup_plugins")
              for p in sorted((plugins / kind).glob("*.py"))]
    offences = [o for path in paths for o in _offences(path)]
    assert offences == [], "move these into tfps/compat/ansible.py:\n" + "\n".join(offences)

"""tfps plan asks Ansible: every kind of inventory source gives the plan Ansible's view gives.

``tfps plan -i SOURCE`` must read an inventory exactly as ``ansible-inventory -i SOURCE
--list`` (and the play) does: the same hosts in ps and worker in the same order, the
same variables after every precedence rule. Each case of tests/fixtures/inventories/ is
checked against ansible-inventory and against a layout written down here, so that a
test fails when both agree on something wrong.

Runs the installed commands (.venv/bin/tfps, ansible-inventory, ansible-playbook) as
subprocesses; contacts no host.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from ansible.release import __version__ as ANSIBLE_CORE

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests/fixtures"
INVENTORIES = FIXTURES / "inventories"
BIN = Path(sys.executable).parent
TFPS = BIN / "tfps"
ANSIBLE_INVENTORY = BIN / "ansible-inventory"
ANSIBLE_PLAYBOOK = BIN / "ansible-playbook"
ANSIBLE_VAULT = BIN / "ansible-vault"
LAYOUT_KEYS = ("ansible_host", "tfps_address", "tfps_base_port", "tfps_ps_tasks", "tfps_workers", "tfps_gpus", "tfps_gpu_count")

# ansible-core is a dev dependency: where it is missing these tests fail, they never skip.

#: ansible-core 2.19+ tags every value with its file and line, INI ones included (and quotes
#: a failing inventory script's exit code); 2.17 and 2.18 know the lines of YAML values only.
INI_LINES = tuple(int(p) for p in ANSIBLE_CORE.split(".")[:2]) >= (2, 19)


# --------------------------------------------------------------------------- helpers


@pytest.fixture(scope="session")
def env(tmp_path_factory) -> dict:
    """The environment of every command: no user Ansible config, vault or inventory leaks in."""
    home = tmp_path_factory.mktemp("home")
    result = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    result.update(
        HOME=str(home),
        ANSIBLE_LOCAL_TEMP=str(home / "ansible-tmp"),
        ANSIBLE_CONFIG=str(home / "no-ansible.cfg"),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_ROLES_PATH=str(REPO / "ansible/roles"),
        ANSIBLE_COLLECTIONS_PATH=str(REPO / "ansible/collections"),
        # The play's port task (plan.yml) goes to each host over SSH; these hosts are made up.
        # ssh's proxy command `false` makes each one unreachable at once, without a packet
        # sent (the play keeps the plan's ports, as for any unreachable host): no wait for
        # SSH's connect timeout on addresses nobody answers on.
        ANSIBLE_SSH_ARGS="-o ProxyCommand=false",
    )
    return result


def run(env: dict, *args, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, env=env,
                          cwd=cwd or REPO, timeout=300)


def sources_args(sources) -> list[str]:
    args = []
    for source in sources:
        args += ["-i", str(source)]
    return args


def tfps_plan(env: dict, sources, *options) -> dict:
    """``tfps plan -i ... --format json``; it must succeed."""
    proc = run(env, TFPS, "plan", *sources_args(sources), *options, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def tfps_fails(env: dict, sources, *options) -> str:
    """``tfps plan`` must exit 2 with nothing on stdout and ONE line ``tfps: error: ...``."""
    proc = run(env, TFPS, "plan", *sources_args(sources), *options, "--format", "json")
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("tfps: error: "), proc.stderr
    return lines[0]


def ansible_view(env: dict, sources, *options) -> dict:
    """``ansible-inventory -i ... --list``."""
    proc = run(env, ANSIBLE_INVENTORY, *sources_args(sources), *options, "--list")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def group_hosts(view: dict, group: str) -> list[str]:
    """A group's hosts in Ansible's order (its own, then its children's), from --list output."""
    node = view.get(group) or {}
    hosts = list(node.get("hosts", []))
    for child in node.get("children", []):
        hosts += group_hosts(view, child)
    return list(dict.fromkeys(hosts))


def layout(data: dict) -> list[tuple]:
    """(task, host, address, port, gpu) of every task of a plan, in plan order."""
    return [(t["name"], t["host"], t["address"], t["port"], t["gpu"]) for t in data["tasks"]]


def workers_per_host(data: dict) -> dict[str, int]:
    counts: dict[str, int] = {}
    for task in data["tasks"]:
        if task["job"] == "worker":
            counts[task["host"]] = counts.get(task["host"], 0) + 1
    return counts


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def ini(tmp_path: Path, text: str, name: str = "hosts.ini") -> Path:
    return write(tmp_path / name, text)


# --------------------------------------------------------------------------- the cases


def script_source(tmp_path: Path) -> Path:
    """The inventory script, executable (a checkout may lose the mode bit)."""
    target = tmp_path / "script" / "inventory.py"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(INVENTORIES / "script/inventory.py", target)
    target.write_text(target.read_text().replace("#!/usr/bin/env python3", f"#!{sys.executable}", 1))
    target.chmod(target.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return target


#: Each case: inventory sources, then the expected layout
#: (task, host, address, port, gpu) and the number of workers per worker host.
CASES = {
    "ini": (
        lambda tmp: [INVENTORIES / "ini/hosts.ini"],
        [
            ("ps0", "p1", "10.0.0.1", 2222, None),
            ("ps1", "p1", "10.0.0.1", 2223, None),
            ("worker0", "b", "10.0.0.2", 3000, None),
            ("worker1", "b", "10.0.0.2", 3001, None),
            ("worker2", "g", "10.0.0.3", 3000, "0"),
            ("worker3", "g", "10.0.0.3", 3001, "1"),
            ("worker4", "c", "c", 3000, None),
        ],
        {"b": 2, "g": 2, "c": 1},
    ),
    # group_vars/worker.yml (tfps_workers: 4) outranks [worker:vars] (3); w2's inline 1 outranks both.
    "ini_group_vars": (
        lambda tmp: [INVENTORIES / "ini_group_vars/hosts.ini"],
        [
            ("ps0", "p", "10.0.1.1", 2222, None),
            ("worker0", "w1", "10.0.1.2", 4000, None),
            ("worker1", "w1", "10.0.1.2", 4001, None),
            ("worker2", "w1", "10.0.1.2", 4002, None),
            ("worker3", "w1", "10.0.1.2", 4003, None),
            ("worker4", "w2", "10.0.1.3", 4000, None),
        ],
        {"w1": 4, "w2": 1},
    ),
    "yaml_dir": (
        lambda tmp: [INVENTORIES / "yaml_dir"],
        [
            ("ps0", "ps-b", "10.0.2.2", 2500, None),
            ("ps1", "ps-a", "10.0.2.1", 2300, None),
            ("worker0", "w-z", "10.0.2.9", 2500, None),
            ("worker1", "w-z", "10.0.2.9", 2501, None),
            ("worker2", "w-a", "10.0.2.8", 2500, "GPU-aa"),
            ("worker3", "w-a", "10.0.2.8", 2501, "GPU-bb"),
            ("worker4", "w-a", "10.0.2.8", 2502, "GPU-cc"),
        ],
        {"w-z": 2, "w-a": 3},
    ),
    # The host's own variables (_meta.hostvars) outrank the worker group's tfps_base_port.
    "script": (
        lambda tmp: [script_source(tmp)],
        [
            ("ps0", "sp", "10.0.3.1", 5000, None),
            ("worker0", "sw2", "10.0.3.3", 6000, None),
            ("worker1", "sw2", "10.0.3.3", 6001, None),
            ("worker2", "sw2", "10.0.3.3", 6002, None),
            ("worker3", "sw1", "10.0.3.2", 6000, "1"),
            ("worker4", "sw1", "10.0.3.2", 6001, "0"),
        ],
        {"sw2": 3, "sw1": 2},
    ),
    "constructed": (
        lambda tmp: [INVENTORIES / "constructed/base.yml", INVENTORIES / "constructed/constructed.yml"],
        [
            ("ps0", "n1", "10.0.4.1", 2222, None),
            ("worker0", "n3", "10.0.4.3", 2222, None),
            ("worker1", "n3", "10.0.4.3", 2223, None),
            ("worker2", "n2", "10.0.4.2", 2400, None),
        ],
        {"n3": 2, "n2": 1},
    ),
    "two_sources": (
        lambda tmp: [INVENTORIES / "two_sources/ps.ini", INVENTORIES / "two_sources/worker.yml"],
        [
            ("ps0", "q1", "10.0.5.1", 2222, None),
            ("ps1", "q2", "10.0.5.1", 2223, None),
            ("worker0", "v1", "10.0.5.2", 2222, None),
            ("worker1", "v1", "10.0.5.2", 2223, None),
            ("worker2", "v2", "10.0.5.3", 2222, None),
        ],
        {"v1": 2, "v2": 1},
    ),
}


#: Extra vars of the per-case runs: a job setting and a job name, which reach every task and
#: the containers' names, and change nothing in the layout.
CASE_EXTRA_VARS = ("-e", "tfps_train_steps=77", "-e", "tfps_job_name=other")


@pytest.mark.parametrize("case", list(CASES))
def test_tfps_plan_agrees_with_ansible_inventory_and_the_play(case, env, tmp_path):
    """One ``tfps plan -e ...`` per kind of source, checked against ``ansible-inventory --list``
    (hosts, groups, every layout variable), the layout written down for the case, the extra
    vars in every task's argv, and the plan the play computes with the same extra vars."""
    make_sources, expected_layout, expected_workers = CASES[case]
    sources = make_sources(tmp_path)
    data = tfps_plan(env, sources, *CASE_EXTRA_VARS)
    view = ansible_view(env, sources)

    # Same hosts in ps and worker, in the same order.
    ps_hosts, worker_hosts = group_hosts(view, "ps"), group_hosts(view, "worker")
    assert list(dict.fromkeys(t["host"] for t in data["tasks"] if t["job"] == "ps")) == ps_hosts
    assert list(dict.fromkeys(t["host"] for t in data["tasks"] if t["job"] == "worker")) == worker_hosts

    # Every host's layout variables are Ansible's values.
    hostvars = view["_meta"]["hostvars"]
    assert list(data["hosts"]) == ps_hosts + worker_hosts
    for host, reported in data["hosts"].items():
        ansible = {k: v for k, v in hostvars.get(host, {}).items() if k in LAYOUT_KEYS}
        assert reported == ansible, host
    for task in data["tasks"]:
        assert task["address"] == hostvars.get(task["host"], {}).get("ansible_host", task["host"])

    # And the layout is the one written down for the case.
    assert layout(data) == expected_layout
    assert workers_per_host(data) == expected_workers
    assert data["chief"] == "worker0"
    assert data["cluster"]["ps"] == [f"{a}:{p}" for n, h, a, p, g in expected_layout if n.startswith("ps")]
    assert data["cluster"]["worker"] == [f"{a}:{p}" for n, h, a, p, g in expected_layout if n.startswith("worker")]

    # Extra vars reach every task, and only their value.
    for task in data["tasks"]:
        assert "--train_steps=77" in task["argv"], task["name"]
        assert not any(a.startswith("--train_steps=") and a != "--train_steps=77" for a in task["argv"])
    assert data["job"]["train_steps"] == 77
    assert {t["container"] for t in data["tasks"]} == {f"tfps-other-{t['name']}" for t in data["tasks"]}

    # The play computes the same plan (ini_group_vars's play, with --playbook-dir too:
    # test_the_play_computes_the_same_plan_as_tfps_plan).
    if case != "ini_group_vars":
        out = tmp_path / "play_plan.json"
        proc = run(env, ANSIBLE_PLAYBOOK, *sources_args(sources), FIXTURES / "show_plan.yml", *CASE_EXTRA_VARS,
                   "-e", f"show_plan_file={out}")
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert json.loads(out.read_text()) == data


def test_extra_vars_outrank_every_layout_variable(env, tmp_path):
    data = tfps_plan(env, [INVENTORIES / "ini_group_vars/hosts.ini"], "-e", "tfps_base_port=7000",
                     "-e", '{"tfps_workers": 2}')
    assert [(t["host"], t["port"]) for t in data["tasks"]] == [
        ("p", 7000), ("w1", 7000), ("w1", 7001), ("w2", 7000), ("w2", 7001),
    ]


def test_job_settings_from_group_vars_all_reach_the_argv(env):
    data = tfps_plan(env, [INVENTORIES / "yaml_dir"])
    assert data["job"]["name"] == "yamldir"
    for task in data["tasks"]:
        argv = task["argv"]
        for arg in ("--model=cnn", "--train_steps=1234", "--batch_size=16", "--learning_rate=0.5",
                    "--run_name=yamldir", "--optimizer=sgd"):
            assert arg in argv, (task["name"], argv)
        assert argv[0] == "run"
        assert task["container"] == f"tfps-yamldir-{task['name']}"

    data = tfps_plan(env, [INVENTORIES / "ini_group_vars/hosts.ini"])
    for task in data["tasks"]:
        assert {"--model=linear", "--train_steps=300", "--run_name=gv"} <= set(task["argv"])


def test_job_settings_from_an_inventory_script_reach_the_argv(env, tmp_path):
    data = tfps_plan(env, [script_source(tmp_path)])
    for task in data["tasks"]:
        assert {"--train_steps=900", "--run_name=scripted"} <= set(task["argv"])


def test_group_vars_beside_the_playbook_count_only_with_playbook_dir(env, tmp_path):
    pb = tmp_path / "pb"
    write(pb / "group_vars/all.yml", "tfps_batch_size: 5\n")
    write(pb / "group_vars/ps.yml", "tfps_base_port: 2600\n")
    sources = [INVENTORIES / "ini_group_vars/hosts.ini"]

    without = tfps_plan(env, sources)
    assert not any("--batch_size=5" in t["argv"] for t in without["tasks"])
    assert without["tasks"][0]["port"] == 2222

    with_pb = tfps_plan(env, sources, "--playbook-dir", pb)
    for task in with_pb["tasks"]:
        assert "--batch_size=5" in task["argv"], task["name"]
    assert layout(with_pb) == [("ps0", "p", "10.0.1.1", 2600, None)] + CASES["ini_group_vars"][1][1:]
    assert with_pb["hosts"]["p"]["tfps_base_port"] == 2600


def test_templated_layout_variables_are_rendered_as_the_play_would(env, tmp_path):
    source = write(tmp_path / "hosts.yml", """
        all:
          vars:
            port_base: 3300
          children:
            ps:
              hosts:
                p: {ansible_host: "{{ inventory_hostname }}.lan"}
            worker:
              hosts:
                w: {tfps_base_port: "{{ port_base | int + 10 }}", tfps_workers: "{{ 1 + 1 }}"}
        """)
    data = tfps_plan(env, [source])
    assert layout(data) == [
        ("ps0", "p", "p.lan", 2222, None),
        ("worker0", "w", "w", 3310, None),
        ("worker1", "w", "w", 3311, None),
    ]


# --------------------------------------------------------------------------- the play computes the same plan


def test_the_play_computes_the_same_plan_as_tfps_plan(env, tmp_path):
    pb = tmp_path / "pb"
    pb.mkdir()
    shutil.copy(FIXTURES / "show_plan.yml", pb / "show_plan.yml")
    write(pb / "group_vars/all.yml", "tfps_batch_size: 5\n")
    out = tmp_path / "play_plan.json"
    source = INVENTORIES / "ini_group_vars/hosts.ini"

    proc = run(env, ANSIBLE_PLAYBOOK, "-i", source, pb / "show_plan.yml", "-e", "tfps_train_steps=77",
               "-e", f"show_plan_file={out}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    play = json.loads(out.read_text())

    cli = tfps_plan(env, [source], "-e", "tfps_train_steps=77", "--playbook-dir", pb)
    assert play == cli
    assert layout(play) == CASES["ini_group_vars"][1]
    assert workers_per_host(play) == {"w1": 4, "w2": 1}
    for task in play["tasks"]:
        assert {"--train_steps=77", "--batch_size=5", "--model=linear", "--run_name=gv"} <= set(task["argv"])


def test_the_play_and_tfps_plan_put_tasks_on_tfps_address(env, tmp_path):
    """A separate data network: peers (TF_CONFIG, the firewall's sources) use tfps_address,
    also when it is templated from another variable; SSH keeps ansible_host."""
    pb = tmp_path / "pb"
    pb.mkdir()
    shutil.copy(FIXTURES / "show_plan.yml", pb / "show_plan.yml")
    source = write(tmp_path / "inv/hosts.ini", """
        [ps]
        p ansible_host=192.0.2.1 tfps_address=10.9.0.1

        [worker]
        w1 ansible_host=192.0.2.2 data_ip=10.9.0.2 tfps_address="{{ data_ip }}"
        w2 ansible_host=192.0.2.3
        """)
    out = tmp_path / "play_plan.json"
    proc = run(env, ANSIBLE_PLAYBOOK, "-i", source, pb / "show_plan.yml", "-e", f"show_plan_file={out}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    play = json.loads(out.read_text())
    assert play == tfps_plan(env, [source], "--playbook-dir", pb)
    assert [(t["host"], t["address"], t["target"]) for t in play["tasks"]] == [
        ("p", "10.9.0.1", "10.9.0.1:2222"), ("w1", "10.9.0.2", "10.9.0.2:2222"), ("w2", "192.0.2.3", "192.0.2.3:2222"),
    ]
    assert play["cluster"] == {"ps": ["10.9.0.1:2222"], "worker": ["10.9.0.2:2222", "192.0.2.3:2222"]}
    assert play["hosts"]["w1"]["tfps_address"] == "10.9.0.2"


def test_a_second_plan_in_the_same_process_brings_its_own_options(env, tmp_path, vault_password, monkeypatch):
    """tfps compose -i and tests plan several times in one process: no option may leak."""
    from tfps.cluster.inventory import load_plan
    from tfps.errors import ConfigError

    monkeypatch.setenv("ANSIBLE_LOCAL_TEMP", env["ANSIBLE_LOCAL_TEMP"])
    vaulted = vaulted_port(env, tmp_path / "v", vault_password)
    pb = write(tmp_path / "pb/group_vars/all.yml", "tfps_batch_size: 5\n").parent.parent
    gv = str(INVENTORIES / "ini_group_vars/hosts.ini")

    first = load_plan([gv], extra_vars=["tfps_train_steps=77"], playbook_dir=str(pb))
    assert {"--train_steps=77", "--batch_size=5"} <= set(first["tasks"][0]["argv"])
    second = load_plan([gv])
    assert "--train_steps=300" in second["tasks"][0]["argv"]
    assert not any(a.startswith("--batch_size") for a in second["tasks"][0]["argv"])
    assert [t["port"] for t in load_plan([str(vaulted)], vault_password_files=[str(vault_password)])["tasks"]] == [
        2222, 3100, 3101]
    with pytest.raises(ConfigError) as info:
        load_plan([str(vaulted)])
    assert info.value.field == "tfps_base_port"
    assert layout(load_plan([str(INVENTORIES / "two_sources/ps.ini"), str(INVENTORIES / "two_sources/worker.yml")])) \
        == CASES["two_sources"][1]


# --------------------------------------------------------------------------- vault


@pytest.fixture
def vault_password(tmp_path) -> Path:
    path = tmp_path / "vault-password"
    path.write_text("tfps-test-password\n")
    return path


#: (password, value) -> its ``!vault |`` block: every test's password file holds the same
#: password, and a block made once decrypts with it in any test.
_ENCRYPTED: dict[tuple[str, str], str] = {}


def encrypt_string(env: dict, password: Path, value: str) -> str:
    """The ``!vault |`` block of one value (without the variable name), from ansible-vault."""
    key = (password.read_text(), value)
    if key not in _ENCRYPTED:
        proc = run(env, ANSIBLE_VAULT, "encrypt_string", "--vault-password-file", password, value)
        assert proc.returncode == 0, proc.stderr
        _ENCRYPTED[key] = proc.stdout.strip()
    return _ENCRYPTED[key]


def indent(block: str, spaces: int) -> str:
    return textwrap.indent(block, " " * spaces).lstrip()


def test_vaulted_value_the_plan_does_not_need_needs_no_password(env, tmp_path, vault_password):
    secret = encrypt_string(env, vault_password, "mailtos://user:secret@example.com")
    ini(tmp_path, "[ps]\np\n[worker]\nw tfps_workers=2\n")
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars/all.yml").write_text(
        f"tfps_train_steps: 55\ntfps_notify_urls:\n  - {indent(secret, 6)}\n")
    sources = [tmp_path / "hosts.ini"]
    assert ansible_view(env, sources, "--vault-password-file", vault_password)  # a valid vault value

    data = tfps_plan(env, sources)
    assert layout(data) == [("ps0", "p", "p", 2222, None), ("worker0", "w", "w", 2222, None),
                            ("worker1", "w", "w", 2223, None)]
    assert "--train_steps=55" in data["tasks"][0]["argv"]
    assert "user:secret@" not in json.dumps(data)   # (the plan names /run/secrets/..., never the value)
    with_password = tfps_plan(env, sources, "--vault-password-file", vault_password)
    assert with_password == data
    assert "user:secret@" not in json.dumps(with_password)


def vaulted_port(env: dict, tmp_path: Path, password: Path) -> Path:
    secret = encrypt_string(env, password, "3100")
    tmp_path.mkdir(parents=True, exist_ok=True)
    ini(tmp_path, "[ps]\np\n[worker]\nw tfps_workers=2\n")
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "host_vars/w.yml").write_text(f"tfps_base_port: {indent(secret, 2)}\n")
    return tmp_path / "hosts.ini"


def test_vaulted_layout_variable_without_the_password_says_to_pass_it(env, tmp_path, vault_password):
    source = vaulted_port(env, tmp_path, vault_password)
    line = tfps_fails(env, [source])
    assert "tfps_base_port" in line
    assert "'w'" in line
    assert "--vault-password-file" in line
    assert str(tmp_path / "host_vars/w.yml") in line


@pytest.mark.parametrize("option", ["--vault-password-file", "--vault-id"])
def test_vaulted_layout_variable_with_the_password(env, tmp_path, vault_password, option):
    source = vaulted_port(env, tmp_path, vault_password)
    data = tfps_plan(env, [source], option, vault_password)
    assert layout(data) == [("ps0", "p", "p", 2222, None), ("worker0", "w", "w", 3100, None),
                            ("worker1", "w", "w", 3101, None)]
    # A vaulted value is a string once decrypted (as in the play); the plan still reads it as a port.
    assert str(data["hosts"]["w"]["tfps_base_port"]) == "3100"


def test_wrong_vault_password_is_an_error(env, tmp_path, vault_password):
    source = vaulted_port(env, tmp_path, vault_password)
    wrong = tmp_path / "wrong-password"
    wrong.write_text("not-it\n")
    line = tfps_fails(env, [source], "--vault-password-file", wrong)
    assert "tfps_base_port" in line or "decrypt" in line.lower()


def test_vault_encrypted_group_vars_file_without_the_password_says_to_pass_it(env, tmp_path, vault_password):
    ini(tmp_path, "[ps]\np\n[worker]\nw\n")
    vault = write(tmp_path / "group_vars/all/vault.yml", "tfps_notify_urls: ['mailtos://u:secret@x']\n")
    write(tmp_path / "group_vars/all/vars.yml", "tfps_train_steps: 55\n")
    proc = run(env, ANSIBLE_VAULT, "encrypt", "--vault-password-file", vault_password, vault)
    assert proc.returncode == 0, proc.stderr
    data = tfps_plan(env, [tmp_path / "hosts.ini"], "--vault-password-file", vault_password)
    assert "--train_steps=55" in data["tasks"][0]["argv"]

    line = tfps_fails(env, [tmp_path / "hosts.ini"])
    assert "--vault-password-file" in line
    assert "vault.yml" in line


# --------------------------------------------------------------------------- bad input


def test_missing_path(env, tmp_path):
    missing = tmp_path / "nope.ini"
    line = tfps_fails(env, [missing])
    assert str(missing) in line and "no such file" in line


def test_missing_second_source(env, tmp_path):
    missing = tmp_path / "nope.yml"
    line = tfps_fails(env, [INVENTORIES / "two_sources/ps.ini", missing])
    assert str(missing) in line


def test_ini_syntax_error_names_the_file(env, tmp_path):
    source = ini(tmp_path, "[ps\np\n[worker]\nw\n", name="broken.ini")
    line = tfps_fails(env, [source])
    assert "broken.ini" in line
    assert "ansible-inventory" in line


def test_unknown_variable_in_an_ini_file(env, tmp_path):
    source = ini(tmp_path, "[ps]\np\n\n[worker]\nw tfps_wrokers=2\n")
    line = tfps_fails(env, [source])
    assert "tfps_wrokers" in line
    assert f"{source}:5" in line or not INI_LINES
    assert "did you mean 'tfps_workers'?" in line


def test_unknown_variable_in_group_vars(env, tmp_path):
    source = ini(tmp_path, "[ps]\np\n[worker]\nw\n")
    vars_file = write(tmp_path / "group_vars/worker.yml", "tfps_model: mlp\ntfps_gpu: [0]\n")
    line = tfps_fails(env, [source])
    assert "tfps_gpu" in line and f"{vars_file}:2" in line and "did you mean 'tfps_gpus'?" in line


def test_unknown_variable_given_with_extra_vars(env):
    line = tfps_fails(env, [INVENTORIES / "ini/hosts.ini"], "-e", "tfps_train_step=5")
    assert "tfps_train_step" in line and "did you mean 'tfps_train_steps'?" in line


def test_wrong_type_names_host_and_variable(env, tmp_path):
    source = ini(tmp_path, "[ps]\np\n[worker]\nw tfps_workers=two\n")
    line = tfps_fails(env, [source])
    assert "tfps_workers" in line and "'w'" in line and "'two'" in line and "whole number" in line


def test_no_worker_group(env, tmp_path):
    source = ini(tmp_path, "[ps]\np\n[training]\nw\n")
    line = tfps_fails(env, [source])
    assert "worker" in line and "group" in line


def test_misspelt_worker_group_suggests_the_name(env, tmp_path):
    source = ini(tmp_path, "[ps]\np\n[workers]\nw\n")
    line = tfps_fails(env, [source])
    assert "rename it to 'worker'" in line


def test_empty_ps_group(env, tmp_path):
    source = ini(tmp_path, "[ps]\n[worker]\nw\n")
    line = tfps_fails(env, [source])
    assert "'ps'" in line


def test_host_in_both_groups(env, tmp_path):
    source = ini(tmp_path, "[ps]\nbox\n[worker]\nbox\n")
    line = tfps_fails(env, [source])
    assert "host 'box' is in both the ps and the worker group" in line


def test_job_setting_that_differs_between_hosts(env, tmp_path):
    source = ini(tmp_path, "[ps]\np\n[worker]\nw\n")
    write(tmp_path / "group_vars/worker.yml", "tfps_train_steps: 50\n")
    line = tfps_fails(env, [source])
    assert "tfps_train_steps" in line
    assert "50" in line and "1000" in line  # the worker's value and the role default of the ps
    assert "'p'" in line and "'w'" in line
    assert "group_vars/all" in line


def test_bad_job_setting_names_the_variable(env, tmp_path):
    source = ini(tmp_path, "[ps]\np\n[worker]\nw\n")
    write(tmp_path / "group_vars/all.yml", "tfps_train_steps: many\n")
    line = tfps_fails(env, [source])
    assert "tfps_train_steps" in line and "'many'" in line


def test_overlapping_ports_across_sources(env, tmp_path):
    ps = ini(tmp_path, "[ps]\np ansible_host=10.9.9.9\n", name="ps.ini")
    worker = ini(tmp_path, "[worker]\nw ansible_host=10.9.9.9\n", name="worker.ini")
    line = tfps_fails(env, [ps, worker])
    assert "both use 10.9.9.9:2222" in line and "tfps_base_port" in line


@pytest.mark.parametrize(
    ("name", "text", "words"),
    [
        ("empty.ini", "", ["no hosts were found"]),
        ("plugin.yml", "plugin: ansible.builtin.no_such_plugin\n", ["no_such_plugin"]),
        ("broken.yml", "all:\n  children:\n    ps: [x\n", ["YAML"]),
    ],
)
def test_unreadable_source_names_the_file(env, tmp_path, name, text, words):
    source = write(tmp_path / name, text) if text else tmp_path / name
    source.touch()
    line = tfps_fails(env, [source])
    assert name in line and "ansible-inventory" in line
    for word in words:
        assert word in line, line


def test_failing_inventory_script_names_the_script(env, tmp_path):
    script = write(tmp_path / "failing.sh", "#!/bin/sh\necho oops >&2\nexit 3\n")
    script.chmod(0o755)
    line = tfps_fails(env, [script])
    assert "failing.sh" in line and ("exit code 3" if INI_LINES else "oops") in line  # 2.17, 2.18 quote stderr only


def test_empty_directory_is_not_an_inventory(env, tmp_path):
    (tmp_path / "empty").mkdir()
    line = tfps_fails(env, [tmp_path / "empty"])
    assert "empty" in line and "inventory" in line


def test_broken_constructed_source_names_that_source(env, tmp_path):
    broken = write(tmp_path / "groups.yml", """
        plugin: ansible.builtin.constructed
        strict: true
        groups:
          ps: nodrole == 'ps'
          worker: nodrole == 'worker'
        """)
    line = tfps_fails(env, [INVENTORIES / "constructed/base.yml", broken])
    assert "groups.yml" in line
    assert "nodrole" in line


def test_syntax_error_in_a_second_source_is_refused(env, tmp_path):
    broken = write(tmp_path / "more.yml", "all:\n  children:\n    worker: [x\n")
    line = tfps_fails(env, [INVENTORIES / "ini/hosts.ini", broken])
    assert "more.yml" in line


def test_the_plays_own_vars_and_vars_files_count_in_its_plan(env, tmp_path):
    """Variables set in the playbook (vars:, vars_files:) are above the inventory in Ansible's
    precedence; the play's plan uses them as the rest of the role does."""
    pb = tmp_path / "pb"
    pb.mkdir()
    write(pb / "steps.yml", "tfps_train_steps: 55\n")
    text = (FIXTURES / "show_plan.yml").read_text().replace(
        "  gather_facts: false\n",
        "  gather_facts: false\n  vars:\n    tfps_workers: 3\n  vars_files:\n    - steps.yml\n")
    assert "vars_files" in text
    (pb / "show_plan.yml").write_text(text)
    out = tmp_path / "play_plan.json"
    source = INVENTORIES / "ini_group_vars/hosts.ini"
    proc = run(env, ANSIBLE_PLAYBOOK, "-i", source, pb / "show_plan.yml", "-e", f"show_plan_file={out}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    play = json.loads(out.read_text())
    # Play vars win over the inventory's tfps_workers (4 on w1) on every worker host.
    assert workers_per_host(play) == {"w1": 3, "w2": 3}
    for task in play["tasks"]:
        assert "--train_steps=55" in task["argv"], task
    # -e still wins over the play's vars.
    proc = run(env, ANSIBLE_PLAYBOOK, "-i", source, pb / "show_plan.yml", "-e", f"show_plan_file={out}",
               "-e", "tfps_workers=2")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert workers_per_host(json.loads(out.read_text())) == {"w1": 2, "w2": 2}


def test_a_port_collision_points_at_the_line_of_the_host_to_change(env, tmp_path):
    source = ini(tmp_path, "[ps]\nh1 ansible_host=10.0.0.1 tfps_base_port=2222\n\n[worker]\n"
                           "h2 ansible_host=10.0.0.2\nh1b ansible_host=10.0.0.1 tfps_base_port=2222\n")
    line = tfps_fails(env, [source])
    assert "give host 'h1b' another tfps_base_port" in line, line
    assert line.endswith(f"(set in {source}:6)") or not INI_LINES, line

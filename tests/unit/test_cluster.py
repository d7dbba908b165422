"""The cluster plan: task numbering, ports, GPUs, flags/TF_CONFIG and every bad input."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from trainer import cluster
from trainer.cluster import (
    KNOWN_VARS,
    ClusterSpec,
    Plan,
    Task,
    TaskRef,
    free_ports,
    load_plan,
    local_plan,
    plan_from_inventory,
)
from trainer.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def inventory(
    ps: dict | None = None, worker: dict | None = None, all_vars: dict | None = None
) -> dict:
    """A YAML inventory as Ansible reads it: all.children.{ps,worker}.hosts."""
    children = {}
    if ps is not None:
        children["ps"] = {"hosts": ps}
    if worker is not None:
        children["worker"] = {"hosts": worker}
    data: dict = {"all": {"children": children}}
    if all_vars:
        data["all"]["vars"] = all_vars
    return data


#: Task names of a plan of 2 ps and 3 workers: ps first, each job numbered from 0.
TWO_PS_THREE_WORKERS = ["ps0", "ps1", "worker0", "worker1", "worker2"]


def two_ps_three_workers() -> Plan:
    """2 ps on one host, 3 workers: 2 GPU slots on one host, 1 CPU worker on another."""
    return plan_from_inventory(
        inventory(
            ps={"p": {"ansible_host": "10.0.0.1", "tfps_ps_tasks": 2}},
            worker={
                "g": {
                    "ansible_host": "10.0.0.2",
                    "tfps_gpus": [0, 1],
                    "tfps_gpu_count": 2,
                },
                "c": {"ansible_host": "10.0.0.3"},
            },
        )
    )


def error(fn, *args, **kwargs) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        fn(*args, **kwargs)
    return info.value


# --------------------------------------------------------------------------- the module


def test_importing_cluster_does_not_import_tensorflow():
    code = "import sys, trainer.cluster; assert 'tensorflow' not in sys.modules, 'tensorflow imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


# --------------------------------------------------------------------------- numbering


def test_plan_orders_ps_then_workers_and_numbers_them():
    plan = two_ps_three_workers()
    assert [t.name for t in plan.tasks] == TWO_PS_THREE_WORKERS
    assert plan.cluster == ClusterSpec(
        ps=("10.0.0.1:2222", "10.0.0.1:2223"),
        worker=("10.0.0.2:2222", "10.0.0.2:2223", "10.0.0.3:2222"),
    )
    assert plan.cluster.as_dict() == {
        "ps": ["10.0.0.1:2222", "10.0.0.1:2223"],
        "worker": ["10.0.0.2:2222", "10.0.0.2:2223", "10.0.0.3:2222"],
    }


def test_chief_is_worker_zero():
    plan = two_ps_three_workers()
    chiefs = [t for t in plan.tasks if t.is_chief]
    assert chiefs == [plan.task("worker", 0)]
    assert plan.task_ref(chiefs[0]).is_chief
    assert not plan.task_ref(plan.task("ps", 0)).is_chief
    assert not plan.task_ref(plan.task("worker", 1)).is_chief
    assert plan.to_json()["chief"] == "worker0"


def test_gpu_slots_give_one_worker_per_gpu_in_order():
    plan = plan_from_inventory(
        inventory(
            ps={"p": {}},
            worker={"g": {"tfps_gpus": [3, "1", 2]}, "c": {"tfps_workers": 2}},
        )
    )
    workers = [t for t in plan.tasks if t.job == "worker"]
    assert [(t.host, t.gpu, t.port) for t in workers] == [
        ("g", "3", 2222),
        ("g", "1", 2223),
        ("g", "2", 2224),
        ("c", None, 2222),
        ("c", None, 2223),
    ]


def test_gpu_uuid_strings_are_kept_as_given():
    plan = plan_from_inventory(
        inventory(ps={"p": {}}, worker={"g": {"tfps_gpus": ["GPU-8a1b", "MIG-3c"]}})
    )
    assert [t.gpu for t in plan.tasks if t.job == "worker"] == ["GPU-8a1b", "MIG-3c"]


def test_tfps_workers_matching_gpu_count_is_fine():
    plan = plan_from_inventory(
        inventory(ps={"p": {}}, worker={"g": {"tfps_gpus": [0, 1], "tfps_workers": 2}})
    )
    assert len(plan.cluster.worker) == 2


def test_empty_gpu_list_means_cpu_workers():
    plan = plan_from_inventory(inventory(ps={"p": {}}, worker={"g": {"tfps_gpus": []}}))
    assert [t.gpu for t in plan.tasks if t.job == "worker"] == [None]


def test_ports_are_per_host_and_consecutive_from_base_port():
    plan = plan_from_inventory(
        inventory(
            ps={"p1": {"tfps_ps_tasks": 2, "tfps_base_port": 3000}, "p2": {}},
            worker={
                "w1": {"tfps_workers": 3, "tfps_base_port": 4000},
                "w2": {"tfps_workers": 1},
            },
        )
    )
    assert [(t.name, t.host, t.port) for t in plan.tasks] == [
        ("ps0", "p1", 3000),
        ("ps1", "p1", 3001),
        ("ps2", "p2", 2222),
        ("worker0", "w1", 4000),
        ("worker1", "w1", 4001),
        ("worker2", "w1", 4002),
        ("worker3", "w2", 2222),
    ]


def test_address_is_ansible_host_else_inventory_name():
    plan = plan_from_inventory(
        inventory(ps={"ps.example.org": {}}, worker={"w": {"ansible_host": "10.1.1.1"}})
    )
    assert plan.task("ps", 0).address == "ps.example.org"
    assert plan.task("ps", 0).target == "ps.example.org:2222"
    assert plan.task("worker", 0).address == "10.1.1.1"
    assert plan.task("worker", 0).host == "w"


def test_numbering_follows_inventory_order_not_names():
    plan = plan_from_inventory(
        inventory(ps={"zeta": {}, "alpha": {}}, worker={"w9": {}, "w1": {}})
    )
    assert [t.host for t in plan.tasks] == ["zeta", "alpha", "w9", "w1"]


def test_same_machine_with_two_entries_and_distinct_base_ports():
    plan = plan_from_inventory(
        inventory(
            ps={"box-ps": {"ansible_host": "10.0.0.5"}},
            worker={
                "box": {
                    "ansible_host": "10.0.0.5",
                    "tfps_base_port": 2232,
                    "tfps_workers": 2,
                }
            },
        )
    )
    assert plan.cluster.as_dict() == {
        "ps": ["10.0.0.5:2222"],
        "worker": ["10.0.0.5:2232", "10.0.0.5:2233"],
    }


def test_ipv6_addresses_are_bracketed():
    plan = plan_from_inventory(
        inventory(ps={"p": {"ansible_host": "fd00::1"}}, worker={"w": {}})
    )
    assert plan.task("ps", 0).target == "[fd00::1]:2222"
    ref = plan.task_ref(plan.task("ps", 0))
    assert ref.port == 2222
    assert TaskRef.from_flags(*_flag_values(ref)) == ref


def test_top_level_groups_and_nested_groups_like_ansible():
    data = {
        "ps": {"hosts": {"p": None}},
        "training": {
            "children": {
                "worker": {"children": {"gpu": {"hosts": {"g1": None, "g2": None}}}}
            }
        },
    }
    plan = plan_from_inventory(data)
    assert [t.host for t in plan.tasks] == ["p", "g1", "g2"]


def test_host_ranges_are_expanded_like_ansible():
    plan = plan_from_inventory(
        {
            "all": {
                "children": {
                    "ps": {"hosts": {"p": None}},
                    "worker": {"hosts": {"node[01:03]": None}},
                }
            }
        }
    )
    assert [t.host for t in plan.tasks if t.job == "worker"] == [
        "node01",
        "node02",
        "node03",
    ]


def test_non_tfps_variables_are_ignored():
    plan = plan_from_inventory(
        inventory(
            ps={"p": {"ansible_user": "root", "color": "blue"}},
            worker={"w": {"tfps_model": "mlp"}},
        )
    )
    assert len(plan.tasks) == 2


def test_hosts_outside_ps_and_worker_are_not_planned():
    data = inventory(ps={"p": {}}, worker={"w": {}})
    data["all"]["hosts"] = {"monitor": None}
    data["all"]["children"]["other"] = {"hosts": {"db": None}}
    assert [t.host for t in plan_from_inventory(data).tasks] == ["p", "w"]


# --------------------------------------------------------------------------- precedence


def test_variable_precedence_all_group_host():
    data = {
        "all": {
            "vars": {"tfps_workers": 5, "tfps_base_port": 1000},
            "children": {
                "ps": {"hosts": {"p": None}},
                "worker": {
                    "vars": {"tfps_workers": 2},
                    "hosts": {"w1": None, "w2": {"tfps_workers": 3}},
                },
            },
        }
    }
    plan = plan_from_inventory(data, host_vars={"w1": {"tfps_base_port": 1500}})
    assert [(t.host, t.port) for t in plan.tasks] == [
        ("p", 1000),
        ("w1", 1500),
        ("w1", 1501),
        ("w2", 1000),
        ("w2", 1001),
        ("w2", 1002),
    ]


def test_group_vars_files_rank_like_ansible():
    # Ansible: inline group vars < group_vars/all < group_vars/<group> < inline host < host_vars.
    data = {
        "all": {
            "children": {
                "ps": {"vars": {"tfps_base_port": 3000}, "hosts": {"p": None}},
                "worker": {"hosts": {"w": {"tfps_base_port": 5000}, "v": None}},
            }
        }
    }
    plan = plan_from_inventory(
        data,
        group_vars={
            "all": {"tfps_base_port": 4000},
            "worker": {"tfps_base_port": 4500},
        },
        host_vars={"w": {"tfps_base_port": 6000}},
    )
    assert [(t.host, t.port) for t in plan.tasks] == [
        ("p", 4000),
        ("w", 6000),
        ("v", 4500),
    ]


# --------------------------------------------------------------------------- flags and TF_CONFIG


def _flag_values(ref: TaskRef) -> tuple[str, str, str, str]:
    values = dict(flag[2:].split("=", 1) for flag in ref.to_flags())
    return (
        values["ps_hosts"],
        values["worker_hosts"],
        values["job_name"],
        values["task_index"],
    )


def test_flags_and_tf_config_round_trip_for_every_task():
    plan = two_ps_three_workers()
    assert len(plan.tasks) == 5
    for task in plan.tasks:
        ref = plan.task_ref(task)
        ps_hosts, worker_hosts, job_name, task_index = _flag_values(ref)
        from_flags = TaskRef.from_flags(
            ps_hosts, worker_hosts, job_name, int(task_index)
        )
        from_env = TaskRef.from_tf_config(ref.to_tf_config())
        assert from_flags == from_env == ref
        assert (
            ref.target == task.target
            and ref.port == task.port
            and ref.name == task.name
        )
        both = TaskRef.resolve(
            ps_hosts,
            worker_hosts,
            job_name,
            int(task_index),
            environ={"TF_CONFIG": ref.to_tf_config()},
        )
        assert both == ref


def test_to_flags_and_to_tf_config_shapes():
    ref = TaskRef(ClusterSpec(("a:1", "b:2"), ("c:3", "d:4")), "worker", 0)
    assert ref.to_flags() == [
        "--ps_hosts=a:1,b:2",
        "--worker_hosts=c:3,d:4",
        "--job_name=worker",
        "--task_index=0",
    ]
    assert json.loads(ref.to_tf_config()) == {
        "cluster": {"ps": ["a:1", "b:2"], "worker": ["c:3", "d:4"]},
        "task": {"type": "worker", "index": 0},
        "environment": "cloud",
    }
    assert ref.to_tf_config() == json.dumps(
        json.loads(ref.to_tf_config()), sort_keys=True
    )
    assert (ref.num_ps, ref.num_workers, ref.target, ref.port, ref.name) == (
        2,
        2,
        "c:3",
        3,
        "worker0",
    )


def test_task_index_defaults_to_zero():
    assert TaskRef.from_flags("a:1", "b:2", "worker", None).index == 0


def test_tf_config_with_chief_makes_it_worker_zero():
    config = {
        "cluster": {
            "chief": ["c:1"],
            "worker": ["w:1", "w:2"],
            "ps": ["p:1"],
            "evaluator": ["e:1"],
        },
        "task": {"type": "chief", "index": 0},
    }
    ref = TaskRef.from_tf_config(json.dumps(config))
    assert ref == TaskRef(ClusterSpec(("p:1",), ("c:1", "w:1", "w:2")), "worker", 0)
    assert ref.is_chief
    config["task"] = {"type": "worker", "index": 1}
    assert TaskRef.from_tf_config(json.dumps(config)).target == "w:2"
    assert TaskRef.from_tf_config(json.dumps(config)).index == 2
    config["cluster"]["master"] = config["cluster"].pop("chief")
    config["task"] = {"type": "master", "index": 0}
    assert TaskRef.from_tf_config(json.dumps(config)).is_chief


def test_resolve_prefers_flags_and_falls_back_to_tf_config():
    env_ref = TaskRef(ClusterSpec(("p:1",), ("w:1",)), "ps", 0)
    environ = {"TF_CONFIG": env_ref.to_tf_config()}
    assert TaskRef.resolve(environ=environ) == env_ref
    assert TaskRef.resolve("p:1", "w:1", "ps", None, environ=environ) == env_ref
    assert TaskRef.resolve("p:1", "w:1", "worker", 0, environ={}).job == "worker"
    assert (
        TaskRef.resolve("p:1", "w:1", "worker", 0, environ={"TF_CONFIG": "  "}).job
        == "worker"
    )


# --------------------------------------------------------------------------- outputs


def test_to_json_is_serialisable_and_complete():
    plan = two_ps_three_workers()
    data = json.loads(json.dumps(plan.to_json()))
    assert data["cluster"] == plan.cluster.as_dict()
    assert data["chief"] == "worker0"
    first = data["tasks"][2]
    assert set(first) == {
        "name",
        "host",
        "address",
        "job",
        "index",
        "port",
        "gpu",
        "chief",
        "target",
        "flags",
        "tf_config",
    }
    assert (first["name"], first["gpu"], first["chief"], first["target"]) == (
        "worker0",
        "0",
        True,
        "10.0.0.2:2222",
    )
    assert first["flags"][-2:] == ["--job_name=worker", "--task_index=0"]
    assert json.loads(first["tf_config"])["task"] == {"type": "worker", "index": 0}


def test_render_table_lists_every_task():
    plan = two_ps_three_workers()
    text = plan.render_table()
    header = text.splitlines()[0].split()
    assert header == ["NAME", "HOST", "ADDRESS", "JOB", "INDEX", "PORT", "GPU", "CHIEF"]
    for task in plan.tasks:
        assert task.name in text
        assert plan.task_ref(task).to_flags()[2] in text
    assert "TF_CONFIG" in text and "--ps_hosts=" in text
    rows = text.splitlines()[1:6]
    assert [row.split()[0] for row in rows] == [t.name for t in plan.tasks]
    assert len({row.index("10.0.0") for row in rows}) == 1  # aligned columns


def test_tasks_on_host():
    plan = two_ps_three_workers()
    assert [t.name for t in plan.tasks_on("g")] == ["worker0", "worker1"]


# --------------------------------------------------------------------------- files


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def test_load_plan_directory_with_group_vars_and_host_vars(tmp_path):
    write(
        tmp_path / "hosts.yml",
        """
        all:
          children:
            ps:
              hosts:
                p: {ansible_host: 10.0.0.1}
            worker:
              hosts:
                g: {ansible_host: 10.0.0.2}
                c: {ansible_host: 10.0.0.3}
        """,
    )
    write(tmp_path / "group_vars/all.yml", "tfps_base_port: 3000\ntfps_model: mlp\n")
    write(tmp_path / "group_vars/worker/ports.yml", "tfps_base_port: 4000\n")
    write(
        tmp_path / "group_vars/worker/vault.yml",
        "$ANSIBLE_VAULT;1.1;AES256\n6162636465\n",
    )
    write(tmp_path / "host_vars/g.yaml", "tfps_gpus: [0, 1]\ntfps_gpu_count: 4\n")
    write(
        tmp_path / "host_vars/c.yml",
        "tfps_notify_urls: !vault |\n  $ANSIBLE_VAULT;1.1;AES256\n  3132\n",
    )
    write(tmp_path / "group_vars/README.md", "not: [yaml\n")
    plan = load_plan(tmp_path)
    assert [(t.name, t.target, t.gpu) for t in plan.tasks] == [
        ("ps0", "10.0.0.1:3000", None),
        ("worker0", "10.0.0.2:4000", "0"),
        ("worker1", "10.0.0.2:4001", "1"),
        ("worker2", "10.0.0.3:4000", None),
    ]
    # Naming the file reads the group_vars/host_vars next to it, as Ansible does.
    assert load_plan(tmp_path / "hosts.yml") == plan
    assert load_plan(str(tmp_path)) == plan


def test_load_plan_accepts_hosts_yaml(tmp_path):
    write(
        tmp_path / "hosts.yaml",
        "all: {children: {ps: {hosts: {p: }}, worker: {hosts: {w: }}}}\n",
    )
    assert [t.name for t in load_plan(tmp_path).tasks] == ["ps0", "worker0"]


def test_example_inventory_gives_the_documented_plan():
    plan = load_plan(REPO / "inventory/example")
    assert [(t.name, t.host, t.target, t.gpu, t.is_chief) for t in plan.tasks] == [
        ("ps0", "ps1", "10.0.0.11:2222", None, False),
        ("worker0", "gpu1", "10.0.0.12:2222", "0", True),
        ("worker1", "gpu1", "10.0.0.12:2223", "1", False),
        ("worker2", "cpu1", "10.0.0.13:2222", None, False),
    ]
    assert load_plan(REPO / "inventory/example/hosts.yml") == plan
    settings = yaml.safe_load(
        (REPO / "inventory/example/group_vars/all.yml").read_text()
    )
    assert settings["tfps_model"] == "mlp"
    assert settings["tfps_sync_replicas"] is False
    assert settings["tfps_final_save_timeout"] == 1800
    assert settings["tfps_image"] == "tfps-trainer:latest"
    assert "tfps_notify_urls" not in settings  # secrets go into a vault file
    assert not (REPO / "inventory/example/group_vars/all").exists()


def test_local_inventory_runs_everything_on_one_machine():
    plan = load_plan(REPO / "inventory/local")
    assert [(t.name, t.host, t.target) for t in plan.tasks] == [
        ("ps0", "tfps-ps", "127.0.0.1:2222"),
        ("worker0", "tfps-worker", "127.0.0.1:2232"),
        ("worker1", "tfps-worker", "127.0.0.1:2233"),
    ]


def _ansible_inventory() -> str:
    """ansible-inventory of this environment (ansible-core is a dev dependency: never a skip)."""
    beside = Path(sys.executable).with_name("ansible-inventory")
    found = str(beside) if beside.exists() else shutil.which("ansible-inventory")
    assert found, "ansible-inventory not found: install the dev extra (pip install -e '.[cpu,dev]')"
    return found


def test_ansible_reads_the_same_variables(tmp_path):
    """tfps and Ansible must agree on every host's variables, precedence included."""
    write(
        tmp_path / "hosts.yml",
        """
        all:
          vars: {tfps_base_port: 1000, tfps_workers: 4}
          children:
            ps:
              vars: {tfps_base_port: 3000, tfps_ps_tasks: 2}
              hosts:
                p: {ansible_host: 10.0.0.1}
            training:
              vars: {tfps_workers: 3}
              children:
                worker:
                  vars: {tfps_workers: 2}
                  hosts:
                    w1: {tfps_base_port: 5000}
                    w2:
        """,
    )
    write(tmp_path / "group_vars/all.yml", "tfps_base_port: 4000\n")
    write(tmp_path / "host_vars/w1.yml", "tfps_base_port: 6000\n")
    env = dict(os.environ, HOME=str(tmp_path), ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"))
    out = subprocess.run(
        [_ansible_inventory(), "-i", str(tmp_path / "hosts.yml"), "--list"],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    ).stdout
    hostvars = json.loads(out)["_meta"]["hostvars"]
    plan = load_plan(tmp_path)
    for task in plan.tasks:
        first = min(t.port for t in plan.tasks_on(task.host))
        assert hostvars[task.host].get("tfps_base_port") == first
        assert task.address == hostvars[task.host].get("ansible_host", task.host)
    assert [len(plan.tasks_on(h)) for h in ("p", "w1", "w2")] == [
        hostvars["p"]["tfps_ps_tasks"],
        hostvars["w1"]["tfps_workers"],
        hostvars["w2"]["tfps_workers"],
    ]
    assert [(t.host, t.port) for t in plan.tasks] == [
        ("p", 4000),
        ("p", 4001),
        ("w1", 6000),
        ("w1", 6001),
        ("w2", 4000),
        ("w2", 4001),
    ]


# --------------------------------------------------------------------------- one machine


def test_free_ports_are_distinct_and_bindable():
    ports = free_ports(8)
    assert len(set(ports)) == 8
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
    assert free_ports(0) == []


def test_local_plan_uses_distinct_free_ports():
    plan = local_plan(2, 3)
    assert [t.name for t in plan.tasks] == TWO_PS_THREE_WORKERS
    assert len({t.port for t in plan.tasks}) == 5
    assert {t.address for t in plan.tasks} == {"127.0.0.1"}
    assert plan.task("worker", 0).is_chief


def test_local_plan_with_given_ports():
    plan = local_plan(1, 2, ports=[7000, 7001, 7002])
    assert plan.cluster.as_dict() == {
        "ps": ["127.0.0.1:7000"],
        "worker": ["127.0.0.1:7001", "127.0.0.1:7002"],
    }


# --------------------------------------------------------------------------- bad inventories


@pytest.mark.parametrize(
    ("data", "field", "words"),
    [
        (inventory(worker={"w": {}}), "ps", ["no 'ps' group", "all.children.ps.hosts"]),
        (inventory(ps={}, worker={"w": {}}), "ps", ["'ps' group has no hosts"]),
        (inventory(ps={"p": {}}), "worker", ["no 'worker' group"]),
        (inventory(ps={"p": {}}, worker={}), "worker", ["'worker' group has no hosts"]),
        (
            {
                "all": {
                    "children": {
                        "ps": {"hosts": {"p": None}},
                        "workers": {"hosts": {"w": None}},
                    }
                }
            },
            "worker",
            ["group 'workers': rename it to 'worker'"],
        ),
        (None, "inventory", ["empty"]),
        (["all"], "inventory", ["mapping"]),
    ],
)
def test_missing_groups(data, field, words):
    exc = error(plan_from_inventory, data)
    assert exc.field == field
    for word in words:
        assert word in str(exc)


def test_host_in_both_ps_and_worker():
    exc = error(plan_from_inventory, inventory(ps={"box": {}}, worker={"box": {}}))
    assert "host 'box' is in both the ps and the worker group" in str(exc)
    assert (
        "give the ps its own inventory entry with the same ansible_host and another tfps_base_port"
        in str(exc)
    )


def test_duplicate_address_and_port_names_both_tasks():
    exc = error(
        plan_from_inventory,
        inventory(
            ps={"a": {"ansible_host": "10.0.0.1"}},
            worker={"b": {"ansible_host": "10.0.0.1"}},
        ),
    )
    assert exc.field == "tfps_base_port"
    assert "ps0 (host 'a') and worker0 (host 'b') both use 10.0.0.1:2222" in str(exc)
    assert "give host 'b' another tfps_base_port" in str(exc)


def test_overlapping_port_ranges_are_caught():
    exc = error(
        plan_from_inventory,
        inventory(
            ps={"a": {"ansible_host": "h", "tfps_ps_tasks": 3}},
            worker={"b": {"ansible_host": "h", "tfps_base_port": 2224}},
        ),
    )
    assert "ps2 (host 'a') and worker0 (host 'b') both use h:2224" in str(exc)


@pytest.mark.parametrize(
    ("host_vars", "field", "words"),
    [
        ({"tfps_base_port": 0}, "tfps_base_port", ["tfps_base_port: 0", "positive"]),
        ({"tfps_base_port": 70000}, "tfps_base_port", ["port 70000", "1..65535"]),
        (
            {"tfps_base_port": 65535, "tfps_workers": 2},
            "tfps_base_port",
            ["65536", "at most 65534"],
        ),
        ({"tfps_base_port": "abc"}, "tfps_base_port", ["'abc'", "whole number"]),
        ({"tfps_base_port": 2222.5}, "tfps_base_port", ["2222.5", "whole number"]),
        ({"tfps_base_port": True}, "tfps_base_port", ["True", "whole number"]),
        ({"tfps_workers": "two"}, "tfps_workers", ["'two'", "whole number"]),
        ({"tfps_workers": 0}, "tfps_workers", ["tfps_workers: 0", "positive"]),
        ({"tfps_workers": -1}, "tfps_workers", ["tfps_workers: -1", "positive"]),
        ({"tfps_gpus": "0,1"}, "tfps_gpus", ["YAML list", "[0, 1]"]),
        ({"tfps_gpus": 0}, "tfps_gpus", ["YAML list"]),
        ({"tfps_gpus": [0, 1, 0]}, "tfps_gpus", ["GPU id 0 twice"]),
        ({"tfps_gpus": [0, "0"]}, "tfps_gpus", ["GPU id 0 twice"]),
        ({"tfps_gpus": [-1]}, "tfps_gpus", ["GPU id -1"]),
        ({"tfps_gpus": [0.5]}, "tfps_gpus", ["GPU id 0.5"]),
        (
            {"tfps_gpus": [0], "tfps_gpu_count": 0},
            "tfps_gpus",
            ["GPU ids on a host without GPUs"],
        ),
        (
            {"tfps_gpus": [0, 1, 2], "tfps_gpu_count": 2},
            "tfps_gpus",
            ["3 GPU slots", "tfps_gpu_count is 2"],
        ),
        (
            {"tfps_gpus": [0, 2], "tfps_gpu_count": 2},
            "tfps_gpus",
            ["GPU id 2", "use ids 0..1"],
        ),
        ({"tfps_gpu_count": -1}, "tfps_gpu_count", ["tfps_gpu_count: -1"]),
        ({"tfps_gpu_count": "many"}, "tfps_gpu_count", ["'many'"]),
        (
            {"tfps_gpus": [0, 1], "tfps_workers": 3},
            "tfps_workers",
            ["tfps_workers: 3 but 2 GPU id(s)"],
        ),
        ({"tfps_gpus": ["0 1"]}, "tfps_gpus", ["GPU id '0 1'"]),
        ({"ansible_host": "{{ inventory_hostname }}.lan"}, "ansible_host", ["Jinja"]),
        ({"ansible_host": ""}, "ansible_host", ["ansible_host ''"]),
    ],
)
def test_bad_worker_host_variables(host_vars, field, words):
    exc = error(plan_from_inventory, inventory(ps={"p": {}}, worker={"w": host_vars}))
    assert exc.field == field, str(exc)
    assert "'w'" in str(exc)
    for word in words:
        assert word in str(exc), str(exc)


@pytest.mark.parametrize(
    ("host_vars", "words"),
    [
        ({"tfps_ps_tasks": 0}, ["tfps_ps_tasks: 0", "positive"]),
        ({"tfps_ps_tasks": "x"}, ["tfps_ps_tasks: 'x'", "whole number"]),
        ({"tfps_ps_tasks": 2, "tfps_base_port": 65535}, ["65536"]),
    ],
)
def test_bad_ps_host_variables(host_vars, words):
    exc = error(plan_from_inventory, inventory(ps={"p": host_vars}, worker={"w": {}}))
    assert "'p'" in str(exc)
    for word in words:
        assert word in str(exc), str(exc)


def test_cpu_worker_ignores_gpu_count_zero():
    plan = plan_from_inventory(
        inventory(ps={"p": {}}, worker={"w": {"tfps_gpu_count": 0, "tfps_workers": 2}})
    )
    assert [t.gpu for t in plan.tasks if t.job == "worker"] == [None, None]


@pytest.mark.parametrize(
    ("where", "typo", "suggestion"),
    [
        ("host", "tfps_gpu", "tfps_gpus"),
        ("host", "tfps_base_prot", "tfps_base_port"),
        ("all", "tfps_train_step", "tfps_train_steps"),
        ("group_vars", "tfps_sync_replica", "tfps_sync_replicas"),
        ("host_vars", "tfps_worker", "tfps_workers"),
    ],
)
def test_unknown_tfps_variable_suggests_the_closest(where, typo, suggestion):
    data = inventory(
        ps={"p": {}},
        worker={"w": {typo: 1} if where == "host" else {}},
        all_vars={typo: 1} if where == "all" else None,
    )
    exc = error(
        plan_from_inventory,
        data,
        group_vars={"all": {typo: 1}} if where == "group_vars" else None,
        host_vars={"w": {typo: 1}} if where == "host_vars" else None,
    )
    assert exc.field == typo
    assert f"did you mean '{suggestion}'?" in str(exc)


def test_every_documented_variable_is_known():
    for name in (
        "tfps_base_port tfps_ps_tasks tfps_gpus tfps_workers tfps_gpu_count tfps_job_name tfps_model "
        "tfps_train_data tfps_eval_data tfps_label_column tfps_train_steps tfps_batch_size tfps_learning_rate "
        "tfps_sync_replicas tfps_replicas_to_aggregate tfps_final_save_timeout tfps_checkpoint_steps "
        "tfps_model_dir tfps_export_dir tfps_data_dir tfps_image tfps_image_archive tfps_notify_urls "
        "tfps_notify_config tfps_extra_args tfps_firewall tfps_restart_policy tfps_script tfps_user_model_dir"
    ).split():
        assert KNOWN_VARS[name]
    assert all(
        name.startswith("tfps_") and isinstance(text, str)
        for name, text in KNOWN_VARS.items()
    )


def test_example_inventory_sets_only_known_variables():
    for path in (REPO / "inventory").rglob("*.yml"):
        data = yaml.safe_load(path.read_text())
        names = set()

        def collect(node):
            if isinstance(node, dict):
                for key, value in node.items():
                    names.add(key)
                    collect(value)

        collect(data)
        assert {n for n in names if str(n).startswith("tfps_")} <= set(KNOWN_VARS), path


@pytest.mark.parametrize(
    ("data", "field", "words"),
    [
        (
            {"all": {"children": {"ps": {"host": {"p": None}}}}},
            "all.children.ps.host",
            ["did you mean 'hosts'"],
        ),
        (
            {"all": {"children": {"ps": {"hosts": ["p"]}}}},
            "all.children.ps.hosts",
            ["mapping"],
        ),
        (
            {"all": {"children": {"ps": {"hosts": {"p": "x"}}}}},
            "all.children.ps.hosts",
            ["its variables"],
        ),
        (
            {"all": {"children": {"ps": {"children": {"ps": None}}}}},
            "children",
            ["own ancestor"],
        ),
        (
            {"all": {"children": {"ps": {"hosts": {"n[1:]": None}}}}},
            "all.children.ps.hosts",
            ["begin:end"],
        ),
    ],
)
def test_malformed_inventory_structure(data, field, words):
    exc = error(plan_from_inventory, data)
    assert exc.field == field, str(exc)
    for word in words:
        assert word in str(exc)


def test_group_vars_for_a_group_that_does_not_exist(tmp_path):
    exc = error(
        plan_from_inventory,
        inventory(ps={"p": {}}, worker={"w": {}}),
        group_vars={"workers": {"tfps_workers": 2}},
    )
    assert exc.field == "group_vars/workers"
    assert "Ansible would ignore it" in str(exc) and "did you mean 'worker'?" in str(
        exc
    )


def test_load_plan_missing_path(tmp_path):
    exc = error(load_plan, tmp_path / "nope.yml")
    assert exc.field == str(tmp_path / "nope.yml")
    assert "no such file" in str(exc)


def test_load_plan_directory_without_hosts_yml(tmp_path):
    write(tmp_path / "hosts.ini", "[ps]\np\n")
    exc = error(load_plan, tmp_path)
    assert exc.field == str(tmp_path)
    assert "no hosts.yml" in str(exc) and "ansible-inventory" in str(exc)


def test_load_plan_yaml_syntax_error_names_file_and_line(tmp_path):
    bad = write(tmp_path / "hosts.yml", "all:\n  children:\n    ps: [unclosed\n")
    exc = error(load_plan, bad)
    assert exc.field == str(bad)
    assert "YAML syntax error at line" in str(exc)


def test_load_plan_syntax_error_in_host_vars_names_that_file(tmp_path):
    write(
        tmp_path / "hosts.yml",
        "all: {children: {ps: {hosts: {p: }}, worker: {hosts: {w: }}}}\n",
    )
    bad = write(tmp_path / "host_vars/w.yml", "tfps_gpus: [0, 1\n")
    exc = error(load_plan, tmp_path)
    assert exc.field == str(bad)


def test_load_plan_names_the_file_of_an_unknown_variable(tmp_path):
    write(
        tmp_path / "hosts.yml",
        "all: {children: {ps: {hosts: {p: }}, worker: {hosts: {w: }}}}\n",
    )
    write(tmp_path / "group_vars/worker.yml", "tfps_gpu: [0]\n")
    exc = error(load_plan, tmp_path)
    assert exc.field == "tfps_gpu"
    assert "group_vars/worker.yml" in str(exc) and "did you mean 'tfps_gpus'?" in str(
        exc
    )


def test_load_plan_inventory_error_names_the_inventory(tmp_path):
    path = write(tmp_path / "hosts.yml", "all: {children: {ps: {hosts: {p: }}}}\n")
    exc = error(load_plan, path)
    assert exc.field == "worker"
    assert str(path) in str(exc)


def test_load_plan_refuses_group_vars_file_shadowed_by_directory(tmp_path):
    write(
        tmp_path / "hosts.yml",
        "all: {children: {ps: {hosts: {p: }}, worker: {hosts: {w: }}}}\n",
    )
    write(tmp_path / "group_vars/all.yml", "tfps_model: mlp\n")
    write(tmp_path / "group_vars/all/vault.yml", "$ANSIBLE_VAULT;1.1;AES256\n00\n")
    exc = error(load_plan, tmp_path)
    assert "Ansible reads only the directory" in str(exc)


def test_load_plan_refuses_vault_encrypted_inventory(tmp_path):
    path = write(tmp_path / "hosts.yml", "$ANSIBLE_VAULT;1.1;AES256\n00\n")
    assert "vault-encrypted" in str(error(load_plan, path))


def test_vault_value_in_a_layout_variable(tmp_path):
    write(
        tmp_path / "hosts.yml",
        "all: {children: {ps: {hosts: {p: }}, worker: {hosts: {w: }}}}\n",
    )
    write(
        tmp_path / "host_vars/w.yml",
        "tfps_base_port: !vault |\n  $ANSIBLE_VAULT;1.1;AES256\n  00\n",
    )
    exc = error(load_plan, tmp_path)
    assert exc.field == "tfps_base_port" and "plain text" in str(exc)


# --------------------------------------------------------------------------- bad flags


@pytest.mark.parametrize(
    ("args", "field", "words"),
    [
        (("a:1", "b:2", None, 0), "job_name", ["--job_name is missing"]),
        (("a:1", "b:2", "", 0), "job_name", ["--job_name is missing"]),
        (
            ("a:1", "b:2", "boss", 0),
            "job_name",
            ["wrong job name 'boss'", "ps or worker"],
        ),
        (
            ("a:1", "b:2", "chief", 0),
            "job_name",
            ["wrong job name 'chief'", "worker 0 is the chief"],
        ),
        (
            ("a:1", "b:2,c:3", "worker", 2),
            "task_index",
            ["task_index: 2 is out of range for 2 worker(s); use 0..1"],
        ),
        (
            ("a:1", "b:2", "ps", 1),
            "task_index",
            ["out of range for 1 ps task(s); use 0..0"],
        ),
        (("a:1", "b:2", "worker", -1), "task_index", ["-1 is out of range"]),
        (("a:1", "b:2", "worker", "x"), "task_index", ["not a whole number"]),
        (("a", "b:2", "worker", 0), "ps_hosts", ["'a' has no port", "a:2222"]),
        (
            ("a:1", "b:http", "worker", 0),
            "worker_hosts",
            ["port 'http'", "not a number"],
        ),
        (("a:1", "b:", "worker", 0), "worker_hosts", ["has no port"]),
        (("a:1", "b:99999", "worker", 0), "worker_hosts", ["1..65535"]),
        (("a:1", ":2", "worker", 0), "worker_hosts", ["has no host"]),
        (("", "b:2", "worker", 0), "ps_hosts", ["lists no ps task"]),
        (("a:1", " , ", "worker", 0), "worker_hosts", ["lists no worker task"]),
        ((None, "b:2", "worker", 0), "ps_hosts", ["--ps_hosts is missing"]),
        (("a:1", None, "worker", 0), "worker_hosts", ["--worker_hosts is missing"]),
        (
            ("a:1", "a:1", "worker", 0),
            "worker_hosts",
            ["a:1 is listed twice", "ps0 and worker0"],
        ),
        (("fe80::1:2", "b:2", "worker", 0), "ps_hosts", ["IPv6", "[address]:port"]),
    ],
)
def test_bad_classic_flags(args, field, words):
    exc = error(TaskRef.from_flags, *args)
    assert exc.field == field, str(exc)
    for word in words:
        assert word in str(exc), str(exc)


def test_resolve_requires_all_flags_when_any_is_given():
    exc = error(TaskRef.resolve, job_name="worker", environ={})
    assert exc.field == "ps_hosts"
    exc = error(
        TaskRef.resolve,
        task_index=1,
        environ={
            "TF_CONFIG": TaskRef(
                ClusterSpec(("a:1",), ("b:2",)), "ps", 0
            ).to_tf_config()
        },
    )
    assert exc.field == "ps_hosts"


def test_resolve_without_anything_says_what_to_pass():
    exc = error(TaskRef.resolve, environ={})
    assert "--ps_hosts" in str(exc) and "TF_CONFIG" in str(exc)


# --------------------------------------------------------------------------- bad TF_CONFIG


def tf_config(cluster=None, task=None, **extra) -> str:
    data = {
        "cluster": (
            cluster
            if cluster is not None
            else {"ps": ["p:1"], "worker": ["w:1", "w:2"]}
        )
    }
    if task is not False:
        data["task"] = task if task is not None else {"type": "worker", "index": 0}
    data.update(extra)
    return json.dumps(data)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("{not json", ["not valid JSON"]),
        ("", ["not valid JSON"]),
        ("[1, 2]", ["JSON object"]),
        (json.dumps({"task": {"type": "worker", "index": 0}}), ["no 'cluster' key"]),
        (tf_config(task=False), ["no 'task' key"]),
        (tf_config(task={"index": 0}), ["no 'type'"]),
        (
            tf_config(task={"type": "chief", "index": 0}),
            ["task type 'chief' is not in the cluster"],
        ),
        (
            tf_config(cluster={"worker": ["w:1"]}, task={"type": "ps", "index": 0}),
            ["task type 'ps' is not in the cluster"],
        ),
        (tf_config(cluster={"worker": ["w:1"]}), ["lists no ps task"]),
        (
            tf_config(task={"type": "worker", "index": 2}),
            ["task.index 2 is out of range for 2 worker(s); use 0..1"],
        ),
        (
            tf_config(task={"type": "ps", "index": 1}),
            ["task.index 1 is out of range for 1 ps task(s)"],
        ),
        (tf_config(task={"type": "worker", "index": "one"}), ["not a whole number"]),
        (
            tf_config(task={"type": "evaluator", "index": 0}),
            ["tfps has no evaluator task"],
        ),
        (tf_config(task={"type": "boss", "index": 0}), ["wrong task type 'boss'"]),
        (
            tf_config(cluster={"ps": ["p:1"], "worker": "w:1"}),
            ["cluster.worker must be a list"],
        ),
        (
            tf_config(cluster={"ps": ["p:1"], "worker": ["w:1"], "trainer": ["t:1"]}),
            ["'trainer' job"],
        ),
        (tf_config(cluster={"ps": ["p"], "worker": ["w:1"]}), ["has no port"]),
        (
            tf_config(
                cluster={"ps": ["p:1"], "chief": ["c:1", "d:1"]},
                task={"type": "chief", "index": 0},
            ),
            ["exactly one chief"],
        ),
        (
            tf_config(
                cluster={"ps": ["p:1"], "chief": ["c:1"]},
                task={"type": "chief", "index": 1},
            ),
            ["out of range for 1 chief"],
        ),
    ],
)
def test_bad_tf_config(text, words):
    exc = error(TaskRef.from_tf_config, text)
    assert exc.field == "TF_CONFIG"
    for word in words:
        assert word in str(exc), str(exc)


def test_flags_and_tf_config_that_disagree():
    env = {"TF_CONFIG": tf_config(task={"type": "worker", "index": 1})}
    exc = error(TaskRef.resolve, "p:1", "w:1,w:2", "worker", 0, environ=env)
    assert "classic flags and TF_CONFIG disagree" in str(exc)
    assert "worker0" in str(exc) and "worker1" in str(exc)
    exc = error(TaskRef.resolve, "p:1", "w:1,w:3", "worker", 1, environ=env)
    assert "classic flags and TF_CONFIG disagree" in str(exc)


def test_invalid_tf_config_next_to_flags_is_an_error():
    exc = error(
        TaskRef.resolve, "p:1", "w:1", "worker", 0, environ={"TF_CONFIG": "{oops"}
    )
    assert exc.field == "TF_CONFIG" and "unset it or fix it" in str(exc)


# --------------------------------------------------------------------------- plan API errors


def test_plan_task_lookup_error_lists_tasks():
    exc = error(two_ps_three_workers().task, "worker", 7)
    assert "no task worker7" in str(exc) and "worker2" in str(exc)


def test_task_ref_rejects_bad_role():
    spec = ClusterSpec(("a:1",), ("b:2",))
    assert error(TaskRef, spec, "chief", 0).field == "job_name"
    assert error(TaskRef, spec, "worker", 1).field == "task_index"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"num_ps": 0, "num_workers": 1}, "num_ps"),
        ({"num_ps": 1, "num_workers": 0}, "num_workers"),
        ({"num_ps": 1, "num_workers": 1, "ports": [7000]}, "ports"),
        ({"num_ps": 1, "num_workers": 1, "ports": [7000, 7000]}, "ports"),
        ({"num_ps": 1, "num_workers": 1, "ports": [7000, 0]}, "ports"),
    ],
)
def test_local_plan_bad_arguments(kwargs, field):
    assert error(local_plan, **kwargs).field == field


def test_plan_from_tasks_rejects_gaps_and_duplicates():
    assert (
        error(
            Plan.from_tasks,
            [Task("h", "h", "ps", 1, 1), Task("h", "h", "worker", 0, 2)],
        ).field
        == "ps"
    )
    exc = error(
        Plan.from_tasks, [Task("h", "h", "ps", 0, 1), Task("h", "h", "worker", 0, 1)]
    )
    assert "ps0 (host 'h') and worker0 (host 'h') both use h:1" in str(exc)


def test_module_exports_the_documented_interface():
    for name in (
        "Task",
        "ClusterSpec",
        "TaskRef",
        "Plan",
        "plan_from_inventory",
        "load_plan",
        "local_plan",
        "free_ports",
        "KNOWN_VARS",
    ):
        assert hasattr(cluster, name)


def test_every_ansible_role_variable_is_known_to_the_plan():
    """Inventories set the role's variables; tfps plan must not call them typos."""
    import pathlib

    import yaml

    from trainer.cluster import KNOWN_VARS
    defaults = pathlib.Path(__file__).resolve().parents[2] / "ansible/roles/tfps/defaults/main.yml"
    names = [k for k in yaml.safe_load(defaults.read_text()) if k.startswith("tfps_")]
    assert names and [k for k in names if k not in KNOWN_VARS] == []

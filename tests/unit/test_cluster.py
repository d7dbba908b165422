"""The cluster plan: task numbering, ports, GPUs, flags/TF_CONFIG and every bad input.

Layout rules are tested on :func:`plan_from_hosts` with the per-host variables as
Ansible resolves them; reading inventories is Ansible's job (tests/integration/test_inventory.py
checks that ``tfps plan`` asks Ansible and agrees with it).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tfps import cluster
from tfps.cluster import (
    DEFAULT_BASE_PORT,
    LAYOUT_VARS,
    ClusterSpec,
    Launch,
    Plan,
    Task,
    TaskRef,
    container_name,
    free_ports,
    join_target,
    local_plan,
    plan_from_hosts,
    split_target,
)
from tfps.cluster.variables import catalogue, check_names
from tfps.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "ansible/roles/tfps"
#: The per-host layout variables: the only role options without a role default.
PER_HOST_LAYOUT = ("tfps_address", "tfps_base_port", "tfps_ps_tasks", "tfps_workers", "tfps_gpus", "tfps_gpu_count")


def plan(ps: dict, worker: dict) -> Plan:
    """The plan of hosts given in group order as {host: resolved variables}."""
    return plan_from_hosts(list(ps), list(worker), {**ps, **worker})


def two_ps_three_workers() -> Plan:
    """2 ps on one host, 3 workers: 2 GPU slots on one host, 1 CPU worker on another."""
    return plan(
        ps={"p": {"ansible_host": "10.0.0.1", "tfps_ps_tasks": 2}},
        worker={
            "g": {"ansible_host": "10.0.0.2", "tfps_gpus": [0, 1], "tfps_gpu_count": 2},
            "c": {"ansible_host": "10.0.0.3"},
        },
    )


def error(fn, *args, **kwargs) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        fn(*args, **kwargs)
    return info.value


# --------------------------------------------------------------------------- the module


def test_importing_cluster_does_not_import_tensorflow_or_ansible():
    code = ("import sys, tfps.cluster; assert 'tensorflow' not in sys.modules, 'tensorflow imported'; "
            "assert 'ansible' not in sys.modules, 'ansible imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_module_exports_the_documented_interface():
    names = ("ClusterSpec", "Plan", "Task", "TaskRef", "Launch", "free_ports", "local_plan", "plan_from_hosts",
             "container_name", "split_target", "join_target", "LAYOUT_VARS", "DEFAULT_BASE_PORT")
    for name in names:
        assert hasattr(cluster, name), name
        assert name in cluster.__all__, name
    assert DEFAULT_BASE_PORT == 2222
    assert set(LAYOUT_VARS) == {"ansible_host", *PER_HOST_LAYOUT}


# --------------------------------------------------------------------------- numbering


def test_plan_orders_ps_then_workers_and_numbers_them():
    p = two_ps_three_workers()
    assert [t.name for t in p.tasks] == ["ps0", "ps1", "worker0", "worker1", "worker2"]
    assert p.cluster == ClusterSpec(
        ps=("10.0.0.1:2222", "10.0.0.1:2223"),
        worker=("10.0.0.2:2222", "10.0.0.2:2223", "10.0.0.3:2222"),
    )
    assert p.cluster.as_dict() == {
        "ps": ["10.0.0.1:2222", "10.0.0.1:2223"],
        "worker": ["10.0.0.2:2222", "10.0.0.2:2223", "10.0.0.3:2222"],
    }


def test_chief_is_worker_zero():
    p = two_ps_three_workers()
    chiefs = [t for t in p.tasks if t.is_chief]
    assert chiefs == [p.task("worker", 0)] == [p.chief]
    assert p.task_ref(chiefs[0]).is_chief
    assert not p.task_ref(p.task("ps", 0)).is_chief
    assert not p.task_ref(p.task("worker", 1)).is_chief
    assert p.to_json()["chief"] == "worker0"


def test_gpu_slots_give_one_worker_per_gpu_in_order():
    p = plan(ps={"p": {}}, worker={"g": {"tfps_gpus": [3, "1", 2]}, "c": {"tfps_workers": 2}})
    workers = [t for t in p.tasks if t.job == "worker"]
    assert [(t.host, t.gpu, t.port) for t in workers] == [
        ("g", "3", 2222),
        ("g", "1", 2223),
        ("g", "2", 2224),
        ("c", None, 2222),
        ("c", None, 2223),
    ]


def test_gpu_uuid_strings_are_kept_as_given():
    p = plan(ps={"p": {}}, worker={"g": {"tfps_gpus": ["GPU-8a1b", "MIG-3c"]}})
    assert [t.gpu for t in p.tasks if t.job == "worker"] == ["GPU-8a1b", "MIG-3c"]


def test_tfps_workers_matching_gpu_count_is_fine():
    p = plan(ps={"p": {}}, worker={"g": {"tfps_gpus": [0, 1], "tfps_workers": 2}})
    assert len(p.cluster.worker) == 2


def test_empty_gpu_list_means_cpu_workers():
    p = plan(ps={"p": {}}, worker={"g": {"tfps_gpus": []}})
    assert [t.gpu for t in p.tasks if t.job == "worker"] == [None]


def test_gpu_list_with_gpu_count_within_range():
    p = plan(ps={"p": {}}, worker={"g": {"tfps_gpus": [1, 3], "tfps_gpu_count": 4}})
    assert [(t.gpu, t.port) for t in p.tasks if t.job == "worker"] == [("1", 2222), ("3", 2223)]


def test_ports_are_per_host_and_consecutive_from_base_port():
    p = plan(
        ps={"p1": {"tfps_ps_tasks": 2, "tfps_base_port": 3000}, "p2": {}},
        worker={"w1": {"tfps_workers": 3, "tfps_base_port": 4000}, "w2": {"tfps_workers": 1}},
    )
    assert [(t.name, t.host, t.port) for t in p.tasks] == [
        ("ps0", "p1", 3000),
        ("ps1", "p1", 3001),
        ("ps2", "p2", 2222),
        ("worker0", "w1", 4000),
        ("worker1", "w1", 4001),
        ("worker2", "w1", 4002),
        ("worker3", "w2", 2222),
    ]


def test_whole_numbers_given_as_strings_are_accepted():
    """-e tfps_workers=2 and some inventory scripts give numbers as strings."""
    p = plan(ps={"p": {"tfps_ps_tasks": "2"}}, worker={"w": {"tfps_workers": "3", "tfps_base_port": "4000"}})
    assert [(t.name, t.port) for t in p.tasks] == [
        ("ps0", 2222), ("ps1", 2223), ("worker0", 4000), ("worker1", 4001), ("worker2", 4002),
    ]


def test_address_is_ansible_host_else_inventory_name():
    p = plan(ps={"ps.example.org": {}}, worker={"w": {"ansible_host": "10.1.1.1"}})
    assert p.task("ps", 0).address == "ps.example.org"
    assert p.task("ps", 0).target == "ps.example.org:2222"
    assert p.task("worker", 0).address == "10.1.1.1"
    assert p.task("worker", 0).host == "w"


def test_tfps_address_overrides_ansible_host_for_peers_only():
    """A separate data network: SSH goes to ansible_host, TF traffic to tfps_address."""
    p = plan(ps={"p": {"ansible_host": "192.0.2.1", "tfps_address": "10.9.0.1"}},
             worker={"w": {"ansible_host": "192.0.2.2", "tfps_address": " 10.9.0.2 ", "tfps_workers": 2},
                     "v": {"ansible_host": "192.0.2.3", "tfps_address": ""},
                     "x": {"tfps_address": "[fd00::9]"}})
    assert [(t.host, t.address, t.target) for t in p.tasks] == [
        ("p", "10.9.0.1", "10.9.0.1:2222"),
        ("w", "10.9.0.2", "10.9.0.2:2222"), ("w", "10.9.0.2", "10.9.0.2:2223"),
        ("v", "192.0.2.3", "192.0.2.3:2222"),  # empty: ansible_host
        ("x", "fd00::9", "[fd00::9]:2222"),
    ]
    assert p.cluster.ps == ("10.9.0.1:2222",)
    data = p.to_json(Launch(name="j"))
    assert [t["address"] for t in data["tasks"]] == ["10.9.0.1", "10.9.0.2", "10.9.0.2", "192.0.2.3", "fd00::9"]
    assert json.loads(data["tasks"][1]["tf_config"])["cluster"]["worker"][0] == "10.9.0.2:2222"


@pytest.mark.parametrize("value", [["10.0.0.1"], True, "10.0.0.1 10.0.0.2"])
def test_bad_tfps_address_names_the_variable(value):
    exc = error(plan, ps={"p": {"tfps_address": value}}, worker={"w": {}})
    assert exc.field == "tfps_address" and "host 'p'" in str(exc)


def test_two_hosts_on_one_tfps_address_and_port_clash():
    exc = error(plan, ps={"p": {"ansible_host": "192.0.2.1", "tfps_address": "10.9.0.1"}},
                worker={"w": {"ansible_host": "192.0.2.2", "tfps_address": "10.9.0.1"}})
    assert "10.9.0.1:2222" in str(exc)


def test_numbering_follows_group_order_not_names():
    p = plan(ps={"zeta": {}, "alpha": {}}, worker={"w9": {}, "w1": {}})
    assert [t.host for t in p.tasks] == ["zeta", "alpha", "w9", "w1"]
    p = plan_from_hosts(["alpha", "zeta"], ["w1", "w9"], {})
    assert [t.host for t in p.tasks] == ["alpha", "zeta", "w1", "w9"]


def test_hosts_without_variables_get_the_defaults():
    p = plan_from_hosts(["p"], ["w"], {})
    assert [(t.name, t.address, t.port, t.gpu) for t in p.tasks] == [
        ("ps0", "p", DEFAULT_BASE_PORT, None),
        ("worker0", "w", DEFAULT_BASE_PORT, None),
    ]


def test_same_machine_with_two_entries_and_distinct_base_ports():
    p = plan(
        ps={"box-ps": {"ansible_host": "10.0.0.5"}},
        worker={"box": {"ansible_host": "10.0.0.5", "tfps_base_port": 2232, "tfps_workers": 2}},
    )
    assert p.cluster.as_dict() == {"ps": ["10.0.0.5:2222"], "worker": ["10.0.0.5:2232", "10.0.0.5:2233"]}


def test_ipv6_addresses_are_bracketed():
    p = plan(ps={"p": {"ansible_host": "fd00::1"}}, worker={"w": {}})
    assert p.task("ps", 0).target == "[fd00::1]:2222"
    ref = p.task_ref(p.task("ps", 0))
    assert ref.port == 2222
    assert TaskRef.from_flags(*_flag_values(ref)) == ref
    assert json.loads(ref.to_tf_config())["cluster"]["ps"] == ["[fd00::1]:2222"]


def test_ipv6_address_given_in_brackets_is_not_bracketed_twice():
    p = plan(ps={"p": {"ansible_host": "[fd00::1]"}}, worker={"w": {}})
    assert p.task("ps", 0).target == "[fd00::1]:2222"


def test_same_ipv6_address_with_and_without_brackets_clashes():
    exc = error(plan, ps={"a": {"ansible_host": "[fd00::1]"}}, worker={"b": {"ansible_host": "fd00::1"}})
    assert exc.field == "tfps_base_port"
    assert "[fd00::1]:2222" in str(exc)


def test_non_layout_variables_are_ignored():
    p = plan(
        ps={"p": {"ansible_user": "root", "color": "blue"}},
        worker={"w": {"tfps_model": "mlp", "tfps_train_steps": "x"}},
    )
    assert len(p.tasks) == 2


def test_variables_of_hosts_outside_ps_and_worker_are_not_planned():
    p = plan_from_hosts(["p"], ["w"], {"p": {}, "w": {}, "monitor": {"tfps_workers": "bad"}})
    assert [t.host for t in p.tasks] == ["p", "w"]


# --------------------------------------------------------------------------- host:port


def test_split_and_join_target():
    assert split_target("10.0.0.1:2222") == ("10.0.0.1", 2222)
    assert split_target("[fd00::1]:2222") == ("fd00::1", 2222)
    assert join_target("10.0.0.1", 2222) == "10.0.0.1:2222"
    assert join_target("fd00::1", 2222) == "[fd00::1]:2222"
    assert split_target(join_target("fd00::1", 7)) == ("fd00::1", 7)


def test_container_name():
    p = two_ps_three_workers()
    assert container_name("train", p.chief) == "tfps-train-worker0"
    assert container_name("j", p.task("ps", 1)) == "tfps-j-ps1"


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



def test_to_json_with_launch_gives_every_task_its_container_argv_and_env():
    p = two_ps_three_workers()
    launch = Launch(name="j", run_args=("--train_steps=5",), stop_timeout=60, extra={"model_dir": "/m"})
    data = json.loads(json.dumps(p.to_json(launch)))
    assert data["job"] == {"name": "j", "tensorboard_container": "tfps-j-tensorboard", "model_dir": "/m"}
    for entry, task in zip(data["tasks"], p.tasks):
        ref = p.task_ref(task)
        assert entry["container"] == f"tfps-j-{task.name}"
        assert entry["argv"] == ["run", "--train_steps=5"]
        assert entry["entrypoint"] is None
        assert entry["stop_timeout"] == 60
        # The read-only root filesystem: caches go to the tmpfs the entry lists.
        assert entry["env"] == {"TFPS_HOST": task.host, "TFPS_TASK": task.name, "TF_CONFIG": ref.to_tf_config(),
                                "XDG_CACHE_HOME": "/tmp/.cache", "MPLCONFIGDIR": "/tmp/.config/matplotlib"}
        assert entry["tmpfs"] == ["/tmp"]


def test_to_json_with_a_classic_script_passes_the_classic_flags():
    p = two_ps_three_workers()
    launch = Launch(name="j", script="train.py", script_args=("--x=1",))
    data = p.to_json(launch)
    for entry, task in zip(data["tasks"], p.tasks):
        assert entry["entrypoint"][-1] == "/opt/usermodels/train.py"
        assert entry["argv"] == p.task_ref(task).to_flags() + ["--x=1"]
        assert "TF_CONFIG" not in entry["env"]


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
    assert [t.name for t in plan.tasks] == [
        "ps0",
        "ps1",
        "worker0",
        "worker1",
        "worker2",
    ]
    assert len({t.port for t in plan.tasks}) == 5
    assert {t.address for t in plan.tasks} == {"127.0.0.1"}
    assert plan.task("worker", 0).is_chief


def test_local_plan_with_given_ports():
    plan = local_plan(1, 2, ports=[7000, 7001, 7002])
    assert plan.cluster.as_dict() == {
        "ps": ["127.0.0.1:7000"],
        "worker": ["127.0.0.1:7001", "127.0.0.1:7002"],
    }




# --------------------------------------------------------------------------- bad layouts


@pytest.mark.parametrize(
    ("ps", "worker", "field", "words"),
    [
        ([], ["w"], "ps", ["no hosts in group 'ps'", "group named ps"]),
        (None, ["w"], "ps", ["no hosts in group 'ps'"]),
        (["p"], [], "worker", ["no hosts in group 'worker'", "group named worker"]),
        (["p"], None, "worker", ["no hosts in group 'worker'"]),
    ],
)
def test_missing_groups(ps, worker, field, words):
    exc = error(plan_from_hosts, ps, worker, {})
    assert exc.field == field
    for word in words:
        assert word in str(exc), str(exc)


def test_host_in_both_ps_and_worker():
    exc = error(plan, ps={"box": {}}, worker={"box": {}})
    assert exc.field == "ps"
    assert "host 'box' is in both the ps and the worker group" in str(exc)
    assert "give the ps its own inventory entry with the same ansible_host and another tfps_base_port" in str(exc)


def test_duplicate_address_and_port_names_both_tasks():
    exc = error(plan, ps={"a": {"ansible_host": "10.0.0.1"}}, worker={"b": {"ansible_host": "10.0.0.1"}})
    assert exc.field == "tfps_base_port"
    assert "ps0 (host 'a') and worker0 (host 'b') both use 10.0.0.1:2222" in str(exc)
    assert "give host 'b' another tfps_base_port" in str(exc)


def test_duplicate_address_is_case_insensitive():
    exc = error(plan, ps={"a": {"ansible_host": "Node1.lan"}}, worker={"b": {"ansible_host": "node1.LAN"}})
    assert exc.field == "tfps_base_port" and "both use" in str(exc)


def test_overlapping_port_ranges_are_caught():
    exc = error(
        plan,
        ps={"a": {"ansible_host": "h", "tfps_ps_tasks": 3}},
        worker={"b": {"ansible_host": "h", "tfps_base_port": 2224}},
    )
    assert exc.field == "tfps_base_port"
    assert "ps2 (host 'a') and worker0 (host 'b') both use h:2224" in str(exc)


def test_overlapping_ranges_of_two_worker_hosts():
    exc = error(
        plan,
        ps={"p": {}},
        worker={"a": {"ansible_host": "h", "tfps_workers": 2, "tfps_base_port": 3000},
                "b": {"ansible_host": "h", "tfps_base_port": 3001}},
    )
    assert "worker1 (host 'a') and worker2 (host 'b') both use h:3001" in str(exc)


@pytest.mark.parametrize(
    ("host_vars", "field", "words"),
    [
        ({"tfps_base_port": 0}, "tfps_base_port", ["tfps_base_port: 0", "positive"]),
        ({"tfps_base_port": 70000}, "tfps_base_port", ["port 70000", "1..65535"]),
        ({"tfps_base_port": 65535, "tfps_workers": 2}, "tfps_base_port", ["65536", "at most 65534"]),
        ({"tfps_base_port": "abc"}, "tfps_base_port", ["'abc'", "whole number"]),
        ({"tfps_base_port": 2222.5}, "tfps_base_port", ["2222.5", "whole number"]),
        ({"tfps_base_port": True}, "tfps_base_port", ["True", "whole number"]),
        ({"tfps_base_port": None}, "tfps_base_port", ["None", "whole number"]),
        ({"tfps_workers": "two"}, "tfps_workers", ["'two'", "whole number"]),
        ({"tfps_workers": 0}, "tfps_workers", ["tfps_workers: 0", "positive"]),
        ({"tfps_workers": -1}, "tfps_workers", ["tfps_workers: -1", "positive"]),
        ({"tfps_workers": [2]}, "tfps_workers", ["[2]", "whole number"]),
        ({"tfps_gpus": "0,1"}, "tfps_gpus", ["YAML list", "[0, 1]"]),
        ({"tfps_gpus": 0}, "tfps_gpus", ["YAML list"]),
        ({"tfps_gpus": [0, 1, 0]}, "tfps_gpus", ["GPU id 0 twice"]),
        ({"tfps_gpus": [0, "0"]}, "tfps_gpus", ["GPU id 0 twice"]),
        ({"tfps_gpus": [-1]}, "tfps_gpus", ["GPU id -1"]),
        ({"tfps_gpus": [0.5]}, "tfps_gpus", ["GPU id 0.5"]),
        ({"tfps_gpus": [True]}, "tfps_gpus", ["GPU id True"]),
        ({"tfps_gpus": [""]}, "tfps_gpus", ["GPU id ''"]),
        ({"tfps_gpus": [0], "tfps_gpu_count": 0}, "tfps_gpus", ["GPU ids on a host without GPUs"]),
        ({"tfps_gpus": [0, 1, 2], "tfps_gpu_count": 2}, "tfps_gpus", ["3 GPU slots", "tfps_gpu_count is 2"]),
        ({"tfps_gpus": [0, 2], "tfps_gpu_count": 2}, "tfps_gpus", ["GPU id 2", "use ids 0..1"]),
        ({"tfps_gpu_count": -1}, "tfps_gpu_count", ["tfps_gpu_count: -1"]),
        ({"tfps_gpu_count": "many"}, "tfps_gpu_count", ["'many'", "whole number"]),
        ({"tfps_gpus": [0, 1], "tfps_workers": 3}, "tfps_workers", ["tfps_workers: 3 but 2 GPU id(s)"]),
        ({"tfps_gpus": ["0 1"]}, "tfps_gpus", ["GPU id '0 1'"]),
        ({"tfps_gpus": ["0,1"]}, "tfps_gpus", ["GPU id '0,1'"]),
        ({"ansible_host": ""}, "ansible_host", ["ansible_host ''"]),
        ({"ansible_host": "  "}, "ansible_host", ["ansible_host '  '"]),
        ({"ansible_host": None}, "ansible_host", ["ansible_host None"]),
        ({"ansible_host": ["10.0.0.1"]}, "ansible_host", ["ansible_host ['10.0.0.1']"]),
    ],
)
def test_bad_worker_host_variables(host_vars, field, words):
    exc = error(plan, ps={"p": {}}, worker={"w": host_vars})
    assert exc.field == field, str(exc)
    assert "'w'" in str(exc)
    for word in words:
        assert word in str(exc), str(exc)


@pytest.mark.parametrize(
    ("host_vars", "field", "words"),
    [
        ({"tfps_ps_tasks": 0}, "tfps_ps_tasks", ["tfps_ps_tasks: 0", "positive"]),
        ({"tfps_ps_tasks": "x"}, "tfps_ps_tasks", ["tfps_ps_tasks: 'x'", "whole number"]),
        ({"tfps_ps_tasks": 2, "tfps_base_port": 65535}, "tfps_base_port", ["65536", "at most 65534"]),
        ({"tfps_base_port": -5}, "tfps_base_port", ["tfps_base_port: -5", "positive"]),
    ],
)
def test_bad_ps_host_variables(host_vars, field, words):
    exc = error(plan, ps={"p": host_vars}, worker={"w": {}})
    assert exc.field == field, str(exc)
    assert "'p'" in str(exc)
    for word in words:
        assert word in str(exc), str(exc)


def test_worker_variables_on_a_ps_host_are_not_read():
    p = plan(ps={"p": {"tfps_workers": 5, "tfps_gpus": [0, 1]}}, worker={"w": {"tfps_ps_tasks": 9}})
    assert [t.name for t in p.tasks] == ["ps0", "worker0"]
    assert p.task("ps", 0).gpu is None


def test_cpu_worker_ignores_gpu_count_zero():
    p = plan(ps={"p": {}}, worker={"w": {"tfps_gpu_count": 0, "tfps_workers": 2}})
    assert [t.gpu for t in p.tasks if t.job == "worker"] == [None, None]


def test_highest_base_port_that_fits():
    p = plan(ps={"p": {"tfps_base_port": 65535}}, worker={"w": {"tfps_base_port": 65534, "tfps_workers": 2}})
    assert [t.port for t in p.tasks] == [65535, 65534, 65535]


# --------------------------------------------------------------------------- the role's variables


def _specs() -> dict:
    return yaml.safe_load((ROLE / "meta/argument_specs.yml").read_text())["argument_specs"]


@pytest.mark.parametrize(
    ("typo", "suggestion"),
    [
        ("tfps_gpu", "tfps_gpus"),
        ("tfps_base_prot", "tfps_base_port"),
        ("tfps_train_step", "tfps_train_steps"),
        ("tfps_sync_replica", "tfps_sync_replicas"),
        ("tfps_worker", "tfps_workers"),
        ("tfps_wrokers", "tfps_workers"),
    ],
)
def test_unknown_tfps_variable_suggests_the_closest(typo, suggestion):
    exc = error(check_names, ["ansible_host", "tfps_model", typo], "host 'w'")
    assert exc.field == typo
    assert "host 'w'" in str(exc)
    assert f"did you mean '{suggestion}'?" in str(exc)


def test_unknown_variable_names_where_it_was_set():
    exc = error(check_names, ["tfps_gpu"], "host 'w'", origin=lambda name: "/inv/hosts.ini:4")
    assert "(set in /inv/hosts.ini:4)" in str(exc)


def test_unknown_variable_far_from_any_known_one_points_to_the_docs():
    exc = error(check_names, ["tfps_zzzzzzzz"], "host 'w'")
    assert "docs/ansible.md" in str(exc)


def test_known_and_foreign_variables_pass():
    check_names(list(catalogue()) + ["ansible_host", "ansible_user", "color", 3], "host 'w'")


def test_the_catalogue_is_the_roles_argument_specs():
    assert catalogue() == _specs()["main"]["options"]
    for name, spec in catalogue().items():
        assert name.startswith("tfps_"), name
        assert spec.get("type") and spec.get("description"), name


def test_every_role_default_is_an_argument_spec_option_and_every_option_has_a_default():
    defaults = yaml.safe_load((ROLE / "defaults/main.yml").read_text())
    options = _specs()["main"]["options"]
    assert [k for k in defaults if k not in options] == []
    for name in PER_HOST_LAYOUT:
        assert name in options, name
    without_default = [k for k in options if k not in PER_HOST_LAYOUT and k not in defaults]
    assert without_default == []


def test_status_stop_and_cleanup_take_the_same_options_as_main():
    specs = _specs()
    assert {"main", "status", "stop", "cleanup"} <= set(specs)
    for entry in ("status", "stop", "cleanup"):
        assert specs[entry]["options"] == specs["main"]["options"], entry


def test_example_inventory_sets_only_known_variables_and_gives_the_documented_plan():
    from tfps.cluster.inventory import load_plan, plan_of

    data = load_plan([str(REPO / "inventory/example")])
    p = plan_of(data)
    assert [(t.name, t.host, t.target, t.gpu, t.is_chief) for t in p.tasks] == [
        ("ps0", "ps1", "10.0.0.11:2222", None, False),
        ("worker0", "gpu1", "10.0.0.12:2222", "0", True),
        ("worker1", "gpu1", "10.0.0.12:2223", "1", False),
        ("worker2", "cpu1", "10.0.0.13:2222", None, False),
    ]
    assert load_plan([str(REPO / "inventory/example/hosts.yml")]) == data
    assert data["job"]["name"] == "example"
    assert "--train_steps=10000" in data["tasks"][0]["argv"]
    settings = yaml.safe_load((REPO / "inventory/example/group_vars/all.yml").read_text())
    assert settings["tfps_model"] == "mlp"
    assert settings["tfps_sync_replicas"] is False
    assert settings["tfps_final_save_timeout"] == 1800
    assert settings["tfps_image"] == "tfps:latest"
    assert "tfps_notify_urls" not in settings  # secrets go into a vault file


def test_local_inventory_runs_everything_on_one_machine():
    from tfps.cluster.inventory import load_plan, plan_of

    p = plan_of(load_plan([str(REPO / "inventory/local")]))
    assert [(t.name, t.host, t.target) for t in p.tasks] == [
        ("ps0", "tfps-ps", "127.0.0.1:2222"),
        ("worker0", "tfps-worker", "127.0.0.1:2232"),
        ("worker1", "tfps-worker", "127.0.0.1:2233"),
    ]


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
            tf_config(cluster={"ps": ["p:1"], "worker": ["w:1"], "tfps": ["t:1"]}),
            ["'tfps' job"],
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



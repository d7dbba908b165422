"""Slurm's hostlist and tasks-per-node syntaxes, the roles of a step's ranks, a worker's GPUs
and the rendezvous of addresses (tfps.cluster.slurm)."""

from __future__ import annotations

import pytest

from tfps.cluster import slurm
from tfps.errors import ConfigError


@pytest.mark.parametrize("text, names", [
    ("node1", ["node1"]),
    ("n[1-3,7]", ["n1", "n2", "n3", "n7"]),
    ("a[01-10]b", [f"a{i:02d}b" for i in range(1, 11)]),
    ("node[1-3,5],gpu-a[01-02]", ["node1", "node2", "node3", "node5", "gpu-a01", "gpu-a02"]),
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ("c[8-11]", ["c8", "c9", "c10", "c11"]),
    ("c[098-101]", ["c098", "c099", "c100", "c101"]),
    ("x,y[3],z", ["x", "y3", "z"]),
    ("tfpsl123-[1-3]", ["tfpsl123-1", "tfpsl123-2", "tfpsl123-3"]),
])
def test_hostlist_expands_as_scontrol_show_hostnames(text, names):
    assert slurm.expand_hostlist(text) == names


@pytest.mark.parametrize("text, why", [
    ("", "empty"), ("n[1-3", "without its ']'"), ("n1-3]", "without its '['"), ("n[3-1]", "backwards"),
    ("n[a-b]", "neither a number"), ("n1,,n2", "empty name"), ("n[[1]]", "inside a bracket"),
])
def test_a_malformed_hostlist_is_one_line_saying_what(text, why):
    with pytest.raises(ConfigError, match="hostlist syntax") as e:
        slurm.expand_hostlist(text)
    assert why in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("text, counts", [
    ("1", [1]), ("2(x3),1", [2, 2, 2, 1]), ("3,1(x2)", [3, 1, 1]), ("1(x3)", [1, 1, 1]),
])
def test_tasks_per_node(text, counts):
    assert slurm.expand_tasks_per_node(text) == counts


@pytest.mark.parametrize("text", ["", "0", "2(x0)", "2x3", "a"])
def test_bad_tasks_per_node(text):
    with pytest.raises(ConfigError, match="tasks per node"):
        slurm.expand_tasks_per_node(text)


def test_roles_are_ps_first_then_workers_block_over_the_nodes():
    layout = slurm.step_layout("n[1-3]", "2,1(x2)", num_ps=1, num_workers=3)
    assert [(t.rank, t.name, t.host, t.local_id) for t in layout] == [
        (0, "ps0", "n1", 0), (1, "worker0", "n1", 1), (2, "worker1", "n2", 0), (3, "worker2", "n3", 0)]


@pytest.mark.parametrize("nodes, per_node, ps, workers", [
    ("n1", "3", 1, 2), ("n[1-3]", "1(x3)", 1, 2), ("a[1-2],b1", "3,2,1", 2, 4), ("n[1-4]", "2(x4)", 3, 5),
])
def test_every_layout_gives_each_role_once_on_its_node(nodes, per_node, ps, workers):
    layout = slurm.step_layout(nodes, per_node, ps, workers)
    assert sorted(t.name for t in layout) == sorted([f"ps{i}" for i in range(ps)] + [f"worker{i}" for i in range(workers)])
    hosts = slurm.expand_hostlist(nodes)
    counts = slurm.expand_tasks_per_node(per_node)
    expected = [h for h, c in zip(hosts, counts) for _ in range(c)]
    assert [t.host for t in layout] == expected
    for host in set(hosts):
        assert sorted(t.local_id for t in layout if t.host == host) == list(range(expected.count(host)))


def test_a_step_of_another_size_is_refused():
    with pytest.raises(ConfigError, match=r"srun --ntasks=3"):
        slurm.step_layout("n[1-2]", "1(x2)", 1, 2)
    with pytest.raises(ConfigError, match="names 1"):
        slurm.step_layout("n[1-2]", "3", 1, 2)


def _env(**kw):
    env = {"SLURM_PROCID": "2", "SLURM_STEP_NODELIST": "n[1-3]", "SLURM_STEP_TASKS_PER_NODE": "1(x3)",
           "SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0"}
    env.update(kw)
    return env


def test_from_environment():
    step = slurm.from_environment(_env(SLURM_RESTART_COUNT="1"), 1, 2)
    assert (step.job_id, step.restart, step.me.name, step.me.host) == ("42", 1, "worker1", "n3")


def test_outside_srun_is_one_line():
    env = _env()
    del env["SLURM_PROCID"]
    with pytest.raises(ConfigError, match="SLURM_PROCID is not set: run this under srun"):
        slurm.from_environment(env, 1, 2)


def test_gpus_a_worker_takes_its_slots_share_and_a_ps_none():
    layout = slurm.step_layout("g1", "3", 1, 2)
    env = {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5"}
    assert slurm.worker_gpu_env(layout[0], 2, env) == {"CUDA_VISIBLE_DEVICES": "-1"}
    assert slurm.worker_gpu_env(layout[1], 2, env)["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert slurm.worker_gpu_env(layout[2], 2, env)["CUDA_VISIBLE_DEVICES"] == "4,5"
    assert slurm.worker_gpu_env(layout[2], 0, env) == {}
    with pytest.raises(ConfigError, match="needs 2 GPU"):
        slurm.worker_gpu_env(layout[2], 2, {"SLURM_STEP_GPUS": "0,1"})


def test_rendezvous_gathers_every_address_in_task_order(tmp_path):
    layout = slurm.step_layout("n[1-2]", "2,1", 1, 2)
    for t, port in zip(layout, (2222, 3333, 4444)):
        slurm.publish(str(tmp_path), t, port)
    cluster = slurm.gather(str(tmp_path), layout, timeout=1)
    assert cluster.ps == ("n1:2222",) and cluster.worker == ("n1:3333", "n2:4444")


def test_rendezvous_names_the_missing_tasks_after_the_timeout(tmp_path):
    layout = slurm.step_layout("n[1-2]", "2,1", 1, 2)
    slurm.publish(str(tmp_path), layout[0], 2222)
    now = [0.0]
    with pytest.raises(ConfigError, match=r"after 5 s, worker0 \(rank 1 on n1\), worker1 \(rank 2 on n2\)"):
        slurm.gather(str(tmp_path), layout, timeout=5, clock=lambda: now[0],
                     sleep=lambda s: now.__setitem__(0, now[0] + s))


def test_pick_port_is_free():
    import socket
    port = slurm.pick_port()
    with socket.socket() as s:
        s.bind(("0.0.0.0", port))

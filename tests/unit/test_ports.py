"""The role's tfps_ports module: each job's ports on a host, chosen under a lock."""

from __future__ import annotations

import json
import multiprocessing
import socket
from pathlib import Path

import pytest

from tests.fixtures.role_modules import load_module

ports = load_module("tfps_ports")

NOW = 1_000_000.0


def entry(job, owner, base, count, time=NOW):
    return {"job": job, "owner": owner, "base": base, "count": count, "time": time}


def request(owner, count, base=None, first=2222):
    return {"owner": owner, "count": count, "base": base, "first": first}


def params(tmp_path, job, owner, count, **over):
    p = {"job": job, "owner": owner, "count": count, "base": None, "avoid": [], "first_port": 2222,
         "tensorboard": False, "tensorboard_port": 0, "tensorboard_first_port": 6006, "state": "reserved",
         "state_dir": str(tmp_path), "ttl": 1800, "docker_socket": str(tmp_path / "no-docker.sock")}
    p.update(over)
    return p


def test_a_second_job_gets_the_next_free_range_and_skips_what_listens():
    kept, chosen = ports.reserve([entry("a", "h1", 2222, 3)], "b", [request("h1", 2)], listening={2225}, avoid=set(),
                                 now=NOW)
    assert chosen == {"h1": 2226}
    assert entry("a", "h1", 2222, 3) in kept and entry("b", "h1", 2226, 2) in kept


def test_a_redeploy_keeps_its_ports_even_while_its_servers_listen():
    held = [entry("a", "h1", 2222, 3, time=NOW - 10), entry("b", "h1", 2225, 2)]
    kept, chosen = ports.reserve(held, "b", [request("h1", 2)], listening={2225, 2226}, avoid=set(), now=NOW)
    assert chosen == {"h1": 2225}
    assert [e for e in kept if e["job"] == "b"] == [entry("b", "h1", 2225, 2)]


def test_a_job_with_more_tasks_moves_to_a_range_that_fits():
    held = [entry("b", "h1", 2222, 2), entry("a", "h1", 2224, 1)]
    _, chosen = ports.reserve(held, "b", [request("h1", 3)], listening={2222, 2223}, avoid=set(), now=NOW)
    assert chosen == {"h1": 2225}


def test_two_inventory_entries_of_one_machine_and_a_fixed_neighbour_do_not_overlap():
    kept, chosen = ports.reserve([entry("j", "box-ps", 2222, 1)], "j", [request("box", 2)], listening=set(),
                                 avoid={2223}, now=NOW)
    assert chosen == {"box": 2224}


def test_a_fixed_base_port_that_another_job_holds_is_refused_with_its_name():
    with pytest.raises(ports.PortsError) as exc:
        ports.reserve([entry("alice", "h1", 2222, 3)], "bob", [request("h1", 2, base=2224)], listening=set(),
                      avoid=set(), now=NOW)
    assert "2224-2225 (h1) overlap port(s) 2222-2224 that job alice holds" in str(exc.value)
    assert "leave tfps_base_port out" in str(exc.value)


def test_tensorboard_gets_its_own_port_from_6006():
    held = [entry("a", "tensorboard", 6006, 1)]
    _, chosen = ports.reserve(held, "b", [request("h1", 2), request("tensorboard", 1, first=6006)],
                              listening={6007}, avoid=set(), now=NOW)
    assert chosen == {"h1": 2222, "tensorboard": 6008}


def test_reservations_without_containers_expire_and_others_stay():
    held = [entry("old", "h", 2222, 1, time=NOW - 4000), entry("running", "h", 2223, 1, time=NOW - 4000),
            entry("starting", "h", 2224, 1, time=NOW - 60), entry("me", "h", 2225, 1, time=NOW - 4000)]
    alive = ports.live(held, "me", {"running"}, NOW, ttl=1800)
    assert [e["job"] for e in alive] == ["running", "starting", "me"]
    # An engine that cannot be asked expires nothing.
    assert ports.live(held, "me", None, NOW, ttl=1800) == held


def test_no_room_left_says_what_to_do():
    with pytest.raises(ports.PortsError, match="no 2 consecutive free port"):
        ports.choose(2, 65534, {65535})


def test_a_listening_socket_is_seen():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        assert sock.getsockname()[1] in ports.listening_ports()


@pytest.fixture
def quiet_host(monkeypatch):
    """Nothing listens: what a job gets then depends on the reservations alone."""
    monkeypatch.setattr(ports, "listening_ports", lambda: set())


def test_query_and_absent_read_and_forget_the_record(tmp_path, quiet_host):
    got = ports.run(params(tmp_path, "j", "h1", 3, tensorboard=True), check_mode=False)
    assert (got["base_port"], got["tensorboard_port"], got["changed"]) == (2222, 6006, True)
    again = ports.run(params(tmp_path, "j", "h1", 3, tensorboard=True), check_mode=False)
    assert (again["base_port"], again["changed"]) == (2222, False)
    assert ports.run(params(tmp_path, "j", "h1", 0, state="query"), check_mode=False)["base_port"] == 2222
    other = ports.run(params(tmp_path, "k", "h1", 1), check_mode=False)
    assert other["base_port"] == 2225
    assert ports.run(params(tmp_path, "j", "h1", 0, state="absent"), check_mode=False)["changed"]
    saved = json.loads((tmp_path / "ports.json").read_text())["reservations"]
    assert [(e["job"], e["base"]) for e in saved] == [("k", 2225)]


def test_check_mode_chooses_but_records_nothing(tmp_path, quiet_host):
    got = ports.run(params(tmp_path, "j", "h1", 2), check_mode=True)
    assert got["base_port"] == 2222
    assert not (tmp_path / "ports.json").exists()


def _reserve_at_once(state_dir, job, barrier, out):
    barrier.wait()
    out.put((job, ports.run(params(Path(state_dir), job, "h1", 3), check_mode=False)["base_port"]))


def test_jobs_deployed_at_the_same_moment_get_disjoint_ports(tmp_path, quiet_host):
    """The lock on the host: eight plays choosing at once, in separate processes."""
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(8), ctx.Queue()
    procs = [ctx.Process(target=_reserve_at_once, args=(str(tmp_path), f"job{i}", barrier, out)) for i in range(8)]
    for proc in procs:
        proc.start()
    got = dict(out.get(timeout=30) for _ in procs)
    for proc in procs:
        proc.join(timeout=30)
        assert proc.exitcode == 0
    bases = sorted(got.values())
    assert bases == [2222 + 3 * i for i in range(8)], got
    saved = json.loads((tmp_path / "ports.json").read_text())["reservations"]
    assert sorted(e["job"] for e in saved) == sorted(got)

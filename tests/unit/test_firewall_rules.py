"""The role's firewall rules: the tfps_firewall_rules filter's order (accepts inserted before the
drop is appended) and the iptables arguments the tfps_firewall module gives each rule. The rules
on real hosts, an outsider refused and the rules saved for a reboot: tests/system/test_security.py."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROLE = Path(__file__).resolve().parents[2] / "ansible" / "roles" / "tfps"


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


filters = _load(ROLE / "filter_plugins" / "tfps_filters.py")
firewall = _load(ROLE / "library" / "tfps_firewall.py")


def test_each_task_accepts_lo_and_every_cluster_address_then_drops_the_rest():
    tasks = [{"name": "worker0", "port": 2223}, {"name": "worker1", "port": "2224"}]
    rules = filters.tfps_firewall_rules(tasks, "j", ["10.0.0.1", "10.0.0.2"])
    assert [(r["port"], r.get("in_interface"), r.get("source"), r["jump"], r["action"]) for r in rules] == [
        (2223, "lo", None, "ACCEPT", "insert"), (2224, "lo", None, "ACCEPT", "insert"),
        (2223, None, "10.0.0.1", "ACCEPT", "insert"), (2223, None, "10.0.0.2", "ACCEPT", "insert"),
        (2224, None, "10.0.0.1", "ACCEPT", "insert"), (2224, None, "10.0.0.2", "ACCEPT", "insert"),
        (2223, None, None, "DROP", "append"), (2224, None, None, "DROP", "append")]
    assert {r["comment"] for r in rules} == {"tfps j worker0", "tfps j worker1"}
    assert filters.tfps_firewall_rules([], "j", ["10.0.0.1"]) == []


def test_a_rule_is_one_tcp_port_with_its_comment_and_target():
    assert firewall.rule_args({"port": 2222, "source": "10.0.0.2", "comment": "tfps j ps0", "jump": "ACCEPT"}) == [
        "-p", "tcp", "-s", "10.0.0.2", "--dport", "2222", "-m", "comment", "--comment", "tfps j ps0", "-j", "ACCEPT"]
    assert firewall.rule_args({"port": 2222, "in_interface": "lo", "comment": "tfps j ps0", "jump": "ACCEPT"})[:4] == \
        ["-p", "tcp", "-i", "lo"]
    # The job's rules in iptables-save's output: only its own (another job's name may extend it).
    saved = '-A INPUT -p tcp --dport 2222 -m comment --comment "tfps j ps0" -j DROP\n' \
            '-A INPUT -p tcp --dport 2223 -m comment --comment "tfps jj ps0" -j DROP\n'
    assert firewall.job_lines(saved, '--comment "tfps j ') == saved.splitlines()[:1]

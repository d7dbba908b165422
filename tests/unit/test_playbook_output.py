"""The hosts tfps deploy/stop/status/cleanup name in their last line, read from the play's output."""

from tfps.launch.playbook import unreachable_hosts


def test_the_role_s_check_names_each_unreachable_host_once():
    # A failed check task's message, as ansible-playbook prints it (JSON, newlines escaped).
    line = ('    "msg": "h1 (192.0.2.1) cannot be reached over SSH: Failed to connect to the host via ssh; '
            'check that it is up\\nps-2.lab (10.0.0.2) cannot be reached over SSH: timed out; check ...\\n'
            'h1 (192.0.2.1) cannot be reached over SSH: again"')
    assert unreachable_hosts(line) == ["h1 (192.0.2.1)", "ps-2.lab (10.0.0.2)"]


def test_ansible_s_own_unreachable_line():
    assert unreachable_hosts('fatal: [worker3]: UNREACHABLE! => {"changed": false, "unreachable": true}') == [
        "worker3"]


def test_other_lines_name_no_host():
    for line in ("ok: [h1]", "h1 : ok=3 changed=0 unreachable=0 failed=0", "fatal: [h1]: FAILED! => {}", ""):
        assert unreachable_hosts(line) == []


def test_an_unreachable_host_is_exit_4_as_the_readme_says_however_the_play_learnt_it():
    """Issue 51: deploy exited 2 (the role's reachability check is a failed task) where the README says 4."""
    from tfps.launch.playbook import failure
    code, line = failure("deploy", 2, ["h1 (192.0.2.1)", "h2 (192.0.2.2)"])
    assert code == 4 and line.startswith(
        "tfps: error: deploy: h1 (192.0.2.1), h2 (192.0.2.2) cannot be reached over SSH (ansible-playbook exited 2: "
        "the role's check failed): check the inventory's addresses")
    code, line = failure("stop", 4, ["worker3"])
    assert code == 4 and line.startswith("tfps: error: stop: worker3 cannot be reached over SSH: check ")
    assert failure("deploy", 2, []) == (2, "tfps: error: deploy: ansible-playbook exited 2: a task failed on a host "
                                           "(the output above says which)")

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

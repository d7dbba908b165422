"""``tfps local --script``: a user's classic TF1 script whose ps blocks in server.join(), run
under tfps.task.net.script_guard (its servers on loopback only)."""

from __future__ import annotations

import json
import signal
import time

import docblocks
import pytest
from integration_helpers import REPO, assert_nothing_left, cluster_pids, launcher_ports, poll, task_exit

pytestmark = pytest.mark.integration

#: The command of the classic-script tutorial (docs/tutorials/classic-script.md), split at its `--`.
TUTORIAL = docblocks.tfps_args("tutorials/classic-script.md", "tests/integration/test_classic_script.py", "local",
                               paths={"tests/": REPO / "tests"})
OPTIONS, SCRIPT_ARGS = TUTORIAL[:TUTORIAL.index("--")], TUTORIAL[TUTORIAL.index("--") + 1:]
STEPS = int(SCRIPT_ARGS[SCRIPT_ARGS.index("--train_steps") + 1])


def test_classic_script_runs_and_its_ps_is_ended(procs, tmp_path):
    """The tutorial's command, with this test's model_dir and the script's --marker."""
    marker = tmp_path / "chief_done.json"
    assert OPTIONS[:2] == ["--script", str(REPO / "tests/fixtures/classic_replica.py")], OPTIONS
    launcher = procs.tfps("tfps-local-script", "local", *OPTIONS, "--model_dir", tmp_path / "model",
                          "--", *SCRIPT_ARGS, "--marker", marker)
    ports = launcher_ports(launcher)
    rc = launcher.wait(300)
    assert rc == 0, launcher.tail()
    done = json.loads(marker.read_text())
    assert done["global_step"] >= STEPS - 1
    # The classic ps never returns from server.join(): the launcher had to end it.
    assert task_exit(launcher, "worker0") == "0 (OK)"
    # ... and says so, instead of naming the signal as if the ps had failed (issue 39 item 1).
    assert "ps0 ended by tfps: the classic ps never exits; the chief finished" in launcher.output(), launcher.tail()
    assert "ps0 exited with" not in launcher.output(), launcher.tail()
    # tfps's model_dir is not the script's: the start line names no directory the script never uses.
    start = launcher.lines(r"tfps local: 1 ps \+ 2 worker\(s\) on (.*)$")[0].group(1)
    assert "model_dir" not in start and not (tmp_path / "model").exists(), start
    assert_nothing_left(ports, launcher)


def test_a_classic_script_that_never_ends_stops_on_one_ctrl_c(procs, tmp_path):
    """The script's processes are signalled: its chief takes the SIGINT (KeyboardInterrupt in
    its training loop), then its ps are ended; no escalation to SIGTERM or SIGKILL is needed."""
    launcher = procs.tfps("tfps-local-script-stop", "local", "--script", REPO / "tests/fixtures/classic_replica.py",
                          "--model_dir", tmp_path / "model",
                          "--", "--train_steps", 100_000_000, "--marker", tmp_path / "never.json")
    ports = launcher_ports(launcher)
    # Training: the chief holds a connection to the ps (its session) for some seconds.
    poll(lambda: len(cluster_pids(ports)) == 3, 60, "the script's three processes", launcher)
    # The script's own servers, under tfps.task.net.script_guard, listen on 127.0.0.1 only
    # (issue 36 item 2): every port of the cluster is up, and none on another address.
    poll(lambda: {p for _, p in _listening(ports)} >= set(ports), 60, "the script's servers", launcher)
    time.sleep(8)
    assert {a for a, p in _listening(ports) if p in ports} == {"127.0.0.1"}, _listening(ports)
    assert launcher.returncode is None, launcher.tail()
    launcher.signal(signal.SIGINT)
    t0 = time.monotonic()
    assert launcher.wait(60) == 130, launcher.tail()
    assert time.monotonic() - t0 < 15, launcher.tail()
    assert "did not exit on" not in launcher.output(), launcher.tail()
    assert task_exit(launcher, "worker0") == "signal SIGINT", launcher.tail()
    assert_nothing_left(ports, launcher)


def _listening(ports: list[int]) -> list[tuple[str, int]]:
    """(address, port) of every listening socket of the script's processes."""
    from tfps.task.net.listening import listening
    found = []
    for pid in cluster_pids(ports):
        try:
            found.extend(listening(pid))
        except OSError:   # it ended meanwhile
            continue
    return found

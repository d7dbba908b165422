"""The job's whole story: restarts in results.json and the message, stall alerts, progress messages.

Real local clusters and a real webhook (tests/servers.py):

* the task processes of the ps and then of the chief of a sync ``tfps local --restarts 2``
  job (each task under a ``tfps run --restarts`` supervisor) are SIGKILLed: each is started
  again and the job succeeds, with no lost task; results.json and the one final message
  tell both failures, the job's first start and its whole duration; the restarted chief
  joined the ps's live variables and redid no step;
* one worker of an async job is frozen (SIGSTOP) past ``--stall_timeout``: exactly one
  "stalled" message names it, progress messages come before and after, the next message
  says it resumed, and exactly one final message ends the job (``python -m tfps run`` per
  task, the classic flags of ``tfps.cluster.local_plan``).
"""

from __future__ import annotations

import datetime as dt
import os
import re
import signal

import pytest
from integration_helpers import (
    Proc,
    Processes,
    _stat,
    assert_nothing_left,
    base_env,
    cluster_pids,
    launcher_ports,
    pids_with_cmdline,
    poll,
    read_results,
    run_flags,
)

pytestmark = pytest.mark.integration

PACED_MODEL = "tests.fixtures.paced_model:model_fn"
#: Steps of the ps-then-chief job: a checkpoint at 50, the ps killed, 20 steps past its
#: recovery, the chief killed, and a few hundred paced steps after it joined.
STORY_STEPS = 400


def start_cluster(procs: Processes, model_dir, *extra, steps: int, env: dict[str, dict[str, str]]):
    from tfps.cluster import local_plan
    plan = local_plan(1, 2)
    tasks: dict[str, Proc] = {}
    for t in plan.tasks:
        tasks[t.name] = procs.tfps(t.name, "run", *plan.task_ref(t).to_flags(),
                                   *run_flags(model_dir, "--log_steps", 10, *extra, steps=steps),
                                   env=base_env(**env.get(t.name, {})))
    return tasks, [t.port for t in plan.tasks]


def progress(proc: Proc, since: int = 0) -> list[int]:
    import faults
    return faults.progress_steps(proc.output()[since:])


def _task_process(ports: list[int], flags: str) -> int:
    """The task process (not its ``--restarts`` supervisor) of the task with ``flags`` in a
    ``tfps local`` job: the one of the two processes with those flags whose parent is the other."""
    pids = poll(lambda: (lambda found: found if len(found) == 2 else None)(
        [p for p in pids_with_cmdline(flags) if p in cluster_pids(ports)]), 30, f"the task process of {flags}")
    children = [p for p in pids if (_stat(p) or ("", 0, 0))[1] in pids]
    assert len(children) == 1, pids
    return children[0]


def test_ps_then_chief_killed_the_story_tells_both(procs, tmp_path, webhook_server):
    """Under ``tfps local --restarts``: the launcher gives every task a supervisor, which starts
    the killed task process again; the job is not a lost-task failure."""
    model_dir = tmp_path / "model"
    # The steps are paced (0.02 s): the job outlasts both kills and restarts, however fast an
    # unpaced step is (a sync job makes no step while its ps or its chief is away: only the
    # steps between the kills count).
    launcher = procs.tfps("tfps-local-story", "local", "--restarts", 2, "--sync_replicas",
                          *run_flags(model_dir, "--log_steps", 10, "--checkpoint_steps", 50, "--sync_timeout", 300,
                                     "--model", PACED_MODEL, steps=STORY_STEPS),
                          env=base_env(APPRISE_URLS=webhook_server.url(), TFPS_TEST_STEP_SECS="0.02"))
    ports = launcher_ports(launcher)

    def chief_lines(pattern: str) -> list:
        return launcher.lines(r"^\[worker0\] .*" + pattern)

    # 1. The ps, once a checkpoint exists: the chief repopulates the restarted ps from it.
    # (A run is several steps: the checkpoint of --checkpoint_steps 50 is that of the first
    # run to end at step 50 or after.)
    poll(lambda: [p for p in model_dir.glob("model.ckpt-*.index") if int(p.name.split("-")[1].split(".")[0]) >= 50],
         300, "the first checkpoint", launcher)
    os.kill(_task_process(ports, "--job_name=ps --task_index=0"), signal.SIGKILL)
    lost = poll(lambda: chief_lines(r"chief: ps0 lost its variables; training resumed from step (\d+)"), 300,
                "the chief's recovery from the lost ps", launcher)
    ps_resumed = int(lost[0].group(1))
    assert ps_resumed >= 50

    # 2. The chief, a few steps later: it joins the live variables of the surviving ps.
    at = len(launcher.output())
    poll(lambda: [s for s in progress(launcher, at) if s >= ps_resumed + 20], 300, "progress after the ps came back",
         launcher)
    chief_task = _task_process(ports, "--job_name=worker --task_index=0")
    killed_at = max(progress(launcher))
    os.kill(chief_task, signal.SIGKILL)
    joined = poll(lambda: chief_lines(r"joined the live variables on the ps at step (\d+)"), 300,
                  "the restarted chief joining the ps", launcher)
    assert int(joined[0].group(1)) >= killed_at   # nothing rolled back

    assert launcher.wait(300) == 0, launcher.tail()
    assert chief_lines(r"the task process was killed by SIGKILL; starting it again \(1/2\)"), launcher.tail()

    res = read_results(model_dir)
    assert res["status"] == "succeeded", res.get("error")
    assert res["export_complete"] is True and res["global_step"] >= STORY_STEPS
    restarts = res["restarts"]
    assert [r["task"] for r in restarts] == ["ps0", "worker0"], restarts
    # The ps's supervisor saw it die (its ledger, tfps.task.monitor.board): the cause is the signal.
    assert restarts[0]["resumed_from"] == ps_resumed and restarts[0]["cause"] == "killed by SIGKILL", restarts[0]
    assert restarts[0]["how"] == "restored", restarts[0]
    assert restarts[1]["cause"] == "killed by SIGKILL"
    assert restarts[1]["how"] == "joined" and restarts[1]["steps_redone"] == 0, restarts[1]
    assert restarts[1]["resumed_from"] >= killed_at
    # The whole job: from the first chief's start, not the last attempt's.
    started = dt.datetime.fromisoformat(res["started_at"])
    attempt = dt.datetime.fromisoformat(res["attempt_started_at"])
    ended = dt.datetime.fromisoformat(res["ended_at"])
    assert started < attempt, (res["started_at"], res["attempt_started_at"])
    assert abs(res["duration_s"] - (ended - started).total_seconds()) <= 1.5, res["duration_s"]
    assert set(res["workers"]) == {"worker0", "worker1"}
    assert all(w["steps"] > 0 for w in res["workers"].values()), res["workers"]
    assert not res.get("lost_tasks"), res.get("lost_tasks")

    # One message, and it tells the story.
    messages = webhook_server.bodies()
    assert len(messages) == 1, [m.get("title") for m in messages]
    title, body = messages[0]["title"], messages[0]["message"]
    assert "succeeded" in title, title
    assert "Recovered from 2 failures:" in body, body
    assert "- ps0, killed by SIGKILL" in body and "- worker0, killed by SIGKILL" in body, body
    assert "0 step(s) redone" in body, body
    assert_nothing_left(ports, launcher)


def test_frozen_worker_gets_one_stalled_message(procs, tmp_path, webhook_server):
    model_dir = tmp_path / "model"
    # The chief's steps are paced so that the job outlasts the freeze (worker1 trains faster
    # until it is frozen, then the chief alone goes on); worker1's a little too, so that it
    # has not trained every step before the first progress message.
    tasks, ports = start_cluster(procs, model_dir, "--model", PACED_MODEL, "--stall_timeout", 8,
                                 "--notify_every", 2, steps=2000,
                                 env={"worker0": {"APPRISE_URLS": webhook_server.url(),
                                                  "TFPS_TEST_STEP_SECS": "0.08"},
                                      "worker1": {"TFPS_TEST_STEP_SECS": "0.004"}})
    chief, worker1 = tasks["worker0"], tasks["worker1"]
    everyone = list(tasks.values())

    def titles() -> list[str]:
        return [str(m.get("title")) for m in webhook_server.bodies()]

    poll(lambda: progress(worker1), 300, "worker1's progress", *everyone)
    poll(lambda: any("progress" in t for t in titles()), 120, "a progress message", *everyone)
    worker1.signal(signal.SIGSTOP)
    try:
        poll(lambda: any("stalled" in t for t in titles()), 120, "the stalled message", chief)
        n_stalled = len(titles())
        # Frozen for a while longer: still one stalled message.
        poll(lambda: sum("progress" in t for t in titles()[n_stalled:]) >= 2, 60,
                   "progress messages during the stall", chief)
    finally:
        worker1.signal(signal.SIGCONT)
    for p in everyone:
        assert p.wait(300) == 0, f"{p.name}:\n{p.tail()}"

    messages = webhook_server.bodies()
    kinds = [("stalled" if "stalled" in m["title"] else "progress" if "progress" in m["title"] else
              "final" if "succeeded" in m["title"] else m["title"]) for m in messages]
    assert kinds.count("stalled") == 1, kinds
    assert kinds.count("final") == 1 and kinds[-1] == "final", kinds
    i = kinds.index("stalled")
    assert "progress" in kinds[:i] and "progress" in kinds[i + 1:], kinds
    stalled = messages[i]
    assert "worker1" in stalled["title"] and "worker0" not in stalled["title"], stalled["title"]
    assert "- worker1: last at global step" in stalled["message"], stalled["message"]
    # The first message after worker1 trained again says so.
    after = [m for m in messages[i + 1:] if "Progress resumed:" in m["message"]]
    assert after and "worker1 resumed at step" in after[0]["message"], [m["message"] for m in messages[i + 1:]]
    progress_bodies = [m["message"] for m, k in zip(messages, kinds) if k == "progress"]
    assert all("ETA" in b or "examples/s" in b for b in progress_bodies), progress_bodies[:1]
    # The job's progressive validation (a model_fn of 3 classes: log loss and accuracy), as it
    # trains and at the end.
    assert any(re.search(r"^progressive +log_loss \d\.\d+ accuracy \d\.\d+ over", b, re.M)
               for b in progress_bodies), progress_bodies[-1:]
    assert re.search(r"^progressive +log_loss ", messages[-1]["message"], re.M), messages[-1]["message"]

    res = read_results(model_dir)
    assert res["status"] == "succeeded" and res["restarts"] == []
    assert [s["task"] for s in res["stalls"]] == ["worker1"], res["stalls"]
    assert res["stalls"][0].get("resumed_at"), res["stalls"]
    assert_nothing_left(ports, *everyone)

"""The Ansible role's conventions: one variable list, tags that select phases, no leaks."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from tfps.cluster.variables import markdown_table

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "ansible" / "roles" / "tfps"


def test_docs_list_exactly_the_variables_of_argument_specs():
    """docs/ansible.md's table is generated from meta/argument_specs.yml and defaults/main.yml."""
    text = (REPO / "docs" / "ansible.md").read_text()
    block = re.search(r"<!-- variables:begin -->\n(.*?)<!-- variables:end -->", text, re.S)
    assert block, "docs/ansible.md has no variables block"
    assert block.group(1) == markdown_table(), "regenerate it: python -m tfps.cluster.variables"
    specs = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    listed = re.findall(r"^\| `(tfps_\w+)` \|", block.group(1), re.M)
    assert listed == list(specs)


#: Task keywords that are not sent to the module, nor shown in its result.
_KEYWORDS = {"name", "when", "register", "no_log", "changed_when", "failed_when", "run_once", "delegate_to",
             "become", "tags", "loop_control", "diff", "block", "rescue", "always"}


def _tasks(node):
    """Every task dict of a task file, blocks included."""
    for task in node or []:
        yield task
        for key in ("block", "rescue", "always"):
            yield from _tasks(task.get(key))


def test_every_task_whose_result_can_hold_the_chief_environment_does_not_log():
    """docker_container, docker_container_info and the role's tfps_containers return the
    container's Config.Env, where the chief's APPRISE_URLS live: their results must never reach
    the output (-v included)."""
    leaking, registered = [], set()
    files = {path.name: list(_tasks(yaml.safe_load(path.read_text())))
             for path in sorted((ROLE / "tasks").glob("*.yml"))}
    for name, tasks in files.items():
        for task in tasks:
            module = next((k for k in task if k.startswith("community.docker.docker_container")
                           or k == "tfps_containers"), None)
            if module:
                registered.add(task.get("register"))
                if task.get("no_log") is not True:
                    leaking.append(f"{name}: {task['name']}")
    registered.discard(None)
    assert {"tfps_container_info", "tfps_final_info"} <= registered
    # A fact or a loop made of such a result shows it at -v just the same (user env, such as
    # credentials given in tfps_env, is there too), unless it keeps only the plan's tasks.
    for name, tasks in files.items():
        for task in tasks:
            copies = json.dumps({k: v for k, v in task.items() if k in ("ansible.builtin.set_fact", "loop")})
            if (any(re.search(rf"\b{r}\b", copies) and not re.search(rf"\b{r}\b[^}}]*map\(attribute='item'\)", copies)
                    for r in registered) and task.get("no_log") is not True):
                leaking.append(f"{name}: {task['name']}")
    assert leaking == []


def test_every_task_that_handles_the_urls_does_not_log():
    """A task whose arguments (or vars, environment) hold tfps_notify_urls shows them in its
    result or at -vvv, unless it has no_log."""
    handling, leaking = [], []
    for path in sorted((ROLE / "tasks").glob("*.yml")):
        for task in _tasks(yaml.safe_load(path.read_text())):
            if re.search(r"\btfps_notify_urls\b", yaml.safe_dump({k: v for k, v in task.items() if k not in _KEYWORDS})):
                handling.append(task["name"])
                if task.get("no_log") is not True:
                    leaking.append(f"{path.name}: {task['name']}")
    assert "Write the notification URLs to the chief's host" in handling
    assert leaking == []


def test_the_roles_settle_timeout_is_tfps_locals():
    """One fact, two homes that cannot hold Python: the role's default and tfps local's."""
    from tfps import timeouts
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    assert defaults["tfps_settle_timeout"] == timeouts.SETTLE_SECS


def test_the_role_takes_names_and_paths_from_the_plan():
    """Container names and the paths inside the containers are facts of the plan's JSON
    (tfps.cluster.plan, tfps.notify.urls), never written again in the role."""
    from tfps.cluster.plan import DATA_MOUNT, NOTIFY_CONFIG_MOUNT, USER_MODEL_MOUNT, Launch, container_name
    from tfps.cluster.single_host import local_plan
    from tfps.cluster.variables import launch_from_vars
    from tfps.notify.urls import ENV_URLS_FILE, URLS_FILE_MOUNT
    files = [*sorted(ROLE.glob("tasks/*.yml")), ROLE / "vars" / "main.yml", *sorted(ROLE.glob("filter_plugins/*.py"))]
    for path in files:
        code = [line for line in path.read_text().splitlines() if not line.lstrip().startswith("#")]
        for line in code:
            for fact in (USER_MODEL_MOUNT, NOTIFY_CONFIG_MOUNT, URLS_FILE_MOUNT, ENV_URLS_FILE, f"'{DATA_MOUNT}"):
                assert fact not in line, f"{path.relative_to(REPO)}: {line.strip()}"
            assert "-tensorboard" not in line and "tfps-%s" not in line, f"{path.relative_to(REPO)}: {line.strip()}"
    _, launch = launch_from_vars({"tfps_job_name": "train"})
    job = local_plan(1, 1, ports=[2222, 2223]).to_json(launch)["job"]
    assert job["tensorboard_container"] == container_name("train", "tensorboard") == "tfps-train-tensorboard"
    assert (job["user_model_mount"], job["data_mount"], job["notify_config_mount"], job["notify_urls_mount"],
            job["notify_urls_env"]) == (USER_MODEL_MOUNT, DATA_MOUNT, NOTIFY_CONFIG_MOUNT, URLS_FILE_MOUNT,
                                        ENV_URLS_FILE)
    assert isinstance(launch, Launch)


def test_the_images_tensorboard_pin_is_the_projects():
    """TensorBoard is pinned where TensorFlow is installed (the image's TF layer), as in pyproject.toml."""
    import tomllib
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    pin = next(d for d in deps if re.match(r"tensorboard\b", d))
    assert f'ARG TENSORBOARD_PACKAGE="{pin}"' in (REPO / "Dockerfile").read_text()


def test_the_roles_final_save_timeout_is_tfps_own_default():
    """The role's default cannot import Python: kept equal to tfps.timeouts by this test."""
    from tfps import timeouts
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    assert defaults["tfps_final_save_timeout"] == timeouts.DEFAULT_FINAL_SAVE_TIMEOUT


def test_a_refused_container_shows_dockers_reason_with_the_secrets_masked():
    """The start task keeps no_log; what the play shows of a refusal is Docker's message,
    with every value of tfps_env and the notification URLs masked."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("tfps_start", ROLE / "filter_plugins" / "tfps_start.py")
    start = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(start)
    started = {"results": [
        {"item": {"container": "tfps-x-ps0"}, "failed": True, "changed": False,
         "msg": "Error creating container: 400 Client Error: Bad Request (\"invalid env TOKEN=s3cr3t-value\n"
                "for https://hooks.example/abc\")"},
        {"item": {"container": "tfps-x-worker0"}, "changed": True},
        {"item": {"container": "tfps-x-worker1"}, "skipped": True},
    ]}
    secrets = [{"TOKEN": "s3cr3t-value", "ON": "1"}, ["https://hooks.example/abc"]]
    lines = start.tfps_refused(started, "host1", secrets)
    assert lines == ["host1: Docker did not start tfps-x-ps0: Error creating container: 400 Client Error: Bad Request "
                     "(\"invalid env TOKEN=<hidden> for <hidden>\")"]
    # Everything the task touched goes again (one Docker created but could not start, too).
    assert start.tfps_attempted(started) == ["tfps-x-ps0", "tfps-x-worker0"]
    assert start.tfps_refused({"skipped": True}, "host2") == [] and start.tfps_attempted({}) == []


def test_a_changed_setting_is_named_with_its_old_and_new_value():
    """settings.yml compares the settings recorded on a job's containers (label tfps.settings)
    with the deploy's: each change is one 'setting: old -> new'."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("tfps_start", ROLE / "filter_plugins" / "tfps_start.py")
    start = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(start)
    from tfps.cluster.single_host import local_plan
    from tfps.cluster.variables import launch_from_vars

    def settings(**variables):
        _, launch = launch_from_vars({"tfps_job_name": "train", **variables})
        return {**local_plan(1, 2, ports=[2222, 2223, 2224]).to_json(launch)["job"]["settings"], "tfps_image": "tfps:1"}
    old = settings(tfps_train_steps=300)
    label = start.tfps_settings_label(old)
    hostvars = {"host1": {"tfps_containers": {"ps0": {"Config": {"Labels": {"tfps.settings": label}}}}},
                "host2": {"tfps_containers": {"worker0": None}}}
    recorded = start.tfps_recorded_settings(hostvars, ["host1", "host2"])
    assert recorded == old
    # INI inventories give strings: "300" is the same setting as 300.
    assert start.tfps_settings_changes(recorded, settings(tfps_train_steps="300")) == []
    assert start.tfps_settings_changes(recorded, settings(tfps_train_steps=600, tfps_batch_size=128)) == [
        "tfps_batch_size: 64 -> 128", "tfps_train_steps: 300 -> 600"]
    assert start.tfps_settings_changes(recorded, {**old, "layout": "ps0@a:1"})[0].startswith('layout: "ps0@')
    # A new job, or containers that record nothing: nothing to compare.
    assert start.tfps_recorded_settings({"host1": {"tfps_containers": {"ps0": None}}}, ["host1"]) is None
    assert start.tfps_settings_changes(None, old) == []
    # A job whose containers were removed after it ended: the record on the chief's host
    # (a slurp of tfps_settings_record) counts; a host without one (a failed slurp) does not.
    import base64
    import json
    slurped = {"content": base64.b64encode(json.dumps(old).encode()).decode()}
    gone = {"host1": {"tfps_containers": {"ps0": None}}}
    assert start.tfps_recorded_settings(gone, ["host1"], slurped) == old
    assert start.tfps_recorded_settings(gone, ["host1"], {"failed": False, "msg": "file not found"}) is None
    # Moving a job to other ports does not change it: the layout names tasks and hosts only.
    assert "2222" not in old["layout"] and "ps0@" in old["layout"]


def test_a_task_that_outlives_an_unreachable_host_does_not_end_the_play():
    """deploy.yml has any_errors_fatal: a task with ignore_unreachable (so that the check phase
    can report the host with the others) must also turn any_errors_fatal off, itself or in
    its block, or an unreachable host ends the play there, without the check's message."""
    def walk(tasks, fatal_off, where):
        for task in tasks or []:
            off = fatal_off or task.get("any_errors_fatal") is False
            if task.get("ignore_unreachable"):
                yield where, task.get("name"), off
            for key in ("block", "rescue", "always"):
                yield from walk(task.get(key), off, where)
    found = [hit for path in sorted((ROLE / "tasks").glob("*.yml"))
             for hit in walk(yaml.safe_load(path.read_text()), False, path.name)]
    assert {where for where, _, _ in found} >= {"plan.yml", "check.yml"}, found
    assert [hit for hit in found if not hit[2]] == []

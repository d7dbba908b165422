"""A job knows its settings: what defines it, the record in model_dir, and a start that would change it
(``tfps.cluster.settings``: tfps local, the chief of every launcher, and the role's settings check)."""

from __future__ import annotations

import json

import pytest
import yaml

from tfps import cli
from tfps.cluster import settings
from tfps.cluster.variables import DEFINING_VARS, OMITTED_VARS, RUN_FIELDS
from tfps.config import RunConfig
from tfps.errors import ConfigError


def defined(num_ps: int = 1, num_workers: int = 2, **fields) -> dict:
    return settings.job_settings(RunConfig(**{"train_steps": 20, **fields}), num_ps, num_workers)


def refusal(model_dir, current: dict, replace: bool = False) -> str:
    with pytest.raises(ConfigError) as info:
        settings.check(str(model_dir), current, replace)
    assert info.value.field == "model_dir"
    return str(info.value)


def test_what_defines_a_job_follows_the_roles_defining_variables_and_adds_the_layout():
    job = defined(model="mlp", batch_size=32, learning_rate=0.1, optimizer="sgd")
    for var in DEFINING_VARS:
        if var in RUN_FIELDS and var != "tfps_model_dir" and var not in OMITTED_VARS:
            assert RUN_FIELDS[var] in job, var
    assert job["train_steps"] == 20 and job["batch_size"] == 32 and job["learning_rate"] == 0.1
    assert job["optimizer"] == "sgd" and job["sync_replicas"] is False and job["hidden_units"] == "64,32"
    assert (job["ps"], job["workers"]) == (1, 2)
    # Where the job lives, its name, cadences, timeouts and notifications may change between starts.
    for name in ("model_dir", "export_dir", "run_name", "log_steps", "summary_steps", "checkpoint_steps",
                 "final_save_timeout", "sync_timeout", "startup_timeout", "notify", "notify_every",
                 "stall_timeout", "tf_threads"):
        assert name not in job, name
    # The tables' shapes count for the model that has them only.
    assert "hash_buckets" not in job and defined(model="wide_deep")["hash_buckets"] == 1 << 20
    # A hashed table records no embedding settings, as before tfps had them; a dynamic one does.
    assert not set(settings.OMITTED_AT_DEFAULT) & set(defined(model="wide_deep"))
    dynamic = defined(model="wide_deep", embedding="dynamic", min_count=2, steps_to_live=500, expected_ids=10)
    assert (dynamic["embedding"], dynamic["min_count"], dynamic["steps_to_live"]) == ("dynamic", 2, 500)
    assert "expected_ids" not in dynamic   # a hint for the memory plan, free to change
    # JSON values: what the record holds reads back equal.
    with_args = defined(model="m:f", model_args={"units": 4})
    assert json.loads(json.dumps(with_args)) == with_args


def test_each_change_is_named_with_its_old_and_new_value():
    old = defined()
    assert settings.changes(None, old) == [] and settings.changes(old, defined(log_steps=5)) == []
    assert settings.changes(old, defined(train_steps=40, batch_size=32)) == [
        "batch_size: 64 -> 32", "train_steps: 20 -> 40"]
    assert settings.changes(old, defined(2, 3)) == ["ps: 1 -> 2", "workers: 2 -> 3"]
    assert settings.changes(old, defined(learning_rate=0.5)) == ["learning_rate: null -> 0.5"]


def test_the_roles_settings_check_makes_the_same_comparison():
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[2] / "ansible" / "roles" / "tfps" / "filter_plugins" / "tfps_start.py"
    spec = importlib.util.spec_from_file_location("tfps_start", path)
    start = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(start)
    old, new = {"tfps_train_steps": 300, "layout": "ps0@a:1"}, {"tfps_train_steps": 600, "layout": "ps0@a:1"}
    assert start.tfps_settings_changes(old, new) == settings.changes(old, new) == ["tfps_train_steps: 300 -> 600"]


def test_a_new_model_dir_or_one_without_a_record_is_accepted_and_recorded(tmp_path):
    model_dir = tmp_path / "model"
    assert settings.check(str(model_dir), defined()) == []
    assert not model_dir.exists()                       # checking writes nothing
    model_dir.mkdir()
    (model_dir / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-20"\n')   # an older tfps's job
    assert settings.check(str(model_dir), defined(train_steps=40)) == []
    settings.record(str(model_dir), defined(train_steps=40))
    assert settings.recorded(str(model_dir)) == defined(train_steps=40)
    assert json.loads((model_dir / settings.SETTINGS_FILE).read_text())["settings"]["train_steps"] == 40
    assert settings.check(str(model_dir), defined(train_steps=40, log_steps=7)) == []


def test_other_settings_are_refused_with_each_change_and_the_ways_on_unless_replace(tmp_path):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    settings.record(str(model_dir), defined())
    before = (model_dir / settings.SETTINGS_FILE).read_text()
    text = refusal(model_dir, defined(1, 3, train_steps=40))
    assert text.startswith(f"model_dir: {model_dir} holds a job with other settings, so it was left as it is: "
                           "train_steps: 20 -> 40; workers: 2 -> 3. Three ways on: give another --model_dir; "
                           f"or delete or move {model_dir}"), text
    assert "add --replace" in text and "more train_steps continue its training" in text
    assert (model_dir / settings.SETTINGS_FILE).read_text() == before
    # --replace: the changes, to go on with; the chief then records the new settings.
    assert settings.check(str(model_dir), defined(train_steps=40), replace=True) == ["train_steps: 20 -> 40"]
    settings.record(str(model_dir), defined(train_steps=40))
    assert settings.check(str(model_dir), defined(train_steps=40)) == []


def test_another_number_of_ps_tasks_goes_on_from_the_checkpoint_without_replace(tmp_path, caplog):
    """The checkpoint holds each partitioned variable whole: a job saved from 2 ps tasks goes
    on with 3 (tests/integration/test_resharding.py); with other changes, --replace still."""
    import logging
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    settings.record(str(model_dir), defined(2, 2, model="wide_deep"))
    with caplog.at_level(logging.INFO, logger="tfps"):
        assert settings.check(str(model_dir), defined(3, 2, model="wide_deep")) == []
    assert "saved from 2 ps task(s) and goes on with 3" in caplog.text and "split again over the 3" in caplog.text
    text = refusal(model_dir, defined(3, 2, model="wide_deep", train_steps=40))
    assert "ps: 2 -> 3; train_steps: 20 -> 40" in text and "add --replace" in text
    assert settings.check(str(model_dir), defined(3, 2, model="wide_deep", train_steps=40), replace=True) == [
        "ps: 2 -> 3", "train_steps: 20 -> 40"]
    # Another number of workers is still another job's layout (sync steps, data shards).
    assert "workers: 2 -> 3" in refusal(model_dir, defined(2, 3, model="wide_deep"))


def test_another_model_is_refused_even_with_replace(tmp_path):
    """Its checkpoint would not fit (the run identity refuses it later too): no --replace offered."""
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    settings.record(str(model_dir), defined())
    for changed in (defined(model="linear"), defined(hidden_units="8"), defined(model_args={"units": 3})):
        text = refusal(model_dir, changed, replace=True)
        assert "holds a job of another model" in text and "not even with --replace" in text, text
        assert "add --replace" not in text


def test_a_hashed_table_that_becomes_dynamic_is_another_model(tmp_path):
    """Its checkpoint holds bucket rows, not id rows: refused even with --replace; the dynamic
    table's options may change with --replace (its rows stay what they are)."""
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    settings.record(str(model_dir), defined(model="wide_deep"))
    text = refusal(model_dir, defined(model="wide_deep", embedding="dynamic"), replace=True)
    assert 'embedding: null -> "dynamic"' in text and "not even with --replace" in text, text
    settings.record(str(model_dir), defined(model="wide_deep", embedding="dynamic"))
    assert settings.check(str(model_dir), defined(model="wide_deep", embedding="dynamic", steps_to_live=100),
                          replace=True) == ["steps_to_live: null -> 100"]


def test_tfps_local_refuses_replace_with_a_script(tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text("")
    assert cli.main(["local", "--script", str(script), "--replace"]) == 2
    assert "replace: concerns the model_dir of tfps's own tasks only" in capsys.readouterr().err


def test_compose_replace_goes_into_the_chiefs_command_and_the_header():
    def parse(*argv):
        return cli.build_parser().parse_args(cli.normalize_argv(["compose", *argv]))
    from tfps.launch import compose
    plain = compose.render(parse("--train_steps", "50"))
    assert "--replace" not in plain
    text = compose.render(parse("--train_steps", "50", "--replace"))
    assert "# Generated by `tfps compose --ps 1 --workers 2 --replace --train_steps=50`." in text
    command = yaml.safe_load(text)["x-tfps-task"]["command"]
    assert "--replace" in command
    ns = cli.build_parser().parse_args(command)   # a `tfps run` option
    assert ns.command == "run" and ns.replace is True


def test_the_roles_chief_records_without_refusing_and_its_failure_message_takes_the_options():
    """The role compares a deploy with its containers' labels before it starts them (settings.yml),
    so its tasks run with --replace; notify-failure takes the same options."""
    from tfps.cluster.variables import DEFAULTS, launch_from_vars
    _, launch = launch_from_vars({**yaml.safe_load(DEFAULTS.read_text()), "tfps_train_steps": 77})
    assert "--replace" in launch.run_args
    ns = cli.build_parser().parse_args(["notify-failure", "--reason", "x", *launch.run_args])
    assert ns.train_steps == 77


def test_the_roles_dynamic_table_variables_become_run_flags_and_define_the_job():
    from tfps.cluster.variables import launch_from_vars
    _, launch = launch_from_vars({"tfps_model": "wide_deep", "tfps_embedding": "dynamic", "tfps_min_count": "2",
                                  "tfps_steps_to_live": 500, "tfps_expected_ids": 1000})
    for arg in ("--embedding=dynamic", "--min_count=2", "--steps_to_live=500", "--expected_ids=1000"):
        assert arg in launch.run_args
    assert launch.extra["settings"]["tfps_steps_to_live"] == 500
    # At their defaults (a hashed table) they are neither flags nor recorded: older labels compare equal.
    _, hashed = launch_from_vars({"tfps_model": "wide_deep", "tfps_embedding": "hashed", "tfps_min_count": 1,
                                  "tfps_steps_to_live": 0, "tfps_expected_ids": 0})
    assert not any("embedding" in a or "count" in a or "live" in a for a in hashed.run_args)
    assert not set(hashed.extra["settings"]) & {"tfps_embedding", "tfps_min_count", "tfps_steps_to_live"}
    with pytest.raises(ConfigError) as info:
        launch_from_vars({"tfps_model": "mlp", "tfps_embedding": "dynamic"})
    assert info.value.field == "tfps_embedding" and "has no id tables" in str(info.value)

"""--export_every's versions (tfps.task.output.versions): numbering, placement, pruning, metadata, failures.

The writer is a stand-in that writes the files of a SavedModel (the real one is exercised by
tests/integration/test_export_versions_job.py); everything else is the real code on real directories.
"""

from __future__ import annotations

import json
import os

import pytest

from tfps.cluster.variables import launch_from_vars
from tfps.config import RunConfig, parse_every
from tfps.errors import ConfigError
from tfps.outcome import results
from tfps.task.output import versions as V


def fake_write(fail=None):
    """A writer as tfps.task.output.export.write_version's: a SavedModel's files and the marker last."""
    calls = []

    def write(checkpoint, dest, step, extra, threads=None):
        calls.append((checkpoint, dest, step, threads))
        if fail is not None and fail():
            os.makedirs(os.path.join(dest, "variables"), exist_ok=True)   # half written, then it fails
            raise OSError(28, "No space left on device")
        os.makedirs(os.path.join(dest, "variables"))
        for name in ("saved_model.pb", "variables/variables.index", "variables/variables.data-00000-of-00001"):
            with open(os.path.join(dest, name), "w") as fh:
                fh.write("x")
        with open(os.path.join(dest, results.EXPORT_MARKER), "w") as fh:
            json.dump({**extra, "global_step": step, "checkpoint": checkpoint, "completed_at": "now"}, fh)
    write.calls = calls
    return write


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def make(tmp_path, cadence=("steps", 100), keep=None, write=None, clock=None, on_failing=None):
    model_dir = tmp_path / "model"
    model_dir.mkdir(exist_ok=True)
    return V.Versions(write or fake_write(), str(tmp_path / "base"), cadence, keep, str(model_dir),
                      on_failing=on_failing, clock=clock or Clock())


# ------------------------------------------------------------------ the flag
@pytest.mark.parametrize("text,expected", [("90s", ("secs", 90.0)), ("10m", ("secs", 600.0)),
                                           ("2h", ("secs", 7200.0)), ("1.5m", ("secs", 90.0)),
                                           ("500", ("steps", 500)), (500, ("steps", 500))])
def test_export_every_reads_durations_and_steps(text, expected):
    assert parse_every(text, "export_every") == expected


@pytest.mark.parametrize("text", ["0", "0s", "10x", "-5", "m", "", "1e3", "10 minutes", str(2**63), True])
def test_export_every_refuses_anything_else_in_one_line(text):
    with pytest.raises(ConfigError) as e:
        RunConfig(export_every=text).validate()
    assert e.value.field == "export_every" and "90s, 10m or 2h" in e.value.message
    assert "\n" not in e.value.message


def test_keep_exports_needs_export_every_and_a_positive_count():
    with pytest.raises(ConfigError, match="add --export_every") as e:
        RunConfig(keep_exports=3).validate()
    assert e.value.field == "keep_exports"
    with pytest.raises(ConfigError) as e:
        RunConfig(export_every="10m", keep_exports=0).validate()
    assert e.value.field == "keep_exports"
    assert RunConfig(export_every="10m", keep_exports=3).validate().to_args() == ["--export_every=10m",
                                                                                    "--keep_exports=3"]


def test_the_role_variables_reach_the_run_flags():
    _, launch = launch_from_vars({"tfps_export_every": "10m", "tfps_keep_exports": "4"})
    assert "--export_every=10m" in launch.run_args and "--keep_exports=4" in launch.run_args
    _, launch = launch_from_vars({"tfps_export_every": 500})   # an INI or YAML integer: steps
    assert "--export_every=500" in launch.run_args
    with pytest.raises(ConfigError) as e:
        launch_from_vars({"tfps_export_every": "often"})
    assert e.value.field == "tfps_export_every"


# ------------------------------------------------------------------ numbering and placement
def test_a_version_is_its_step_unless_a_higher_one_exists(tmp_path):
    base = tmp_path / "base"
    assert V.next_version(str(base), 300) == 300   # no base path yet
    base.mkdir()
    for name in ("200", ".tmp-900", "notes", "1000x"):
        (base / name).mkdir()
    (base / "5000").write_text("a file is not a version")
    assert V.versions(str(base)) == [200]
    assert V.next_version(str(base), 300) == 300
    assert V.next_version(str(base), 150) == 201   # a chief restarted from an older checkpoint: never reused
    assert V.next_version(str(base), 200) == 201


def test_a_version_appears_whole_in_one_rename(tmp_path):
    base = tmp_path / "base"
    tmp = base / ".tmp-7"
    (tmp / "variables").mkdir(parents=True)
    (tmp / "saved_model.pb").write_text("x")
    assert V.versions(str(base)) == []   # the hidden name is not a version
    assert not V.TMP_PREFIX.lstrip(".")[:1].isdigit()
    path = V.place(str(tmp), str(base), 7)
    assert path == str(base / "7") and (base / "7" / "saved_model.pb").is_file() and not tmp.exists()
    (tmp / "variables").mkdir(parents=True)
    with pytest.raises(FileExistsError):   # a version is never replaced
        V.place(str(tmp), str(base), 7)


def test_keep_removes_the_oldest_beyond_k(tmp_path):
    base = tmp_path / "base"
    for v in (10, 20, 30, 40):
        (base / str(v) / "variables").mkdir(parents=True)
    assert V.prune(str(base), None) == []
    assert V.prune(str(base), 2) == [10, 20]
    assert sorted(os.listdir(base)) == ["30", "40"]   # nothing hidden left behind either


def test_the_metadata_is_built_in_one_place_from_its_providers():
    meta = V.metadata(12, 10, "/m/model.ckpt-10", providers={})
    assert meta["version"] == 12 and meta["global_step"] == 10 and meta["checkpoint"] == "/m/model.ckpt-10"
    assert meta["position"] is None and meta["progressive_auc"] is None and meta["exported_at"]

    def broken():
        raise RuntimeError("no stream")
    meta = V.metadata(12, 10, "c", providers={"position": lambda: "dt=2026-12-07/hour=21", "progressive_auc": broken})
    assert meta["position"] == "dt=2026-12-07/hour=21" and meta["progressive_auc"] is None
    V.set_provider("progressive_auc", lambda: 0.81)
    try:
        assert V.metadata(1, 1, "c")["progressive_auc"] == 0.81
    finally:
        V.set_provider("progressive_auc", None)
    assert "progressive_auc" not in V.PROVIDERS


# ------------------------------------------------------------------ the listener
def test_versions_come_due_by_steps(tmp_path):
    versions = make(tmp_path, ("steps", 100))
    assert not versions.due(99) and versions.due(100)
    path = versions.export(str(tmp_path / "model" / "model.ckpt-100"), 100)
    assert path == str(tmp_path / "base" / "100")
    assert not versions.due(150) and versions.due(200)
    marker = results.read_export_marker(path)
    assert marker["version"] == 100 and marker["global_step"] == 100 and results.export_complete(path)


def test_versions_come_due_by_time_and_export_in_the_background(tmp_path):
    clock = Clock()
    write = fake_write()
    versions = make(tmp_path, ("secs", 60.0), clock=clock, write=write)
    assert not versions.due(5)
    clock.now += 60
    assert versions.due(5)
    versions.after_save(None, 5)   # the checkpoint hook's listener call
    versions._thread.join(10)
    assert V.versions(versions.base) == [5]
    assert write.calls[0][0] == os.path.join(str(tmp_path / "model"), "model.ckpt-5") and write.calls[0][3] == 1
    assert not versions.due(6)   # a full interval again
    versions.after_save(None, 6)
    assert versions._thread.is_alive() is False and V.versions(versions.base) == [5]


def test_failures_are_a_line_each_and_one_message_on_the_third(tmp_path, caplog):
    failing = [True]
    sent = []
    versions = make(tmp_path, write=fake_write(lambda: failing[0]), on_failing=sent.append)
    ckpt = str(tmp_path / "model" / "model.ckpt-100")
    for step in (100, 200, 300, 400):
        versions._background(ckpt, step)
    assert versions.failures == 4 and len(sent) == 1 and "3 versions in a row failed" in sent[0]
    assert len([r for r in caplog.records if "not exported" in r.getMessage()]) == 4
    assert os.listdir(versions.base) == []   # nothing half-written is left
    failing[0] = False
    versions._background(ckpt, 500)
    assert versions.failures == 0 and V.versions(versions.base) == [500]


def test_the_end_writes_one_last_version_once(tmp_path):
    write = fake_write()
    versions = make(tmp_path, write=write)
    ckpt = str(tmp_path / "model" / "model.ckpt-300")
    assert versions.finish(ckpt, 300, wait=1) == str(tmp_path / "base" / "300")
    assert versions.finish(ckpt, 300, wait=1) == str(tmp_path / "base" / "300")   # out already
    assert len(write.calls) == 1


def test_a_restarted_chief_clears_temporaries_and_goes_on_from_its_last_version(tmp_path):
    versions = make(tmp_path)
    model_dir = tmp_path / "model"
    versions.export(os.path.join(str(model_dir), "model.ckpt-300"), 300)
    os.makedirs(os.path.join(versions.base, ".tmp-400", "variables"))   # an export cut by a kill
    again = make(tmp_path)
    assert os.listdir(again.base) == ["300"]
    assert again.last_step == 300 and not again.due(300) and again.due(400)


def test_a_base_path_of_versions_is_a_tfps_export_dir(tmp_path):
    versions = make(tmp_path)
    versions.export(str(tmp_path / "model" / "model.ckpt-100"), 100)
    results.check_export_dir(versions.base, str(tmp_path / "model"))   # no refusal
    (tmp_path / "base" / "200").mkdir()   # an integer directory tfps did not write
    with pytest.raises(ConfigError, match="tfps did not write"):
        results.check_export_dir(versions.base, str(tmp_path / "model"))


def test_the_checkpoint_hook_saves_when_a_version_is_due(tmp_path):
    """The chief's CheckpointSaverHook saves (and tells its listeners) when ``save_when`` says a
    version is due, between its periodic saves; those then count from that save."""
    import tensorflow as tf

    from tfps.task.runtime.hooks import CheckpointSaverHook
    v1 = tf.compat.v1
    saved = []

    class Listener:
        def begin(self):
            pass

        def before_save(self, session, step):
            pass

        def after_save(self, session, step):
            saved.append(int(step))

        def end(self, session, step):
            pass

    with tf.Graph().as_default():
        step = v1.train.get_or_create_global_step()
        v1.get_variable("w", initializer=1.0)
        train = v1.assign_add(step, 1)
        hook = CheckpointSaverHook(str(tmp_path), save_steps=1000, listeners=[Listener()],
                                   save_when=lambda s: s >= 5 and not [x for x in saved if x >= 5])
        with v1.train.MonitoredSession(hooks=[hook]) as sess:
            for _ in range(10):
                sess.run(train)
    assert saved[0] == 1 and 5 <= saved[1] <= 6 and saved[-1] == 10, saved   # first step, due, end
    assert len(saved) == 3, saved
    assert (tmp_path / f"model.ckpt-{saved[1]}.index").is_file()


def test_every_launcher_passes_the_settings_on(tmp_path):
    """--config, tfps compose and tfps slurm hand --export_every and --keep_exports to every task
    (the role: test_the_role_variables_reach_the_run_flags)."""
    import dataclasses

    from tfps import cli, cli_tools
    from tfps.config import from_args
    from tfps.launch import compose, slurm
    job = tmp_path / "job.yaml"
    job.write_text("export_every: 90s\nkeep-exports: 3\n")
    parser = cli.build_parser()
    ns = parser.parse_args(cli_tools.expand_config(["local", "--config", str(job)], parser))
    assert (from_args(ns).export_every, from_args(ns).keep_exports) == ("90s", 3)
    text = compose.render(parser.parse_args(cli.normalize_argv(["compose", "--export-every", "10m",
                                                                 "--keep-exports", "3"])))
    assert text.count("--export_every=10m") >= 2 and text.count("--keep_exports=3") >= 2, text
    ns = parser.parse_args(["slurm", "--export_every", "500", "--keep_exports", "2"])
    argv = slurm.run_argv(ns, {"model_dir": "/shared/m"})
    assert argv[argv.index("--export_every") + 1] == "500" and argv[argv.index("--keep_exports") + 1] == "2"
    from tfps.task import entry
    assert dataclasses.asdict(from_args(entry.build_parser().parse_args(argv)))["export_every"] == "500"


def test_the_failing_exports_message_says_what_failed():
    from tfps.notify import format_message
    title, body = format_message("exports_failing", {"job": "ctr", "status": "running", "global_step": 900,
                                                     "error": "3 versions in a row failed to export into /srv/x"})
    assert title == "[tfps] ⚠ job ctr: versions fail to export at step 900"
    assert "training goes on" in body and "3 versions in a row failed to export into /srv/x" in body, body

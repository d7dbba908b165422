"""Memory you can plan: each ps task's share of the variables, known before any task starts.

``tfps.launch.estimate.estimate_memory`` builds the training graph as a worker does,
without a session; ``tfps.cluster.memory.check_fits_host`` is ``tfps local``'s refusal,
``memory.host_problems`` (through the role's ``tfps_memory_problems`` filter) the play's.
"""

from __future__ import annotations

import base64
import importlib.util
from pathlib import Path

import pytest

from tfps.cluster import memory
from tfps.cluster.memory import MemoryEstimate, host_total_memory
from tfps.cluster.single_host import local_plan
from tfps.cluster.variables import launch_from_vars
from tfps.config import RunConfig
from tfps.errors import ConfigError
from tfps.launch import estimate
from tfps.task.setup import JobSetup

REPO = Path(__file__).resolve().parents[2]
MODEL = "tests.unit.test_memory_plan:table_model"
#: The table of ``table_model``: 2**16 rows x 8 float32 = 2 MiB, above --partition_mb 1.
ROWS, DIM = 2**16, 8
TABLE_MB = ROWS * DIM * 4 / 2**20


def table_model(features, labels, mode, params):
    """One embedding table (``--model_arg rows=N``) looked up by an id made of the first feature."""
    import tensorflow as tf

    from tfps.models import ModelSpec
    v1 = tf.compat.v1
    rows = int(params.model_args.get("rows", ROWS))
    table = v1.get_variable("table", [rows, DIM])
    ids = tf.cast(tf.abs(features[:, 0]) * 1000, tf.int64) % rows
    logits = tf.nn.embedding_lookup(table, ids)[:, :params.num_classes]
    predictions = {"probabilities": tf.nn.softmax(logits)}
    if labels is None:
        return ModelSpec(None, predictions)
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
    return ModelSpec(loss, predictions)


def _cfg(tmp_path, **kwargs) -> RunConfig:
    return RunConfig(model=MODEL, model_dir=str(tmp_path / "model"), **kwargs).validate()


@pytest.mark.parametrize("optimizer,slots", [("sgd", 0), ("adagrad", 1), ("adam", 2), ("ftrl", 2)])
def test_a_table_above_partition_mb_gives_two_equal_shares_with_the_optimizers_slots(tmp_path, optimizer, slots):
    pytest.importorskip("tensorflow")
    est = estimate.estimate_memory(_cfg(tmp_path, partition_mb=1, optimizer=optimizer), num_ps=2)
    assert set(est.shares_mb) == {"ps0", "ps1"}
    half = TABLE_MB / 2 * (1 + slots)
    for share in est.shares_mb.values():
        assert share == pytest.approx(half, abs=0.02), est
    assert est.largest == "table" and est.largest_mb == pytest.approx(TABLE_MB, abs=0.01)
    assert est.export_mb == pytest.approx(TABLE_MB, abs=0.01)   # the export: the table once, no slots
    assert est.slots_mb == pytest.approx(TABLE_MB * slots, abs=0.02)
    assert est.optimizer == optimizer
    assert est.line() == f"variables per ps task (MB, the optimizer's slots included): {est.shares_text()}"


def test_a_small_model_goes_whole_to_one_ps(tmp_path):
    pytest.importorskip("tensorflow")
    est = estimate.estimate_memory(_cfg(tmp_path, partition_mb=1, model_args={"rows": 2**14}), num_ps=2)   # 0.5 MiB
    table = 2**14 * DIM * 4 * 3 / 2**20   # Adam (tfps's default): the table and its two slots
    small, big = sorted(est.shares_mb.values())
    assert small == 0 and big == pytest.approx(table, abs=0.01), est


def test_the_estimate_of_a_setup_is_that_of_its_config_and_builds_no_keras_weights(tmp_path):
    """``tfps local`` passes the JobSetup it made without binding it (no Keras model built yet)."""
    pytest.importorskip("tensorflow")
    cfg = _cfg(tmp_path, partition_mb=1)
    setup = JobSetup(cfg, bind=False)
    assert not setup.bound
    assert estimate.estimate_memory(setup, 2) == estimate.estimate_memory(cfg, 2)
    assert not setup.bound   # bound on a copy, in a throwaway graph


def test_a_model_that_cannot_be_built_gives_a_reason_not_an_error(tmp_path):
    reason = estimate.try_estimate(RunConfig(model="tests.fixtures.bad_import:model_fn",
                                              model_dir=str(tmp_path)), 2)
    assert isinstance(reason, str) and "cannot import" in reason


# ---------------------------------------------------------------------------- tfps local
def _estimate(**kwargs) -> MemoryEstimate:
    values = dict(shares_mb={"ps0": 6000.0, "ps1": 6000.0}, export_mb=4000.0, largest="table/embeddings",
                  largest_mb=4000.0, optimizer="adam", slots_mb=8000.0)
    return MemoryEstimate(**{**values, **kwargs})


def test_tfps_local_refuses_variables_this_host_cannot_hold_in_one_line():
    est = _estimate()
    memory.check_fits_host(est, 32 * 2**30)      # 16000 MB of 32 GiB: fits
    memory.check_fits_host(est, 0)               # unknown memory: not checked
    with pytest.raises(ConfigError) as e:
        memory.check_fits_host(est, 16 * 2**30)  # 15.6 GiB needed, 90 % of 16 GiB usable
    assert e.value.field == "memory"
    text = e.value.message
    assert "\n" not in text
    assert text.startswith("the variables need 15.6 GiB on this host, which has 16.0 GiB (MemTotal; tfps plans at "
                           "most 90% of it for variables): the ps tasks hold ps0 6000, ps1 6000 MB")
    assert "the chief's export restores the model's variables once more (4000 MB)" in text
    assert "make the largest variable (table/embeddings, 4000 MB) smaller" in text
    assert "adam's are 8000 MB; sgd keeps none" in text
    # Without slots worth naming, no advice about the optimizer.
    with pytest.raises(ConfigError) as e:
        memory.check_fits_host(_estimate(optimizer="sgd", slots_mb=0.0), 8 * 2**30)
    assert "slots (" not in e.value.message


def test_the_plan_and_tfps_local_count_the_versions_kept_on_disk():
    """``tfps plan`` and ``tfps local``'s start line count the versions of --export_every on the
    export's disk: --keep_exports x the export's size (one more while the next is written),
    "unbounded" without --keep_exports, nothing for a job without versions."""
    from tfps import cli
    from tfps.launch.processes import start_memory_line
    est = _estimate(export_mb=1500.0)

    def plan_line(**variables) -> str:
        _, launch = launch_from_vars({"tfps_job_name": "t", **variables})
        return cli.plan_memory_line(est, launch.run_args)

    assert plan_line(tfps_export_every="10m", tfps_keep_exports=3).endswith(
        "\ndisk: the versions of --export_every 10m take about 1500 MB each on the export's disk: --keep_exports 3 x "
        "1500 MB = 4.4 GiB (5.9 GiB while the next one is written).")
    assert plan_line(tfps_export_every=500).endswith(
        "\ndisk: the versions of --export_every 500 take about 1500 MB each on the export's disk: unbounded (every "
        "version stays; set --keep_exports K to keep the newest K).")
    assert "disk:" not in plan_line() and "versions" not in plan_line()
    assert plan_line(tfps_delta_checkpoint_secs=60).endswith(   # delta checkpoints (tfps.task.output.delta)
        "\ndisk: the delta checkpoints of --delta_checkpoint_secs 60 stay in MODEL_DIR/deltas until the next full "
        "checkpoint: one per interval until the next full checkpoint, each the dense variables plus the dynamic "
        "tables' rows touched in 60 s (at most a full checkpoint's size).")
    assert plan_line().startswith("memory: variables per ps task")
    line = start_memory_line(est, 32 * 2**30, "90s", 2)
    assert line.endswith("of this host's 32.0 GiB; the versions of --export_every 90s take about 1500 MB each on the "
                         "export's disk: --keep_exports 2 x 1500 MB = 2.9 GiB (4.4 GiB while the next one is written)")
    assert start_memory_line(est, 32 * 2**30).endswith("of this host's 32.0 GiB")


def test_mem_total_is_read_from_proc_meminfo():
    with open("/proc/meminfo") as fh:
        kb = int(next(line for line in fh if line.startswith("MemTotal:")).split()[1])
    assert host_total_memory() == kb * 1024


# ---------------------------------------------------------------------------- the play
def _filters():
    path = REPO / "ansible" / "roles" / "tfps" / "filter_plugins" / "tfps_filters.py"
    spec = importlib.util.spec_from_file_location("tfps_role_filters", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FilterModule().filters()["tfps_memory_problems"]


def _plan() -> dict:
    """ps0, ps1 on host "big"; ps2 on "small"; the chief on "w1"."""
    _, launch = launch_from_vars({"tfps_job_name": "t"})
    plan = local_plan(3, 1, ports=[2222, 2223, 2224, 2225]).to_json(launch)
    for task, host in zip(plan["tasks"], ("big", "big", "small", "w1")):
        task["host"] = host
    return plan


def _meminfo(mb: int) -> str:
    return base64.b64encode(f"MemTotal:       {mb * 1024} kB\nMemFree:  1 kB\n".encode()).decode()


def test_the_play_refuses_a_ps_host_with_less_memory_than_its_share():
    problems = _filters()
    est = _estimate(shares_mb={"ps0": 3000.0, "ps1": 3000.0, "ps2": 3000.0}).to_json()
    plan = _plan()
    assert problems(est, plan, "big", _meminfo(8192)) == []           # 6000 MB of 8 GiB
    assert problems(est, plan, "small", _meminfo(4096)) == []
    [one] = problems(est, plan, "small", _meminfo(2048))
    assert one.startswith("small: its ps task ps2 holds 3000 MB of variables (the optimizer's slots included; "
                          "estimated on the controller), and the host has 2048 MB (ansible_memtotal_mb; tfps plans "
                          "at most 90% of it for variables); add hosts to group ps so that each ps task holds less, "
                          "make the largest variable (table/embeddings, 4000 MB) smaller, train with an optimizer "
                          "that keeps fewer slots"), one
    assert one.endswith(", or use a host with more memory")
    [two] = problems(est, plan, "big", _meminfo(6000))
    assert two.startswith("big: its ps tasks ps0, ps1 hold 6000 MB") and "move some of its tfps_ps_tasks" in two


def test_the_play_checks_the_chiefs_export_and_the_container_limits():
    problems = _filters()
    est = _estimate(shares_mb={"ps0": 100.0, "ps1": 100.0, "ps2": 3000.0}).to_json()
    plan = _plan()
    [chief] = problems(est, plan, "w1", _meminfo(4096))
    assert chief.startswith("w1: the chief (worker0) restores the model's variables once, whole, for its export "
                            "(4000 MB), and the host has 4096 MB"), chief
    assert "slots" not in chief   # the export restores no slot
    assert problems(est, plan, "w1", _meminfo(8192)) == []
    assert problems(est, plan, "w1", _meminfo(8192), "", "5g") == []
    [limit] = problems(est, plan, "w1", _meminfo(8192), "", "4g")
    assert "more than 90% of tfps_worker_memory 4g" in limit and limit.startswith("w1: the chief (worker0)")
    [ps] = problems(est, plan, "small", _meminfo(65536), "2g")
    assert ps.startswith("small: ps2 holds 3000 MB of variables, more than 90% of tfps_ps_memory 2g") and \
        "raise tfps_ps_memory" in ps
    # No estimate (skipped on the controller), or a host whose memory could not be read: nothing to say.
    assert problems(None, plan, "small", _meminfo(1)) == []
    assert problems(est, plan, "small", "") == []


@pytest.mark.parametrize("text,mb", [("8g", 8192), ("512m", 512), ("512MB", 512), ("1073741824", 1024),
                                     ("1.5G", 1536), ("", None), (None, None), ("lots", None)])
def test_container_memory_limits_read_as_docker_reads_them(text, mb):
    assert memory.memory_limit_mb(text) == mb


# ---------------------------------------------------------------------------- tfps plan, the action
def test_the_controller_says_why_it_skips_the_estimate(monkeypatch):
    plan = _plan()
    _, script = launch_from_vars({"tfps_job_name": "t", "tfps_script": "train.py"})
    assert "classic script" in estimate.plan_estimate(local_plan(1, 1).to_json(script))
    _, on_hosts = launch_from_vars({"tfps_job_name": "t", "tfps_train_data": "/input/train-*.csv"})
    reason = estimate.plan_estimate({**plan, "job": local_plan(1, 1).to_json(on_hosts)["job"]})
    assert reason.startswith("the training data (/input/train-*.csv) is on the hosts") and "tfps_data_src" in reason
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorflow" else real(name, *a))
    assert estimate.plan_estimate(plan).startswith("TensorFlow is not installed in the controller's Python")


def test_the_controllers_estimate_is_the_workers(tmp_path):
    """``tfps plan -i`` and the role's action build the graph in a subprocess, from the plan's run options."""
    pytest.importorskip("tensorflow")
    _, launch = launch_from_vars({"tfps_job_name": "t", "tfps_model": MODEL, "tfps_extra_args": ["--partition_mb=1"]})
    plan = local_plan(2, 1).to_json(launch)
    est = estimate.plan_estimate(plan)
    assert isinstance(est, MemoryEstimate), est
    assert est == estimate.estimate_memory(_cfg(tmp_path, partition_mb=1), 2)


def test_a_ps_killed_for_memory_is_named_as_such_with_what_to_change(monkeypatch):
    """A SIGKILL the launcher did not send, after the task grew past a quarter of the host's
    memory, is the kernel's OOM killer: a ps's message says what holds its memory."""
    import signal

    from tfps.launch import tasks
    monkeypatch.setattr(tasks, "host_memory", lambda: 16 * 2**30)
    ps = tasks.TaskProcess("ps1", [], {})
    ps.code, ps.rss_peak = -signal.SIGKILL, 12 * 2**30
    text = ps.describe_exit()
    assert "killed by the kernel (out of memory): it used 12.0 GiB of the host's 16.0 GiB" in text, text
    assert "a ps holds its share of the variables" in text and "add ps tasks" in text
    worker = tasks.TaskProcess("worker1", [], {})
    worker.code, worker.rss_peak = -signal.SIGKILL, 12 * 2**30
    assert "lower --batch_size" in worker.describe_exit()
    worker.rss_peak = 2**20    # small: maybe another program's kill, maybe the OOM killer's
    assert worker.describe_exit().endswith("(sent by another program, or the kernel's OOM killer)")


@pytest.mark.parametrize("models,keras", [(("mlp", "cnn"), False), ((MODEL,), True)], ids=["built-in", "user"])
def test_a_built_in_models_graph_never_imports_tf_keras(tmp_path, models, keras):
    """A built-in model is plain ops: building its worker graph (here, the estimate's) leaves
    tf_keras unimported, which every launch of a built-in model would otherwise pay for
    (0.3-0.7 s here); both built-in models are built in one new interpreter, one after the
    other. A user's model_fn may use ``tf.compat.v1.layers`` (tf_keras): its graph is built
    with tf_keras imported and its weights partitioned."""
    pytest.importorskip("tf_keras")
    import json
    import subprocess
    import sys
    code = ("import json, sys\n"
            "from tfps.config import RunConfig\n"
            "from tfps.launch import estimate\n"
            "for model in sys.argv[2:]:\n"
            "    cfg = RunConfig(model=model, model_dir=sys.argv[1], partition_mb=1).validate()\n"
            "    est = estimate.estimate_memory(cfg, 2)\n"
            "    print(json.dumps({'model': model, 'keras': 'tf_keras' in sys.modules,"
            " 'mb': sum(est.shares_mb.values())}))\n")
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path / "model"), *models], capture_output=True,
                       text=True, cwd=REPO, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    outs = [json.loads(line) for line in p.stdout.strip().splitlines() if line.startswith("{")]
    assert [o["model"] for o in outs] == list(models), p.stdout[-3000:]
    for out in outs:
        assert out["mb"] > 0, out                 # the graph was built
        assert out["keras"] is keras, out


@pytest.mark.parametrize("builder, optimizer, note", [
    ("sequential", "adam", "optimizer adam (the model's compile()), learning_rate 0.01 (the model's compile())"),
    ("functional", "rmsprop", "optimizer rmsprop (the model's compile()), learning_rate 0.005 (the model's compile())")])
def test_a_compiled_tf_keras_model_is_estimated_with_its_compiled_optimizer(tmp_path, builder, optimizer, note):
    """The estimate binds a Keras model in a throwaway graph, where tf_keras's optimizers cannot
    read their learning-rate variable (numpy() needs eager execution): the estimate used to be
    skipped ("NotImplementedError: numpy() is only available when eager execution is enabled")
    for every model compiled with a tf_keras optimizer. It is made, with the compiled
    optimizer's slots, and the graph's binding reads the same optimizer as the eager one."""
    tf = pytest.importorskip("tensorflow")
    pytest.importorskip("tf_keras")
    import numpy as np
    rng = np.random.default_rng(3)
    rows = ["f0,f1,f2,f3,f4,f5,f6,f7,label"] + [
        ",".join(f"{v:.3f}" for v in rng.normal(size=8)) + f",{i % 3}" for i in range(64)]
    (tmp_path / "train.csv").write_text("\n".join(rows) + "\n")
    cfg = RunConfig(model=f"tests.fixtures.tf_keras_models:{builder}", train_data=str(tmp_path / "train.csv"),
                    model_dir=str(tmp_path / "model")).validate()
    est = estimate.try_estimate(JobSetup(cfg, bind=False), 1, 2)
    assert isinstance(est, MemoryEstimate), est
    assert est.optimizer == optimizer and est.shares_mb["ps0"] > 0, est
    with tf.Graph().as_default():
        in_a_graph = JobSetup(cfg, bind=False).bind()
    eager = JobSetup(cfg, bind=False).bind()
    assert in_a_graph.optimizer_note.startswith(note) and eager.optimizer_note == in_a_graph.optimizer_note

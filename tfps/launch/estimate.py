"""The variables' memory: what each ps task will hold, known before any task starts.

``tfps local`` prints it and refuses variables this host cannot hold (``estimate_isolated``);
``tfps plan -i`` and the role's ``tfps_memory`` action ask for it on the controller
(``plan_estimate``: ``python -m tfps.launch.estimate``). It builds the graph with the
worker's own code (tfps.task.worker), which is why it lives in a launcher and not below
``task``; what the estimate is, and the checks and lines made of it, are pure Python in
tfps.cluster.memory.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time

from tfps.cluster.memory import DynamicBudget, MemoryEstimate
from tfps.cluster.plan import DATA_MOUNT
from tfps.cluster.spec import ClusterSpec, TaskRef
from tfps.config import RunConfig, add_run_options, from_args, normalize_argv
from tfps.errors import ConfigError, real_os_exit
from tfps.launch.tasks import die_with_parent
from tfps.task import import_tensorflow
from tfps.task.runtime.signals import StopSignal

log = logging.getLogger("tfps")

#: How long an estimate may take (TensorFlow's import and one graph of the model).
ESTIMATE_TIMEOUT_SECS = 300


def estimate_memory(job, num_ps: int, num_workers: int = 1):
    """Each ps task's share of the variables, the optimizer's slots included (``tfps.cluster.memory.MemoryEstimate``).

    Builds the training graph exactly as a worker does (``tfps.task.worker.Worker.build``:
    the same ``tfps.task.graph.partition.partitioned(num_ps, partition_mb)``, optimizer and ``ByteBalancer``,
    whose shares the chief logs and results.json records as ``ps_shares_mb``) in a
    throwaway graph, and never creates a session, so nothing is allocated. ``job`` is a
    ``JobSetup`` or a ``RunConfig``. A JobSetup made with ``bind=False`` (or from a
    RunConfig) is bound in a throwaway graph, on a copy, so a Keras model's weights are
    shapes, not gigabytes of initial values. Needs TensorFlow, the model and the training
    data (for its columns).
    """
    import copy

    from tfps.task.setup import JobSetup  # lazy: imports NumPy
    from tfps.task.worker import Worker  # lazy: imports NumPy
    tf = import_tensorflow()
    from tfps.layers import dynamic_embedding  # lazy: imports TensorFlow (first, as the tasks do)
    with _quiet():
        if not isinstance(job, JobSetup):
            job = JobSetup(job, evaluates=False, bind=False)
        setup = job
        if not setup.bound:
            with tf.Graph().as_default():
                setup = copy.copy(job).bind()
        cluster = ClusterSpec(tuple(f"127.0.0.1:{1 + i}" for i in range(num_ps)),
                              tuple(f"127.0.0.1:{1 + num_ps + i}" for i in range(max(num_workers, 1))))
        worker = Worker(TaskRef(cluster, "worker", 0), setup.cfg, StopSignal())
        built = worker.build(setup)
    graph = built[0] if isinstance(built, tuple) and isinstance(built[0], tf.Graph) else None
    tables = dynamic_embedding.tables(graph) if graph is not None else []
    budgets = tuple(DynamicBudget.of_table(t, setup.optimizer, num_ps, setup.cfg.expected_ids) for t in tables)
    return MemoryEstimate.of(worker.balancer, setup.optimizer, budgets)


def estimate_shares(job, num_ps: int) -> dict[str, float]:
    """``{"ps0": MB, ...}``: :func:`estimate_memory`'s shares."""
    return estimate_memory(job, num_ps).shares_mb


class ModelRefused(str):
    """Why the estimate could not be made when the job itself is at fault: the user's model
    raised while its training graph was built (or tfps refused what it built). Every task
    would fail the same way, so ``tfps local`` refuses the job before start (``_preflight``);
    elsewhere (``tfps plan -i``) it is a reason like any other."""


def _raised_in_user_code(error: BaseException) -> bool:
    """Whether a frame of ``error``'s traceback is the user's code: not tfps, not an installed
    package (TensorFlow, tf_keras), not Python's standard library."""
    import sysconfig
    import traceback
    own = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the tfps package
    std = {os.path.abspath(sysconfig.get_paths()[k]) for k in ("stdlib", "platstdlib")}
    for frame in traceback.extract_tb(error.__traceback__):
        path = os.path.abspath(frame.filename)
        if (path.startswith(own + os.sep) or "site-packages" in path or "dist-packages" in path
                or any(path.startswith(d + os.sep) for d in std) or frame.filename.startswith("<")):
            continue
        return True
    return False


def try_estimate(job, num_ps: int, num_workers: int = 1):
    """:func:`estimate_memory`, or why it could not be made (one line): never raises for that.

    A ``ModelRefused`` reason when the model is at fault (tfps refused it, or the user's code
    raised): not when TensorFlow is missing, or something in tfps or TensorFlow failed."""
    import importlib.util
    if importlib.util.find_spec("tensorflow") is None:
        return "TensorFlow is not installed here"
    try:
        return estimate_memory(job, num_ps, num_workers)
    except ConfigError as e:
        return ModelRefused(str(e))
    except (Exception, SystemExit) as e:  # noqa: BLE001 - a user's model: refused, or the estimate is advice
        first = (str(e).strip().splitlines() or [""])[0]
        line = f"{type(e).__name__}: {first}" if first else type(e).__name__
        if _raised_in_user_code(e):
            cfg = getattr(job, "cfg", job)
            return ModelRefused(f"model: {getattr(cfg, 'model', 'the model')} raised {line} (checked before start, "
                                "building its training graph); fix the model (call it alone in Python to see the "
                                "whole traceback)")
        return line


@contextlib.contextmanager
def _quiet():
    """The worker's own lines ("worker0: optimizer ...") and TensorFlow's deprecation warnings
    belong to the tasks that train, not to an estimate (``-v`` shows TensorFlow's)."""
    tf_log = logging.getLogger("tensorflow")
    levels = log.level, tf_log.level
    log.setLevel(max(levels[0], logging.WARNING))
    if tf_log.level >= logging.WARNING or tf_log.level == logging.NOTSET:
        tf_log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(levels[0])
        tf_log.setLevel(levels[1])


def _answer(result) -> dict:
    if isinstance(result, ModelRefused):
        return {"refused": str(result)}
    return {"estimate": result.to_json()} if isinstance(result, MemoryEstimate) else {"skipped": result}


def _from_answer(answer: dict):
    if "refused" in answer:
        return ModelRefused(answer["refused"])
    return MemoryEstimate.from_json(answer["estimate"]) if "estimate" in answer else str(answer["skipped"])


def estimate_isolated(setup, num_ps: int, num_workers: int, verbose: bool, isolate: bool):
    """:func:`try_estimate` of the launcher's job.

    With ``isolate`` (this process has imported TensorFlow and may fork), in a forked
    child: the graph's threads and memory go with it, so the tasks are still forked from a
    clean single-threaded launcher. Otherwise in a new interpreter, so that a launcher that
    spawns its tasks never imports TensorFlow.
    """
    import json
    import select
    if not isolate:   # the tasks are spawned: this launcher stays without TensorFlow
        return _estimate_in_a_process(setup.cfg, num_ps, num_workers)
    read_end, write_end = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:   # the child: never returns
        code = 0
        try:
            os.close(read_end)
            die_with_parent()
            if not verbose:   # TensorFlow's C++ lines
                null = os.open(os.devnull, os.O_WRONLY)
                os.dup2(null, 2)
                os.close(null)
            answer = _answer(try_estimate(setup, num_ps, num_workers))
            with os.fdopen(write_end, "w") as fh:
                fh.write(json.dumps(answer))
        except BaseException:   # noqa: BLE001 - the child must never return into the launcher
            code = 1
        finally:
            real_os_exit(code)
    os.close(write_end)
    chunks: list[bytes] = []
    deadline = time.monotonic() + ESTIMATE_TIMEOUT_SECS
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([read_end], [], [], left)[0]:
                return f"building the model's graph took more than {ESTIMATE_TIMEOUT_SECS} s"
            chunk = os.read(read_end, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read_end)
        if os.waitpid(pid, os.WNOHANG)[0] == 0:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    try:
        return _from_answer(json.loads(b"".join(chunks)))
    except (ValueError, KeyError):
        return "the process that built the model's graph ended without an answer"


def config_of(run_args) -> RunConfig:
    """The RunConfig of ``tfps run`` options (the plan's ``job.run_args``)."""
    import argparse

    parser = argparse.ArgumentParser(add_help=False)
    add_run_options(parser)
    ns, _ = parser.parse_known_args(normalize_argv([str(a) for a in run_args]))
    return from_args(ns)


def plan_estimate(plan: dict, data_src: str | None = None, train_data: str | None = None,
                  user_model_dir: str | None = None):
    """The estimate of a planned job (``tfps plan -i``, the role's ``tfps_memory`` action),
    made on the controller; or why it was skipped (one line): no TensorFlow there, a classic
    script, training data that lives on the hosts only, a model that cannot be built there.

    The data is read where the controller has it: ``tfps_data_src`` (the play copies it
    from there), else tfps's demo data when the job names none. ``user_model_dir`` is put on
    the model's import path, as the containers mount it. The graph is built in a subprocess
    (:func:`estimate_main`), so the caller never imports TensorFlow.
    """
    import importlib.util

    tasks = plan.get("tasks") or []
    if tasks and tasks[0].get("entrypoint"):
        return "the job runs a classic script (tfps_script), whose variables tfps does not know"
    if importlib.util.find_spec("tensorflow") is None:
        return f"TensorFlow is not installed in the controller's Python ({sys.executable})"
    cfg = config_of(plan["job"]["run_args"])
    if data_src:
        from tfps.cluster import datasrc  # lazy: imports NumPy and PyYAML
        cfg.train_data = datasrc._base_and_train(data_src, train_data or None)[1]
    elif cfg.train_data:
        return (f"the training data ({cfg.train_data}) is on the hosts ({DATA_MOUNT} is their tfps_data_dir), "
                "not on the controller; set tfps_data_src to estimate here")
    return _estimate_in_a_process(cfg, len(plan["cluster"]["ps"]), len(plan["cluster"]["worker"]), user_model_dir)


def _estimate_in_a_process(cfg: RunConfig, num_ps: int, num_workers: int, user_model_dir: str | None = None):
    """:func:`try_estimate` in a new interpreter (:func:`estimate_main`): the caller never
    imports TensorFlow."""
    import json
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1")
    # The caller's import path (a --model module in its working directory, say), then the model dir's.
    path = [os.path.abspath(user_model_dir)] if user_model_dir else []
    path += [p for p in sys.path if p] + [env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
    request = {"run_args": cfg.to_args(), "num_ps": num_ps, "num_workers": num_workers}
    try:
        done = subprocess.run([sys.executable, "-m", "tfps.launch.estimate"], input=json.dumps(request),
                              capture_output=True, text=True, env=env, timeout=ESTIMATE_TIMEOUT_SECS)
    except subprocess.TimeoutExpired:
        return f"building the model's graph took more than {ESTIMATE_TIMEOUT_SECS} s"
    except OSError as e:
        return f"cannot run {sys.executable}: {e}"
    try:
        return _from_answer(json.loads(done.stdout.strip().splitlines()[-1]))
    except (IndexError, ValueError, KeyError):
        tail = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        return f"the estimate failed: {tail}"


def estimate_main() -> int:
    """``python -m tfps.launch.estimate``: one JSON request on stdin (run options, ps and
    worker counts), one JSON answer on stdout (the estimate, or why it was skipped)."""
    import json
    request = json.loads(sys.stdin.read())
    try:
        result = try_estimate(config_of(request["run_args"]), int(request["num_ps"]), int(request["num_workers"]))
    except (ConfigError, SystemExit) as e:
        result = f"the job's options: {e}"
    print(json.dumps(_answer(result)), flush=True)
    return 0


if __name__ == "__main__":   # the controller's estimate (plan_estimate)
    sys.exit(estimate_main())

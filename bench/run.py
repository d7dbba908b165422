"""tfps benchmarks: every figure measured side by side in one run, reported as ratios.

    .venv/bin/python bench/run.py [--quick] [--skip deploy,image,final_save]

1. start-up: launch -> every worker past its first step, tfps local vs the classic script
2. throughput: examples/s, async and sync, MLP and CNN: tfps vs classic feed_dict loop vs
   one process (the ceiling on one machine)
3. final save: checkpoint + export of ~100 MB and ~1 GB of variables, under default settings
4. deployment: ansible-playbook wall time on the 3-host test cluster (first and no-change run)
5. image size of the CPU image vs the official CPU TensorFlow image's published size

Results go to stdout (a table), docs/benchmarks.md and docs/benchmarks.png. These machines
are noisy: absolute times are context, ratios measured in the same run are the result.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tfps.cluster import local_plan  # noqa: E402

PY = sys.executable
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": ROOT, "PYTHONUNBUFFERED": "1"}
FIRST_RE = re.compile(r"\[(worker\d+)\].*first training step done")
#: The official tensorflow/tensorflow:latest (CPU) image size (Docker Hub, 2.x, uncompressed
#: as `docker images` shows it); see tensorflow/tensorflow PR #59682: 2.07 GB -> 1.76 GB.
OFFICIAL_CPU_IMAGE_GB = 1.76


def sh(argv, timeout=900, env=ENV):
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


class Watched:
    """A process whose output lines are read as they come, each ``pattern`` match timed.

    Start-up counts from the launch for tfps and for the classic script alike: the moment
    a worker's first-step line arrives (a process's own "after start" would leave out the
    interpreter's start and, for ``tfps local``, the launcher's)."""

    def __init__(self, argv, pattern: re.Pattern, t0: float):
        import threading
        self.pattern, self.t0, self.seen, self.lines = pattern, t0, {}, []
        self.popen = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV,
                                      cwd=ROOT, start_new_session=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.popen.stdout:
            self.lines.append(line)
            m = self.pattern.search(line)
            if m and m.group(1) not in self.seen:
                self.seen[m.group(1)] = time.time() - self.t0

    def wait(self, timeout: float) -> str:
        self.popen.wait(timeout)
        self.reader.join(10)
        return "".join(self.lines)


# ---------------------------------------------------------------------------- tfps side
def run_tfps(steps, batch, model="mlp", sync=False, extra=()):
    d = tempfile.mkdtemp(prefix="tfps-bench-")
    t0 = time.time()
    p = Watched([PY, "-m", "tfps", "local", "--ps", "1", "--workers", "2", "--model", model,
                 "--train_steps", str(steps), "--batch_size", str(batch), "--model_dir", d, "--log_steps", "100",
                 *(["--sync_replicas"] if sync else []), *extra], FIRST_RE, t0)
    out = p.wait(3600)
    wall = time.time() - t0
    if p.popen.returncode != 0:
        raise RuntimeError(f"tfps local failed ({p.popen.returncode}):\n{out[-3000:]}")
    res = json.load(open(os.path.join(d, "results.json")))
    firsts = dict(p.seen)
    shutil.rmtree(d, ignore_errors=True)
    factor = 2 if sync else 1
    return {"first": firsts, "examples_s": res["global_step"] * batch * factor / res["times"]["training_s"],
            "final_save_s": res["times"]["final_save_s"], "wall": wall, "results": res}


# ------------------------------------------------------------------------- classic side
def run_classic(steps, batch, model="mlp", sync=False):
    plan = local_plan(1, 2)
    t0 = time.time()
    procs = {}
    for t in plan.tasks:
        argv = [PY, os.path.join(ROOT, "bench", "classic_replica.py"), *plan.task_ref(t).to_flags(),
                "--train_steps", str(steps), "--batch_size", str(batch), "--model", model,
                *(["--sync_replicas"] if sync else [])]
        procs[t.name] = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                         env=ENV, cwd=ROOT, start_new_session=True)
    outs = {}
    try:
        for name in ("worker0", "worker1"):
            outs[name] = procs[name].communicate(timeout=3600)[0]
    finally:
        for pr in procs.values():        # the classic ps never exits: it has to be killed
            if pr.poll() is None:
                os.killpg(pr.pid, signal.SIGKILL)
                pr.wait()
    first, done = {}, {}
    for name, out in outs.items():
        m = re.search(r"BENCH first_step ([\d.]+)", out)
        d = re.search(r"BENCH done (\d+) ([\d.]+) ([\d.]+)", out)
        if not (m and d):
            raise RuntimeError(f"classic {name} failed:\n{out[-3000:]}")
        first[name] = float(m.group(1)) - t0
        done[name] = (int(d.group(1)), float(d.group(2)), float(d.group(3)))
    step, start, end = done["worker0"]
    factor = 2 if sync else 1
    return {"first": first, "examples_s": step * batch * factor / (end - start)}


def run_single(steps, batch, model="mlp"):
    p = sh([PY, os.path.join(ROOT, "bench", "single.py"), "--train_steps", str(steps),
            "--batch_size", str(batch), "--model", model])
    d = re.search(r"BENCH done (\d+) ([\d.]+) ([\d.]+)", p.stdout)
    if not d:
        raise RuntimeError(p.stdout[-2000:] + p.stderr[-2000:])
    return {"examples_s": int(d.group(1)) * batch / (float(d.group(3)) - float(d.group(2)))}


def _port_open(port: int) -> bool:
    import socket
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def run_ps_first(kind: str, steps: int) -> dict[str, float]:
    """The cluster as an orchestrator or a user starts it: the ps is serving, then both
    workers start at the same moment (tfps: `tfps run` per task, as in the containers).
    Returns each worker's first training step, in seconds after the workers' launch."""
    plan = local_plan(1, 2)
    d = tempfile.mkdtemp(prefix="tfps-bench-")

    def argv(t):
        flags = plan.task_ref(t).to_flags()
        if kind == "tfps":
            return [PY, "-m", "tfps", "run", *flags, "--train_steps", str(steps), "--model_dir", d,
                    "--log_steps", "100"]
        return [PY, os.path.join(ROOT, "bench", "classic_replica.py"), *flags, "--train_steps", str(steps)]

    # Each worker's first-step line, timed as it arrives (the same for both programs).
    first_line = re.compile(r"(first) training step done" if kind == "tfps" else r"BENCH (first)_step")
    ps = [t for t in plan.tasks if t.job == "ps"][0]
    procs = {"ps0": Watched(argv(ps), first_line, time.time())}
    try:
        deadline = time.time() + 120
        while not _port_open(ps.port):
            if time.time() > deadline or procs["ps0"].popen.poll() is not None:
                raise RuntimeError(f"{kind} ps did not start")
            time.sleep(0.1)
        t0 = time.time()
        for t in plan.tasks:
            if t.job == "worker":
                procs[t.name] = Watched(argv(t), first_line, t0)
        outs = {name: procs[name].wait(900) for name in ("worker0", "worker1")}
    finally:
        for pr in procs.values():        # the classic ps never exits
            if pr.popen.poll() is None:
                os.killpg(pr.popen.pid, signal.SIGKILL)
                pr.popen.wait()
        shutil.rmtree(d, ignore_errors=True)
    first = {}
    for name, out in outs.items():
        first[name] = procs[name].seen.get("first")
        if first[name] is None:
            raise RuntimeError(f"{kind} {name} did not train:\n{out[-3000:]}")
    return first


# ------------------------------------------------------------------------------ repeats
def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def spread(xs, fmt="{:.2f}") -> str:
    """The median of the runs, with their range: ``1.23 (1.10-1.40)``."""
    return fmt.format(median(xs)) + (f" ({fmt.format(min(xs))}-{fmt.format(max(xs))})" if len(xs) > 1 else "")


def stats(xs) -> dict:
    return {"median": median(xs), "min": min(xs), "max": max(xs), "runs": list(xs)}


# ------------------------------------------------------------------------------ benches
#: Start-up flips between runs (gRPC reconnect back-off, the classic 30 s readiness poll):
#: its medians always come from at least this many runs of each scenario.
STARTUP_MIN_RUNS = 5


def bench_startup(rows, quick, repeat):
    """Each scenario ``max(repeat, STARTUP_MIN_RUNS)`` times, tfps and classic alternating
    (same load for both)."""
    steps = 300 if quick else 600
    t, c, tp, cp = [], [], [], []
    for _ in range(max(repeat, STARTUP_MIN_RUNS)):
        t.append(max(run_tfps(steps, 64)["first"].values()))
        c.append(max(run_classic(steps, 64)["first"].values()))
        # The non-chief's join, with the ps already serving when the workers start: the classic
        # non-chief then finds the model not yet initialised and sleeps MonitoredTrainingSession's
        # 30 s; started all at once (above), both wait for the ps and the poll may not show.
        tp.append(run_ps_first("tfps", steps))
        cp.append(run_ps_first("classic", steps))
    tj = [r["worker1"] - r["worker0"] for r in tp]
    cj = [r["worker1"] - r["worker0"] for r in cp]
    ratios = [b / a for a, b in zip(t, c)]
    rows.append(("start-up, all at once: launch -> all workers training (s)", spread(t), spread(c),
                 spread(ratios) + "x sooner", ">= 1.0x"))
    rows.append(("start-up, ps serving: non-chief joins after the chief (s)", spread(tj), spread(cj),
                 spread([b / max(a, 0.05) for a, b in zip(tj, cj)], "{:.1f}") + "x sooner", "within 2 s, >= 10x"))
    tpm, cpm = [max(r.values()) for r in tp], [max(r.values()) for r in cp]
    rows.append(("start-up, ps serving: launch -> all workers training (s)", spread(tpm), spread(cpm),
                 spread([b / a for a, b in zip(tpm, cpm)]) + "x sooner", ">= 1.0x"))
    return {"all_at_once": {"tfps": stats(t), "classic": stats(c)},
            "ps_serving": {"tfps": stats(tpm), "classic": stats(cpm)},
            "ps_serving_join": {"tfps": stats(tj), "classic": stats(cj)}}


def _once_more_if_failed(run, failed: list) -> float:
    """A run's examples/s; a run that fails is reported (``failed_runs``) and run again once."""
    try:
        return run()["examples_s"]
    except RuntimeError as e:
        failed.append(str(e)[-1500:])
        print(f"a run failed, running it again: {str(e)[-500:]}", file=sys.stderr, flush=True)
        return run()["examples_s"]


def bench_throughput(rows, quick, repeat):
    """examples/s of tfps, the classic loop and one process, ``repeat`` times each, interleaved."""
    out = {}
    for model, steps in (("mlp", 1500 if quick else 4000), ("cnn", 300 if quick else 800)):
        for sync in (False, True):
            mode = "sync" if sync else "async"
            runs = {"tfps": [], "classic": [], "single": []}
            failed = []
            for _ in range(repeat):
                runs["single"].append(run_single(steps, 64, model)["examples_s"])
                runs["tfps"].append(_once_more_if_failed(lambda: run_tfps(steps, 64, model, sync), failed))
                runs["classic"].append(_once_more_if_failed(lambda: run_classic(steps, 64, model, sync), failed))
            out[f"{model}-{mode}"] = {who: stats(xs) for who, xs in runs.items()}
            out[f"{model}-{mode}"]["failed_runs"] = failed
            vs_classic = [a / b for a, b in zip(runs["tfps"], runs["classic"])]
            vs_single = [a / b for a, b in zip(runs["tfps"], runs["single"])]
            rows.append((f"throughput {model} {mode} (examples/s)", spread(runs["tfps"], "{:.0f}"),
                         spread(runs["classic"], "{:.0f}"),
                         f"{spread(vs_classic)}x classic, {spread(vs_single)}x one process",
                         ">= 1.3x classic, >= 0.6x one process" if mode == "async" else ""))
        rows.append((f"throughput {model}: sync/async (tfps, medians)",
                     f"{out[f'{model}-sync']['tfps']['median'] / out[f'{model}-async']['tfps']['median']:.2f}",
                     "", "", ""))
    return out


def bench_final_save(rows, quick):
    out = {}
    # an 8 -> H -> H -> 3 MLP holds about H*H float32 variables: 5000 -> 100 MB, 15800 -> 1 GB
    sizes = (("100MB", "5000,5000"), ("1GB", "15800,15800")) if not quick else (("100MB", "5000,5000"),)
    for label, hidden in sizes:
        t = run_tfps(4, 8, "mlp", extra=("--hidden_units", hidden, "--optimizer", "sgd", "--checkpoint_steps", "1000"))
        res = t["results"]
        ok = res["status"] == "succeeded" and res["export_complete"]
        out[label] = t["final_save_s"]
        rows.append((f"final save, {label} of variables (s)", f"{t['final_save_s']:.1f}", "",
                     "complete" if ok else "CUT SHORT", "complete within 1800 s default"))
    return out


def bench_image(rows, image):
    p = sh(["docker", "image", "inspect", image, "--format", "{{.Size}}"])
    if p.returncode != 0:
        rows.append(("image size (GB)", f"n/a (no {image})", "", "", ""))
        return None
    gb = int(p.stdout.strip()) / 1e9
    rows.append((f"CPU image size (GB, {image})", f"{gb:.2f}", f"{OFFICIAL_CPU_IMAGE_GB:.2f} (official)",
                 f"{gb / OFFICIAL_CPU_IMAGE_GB:.2f}x", "<= 1.2 GB"))
    return gb


def bench_deploy(rows):
    script = os.path.join(ROOT, "bench", "deploy_bench.py")
    if not os.path.exists(script):
        rows.append(("ansible deploy", "not measured", "", "", ""))
        return None
    p = sh([PY, script], timeout=3600)
    try:
        r = json.loads(p.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        rows.append(("ansible deploy", "failed: " + (p.stderr or p.stdout)[-200:], "", "", ""))
        return None
    rows.append(("ansible deploy, first run (s)", f"{r['first_s']:.0f}", "", "", ""))
    rows.append(("ansible deploy, no-change run (s)", f"{r['second_s']:.1f}", "", f"changed={r['changed']}",
                 "changed=0, < 30 s"))
    return r


def chart(data, path):
    """Bars at the medians, whiskers over the range of the runs."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def bars(ax, groups, who_offsets, width):
        for off, who in who_offsets:
            st = [g[who] for g in groups.values()]
            med = [x["median"] for x in st]
            err = [[m - x["min"] for m, x in zip(med, st)], [x["max"] - m for m, x in zip(med, st)]]
            ax.bar([i + off for i in range(len(st))], med, width=width, yerr=err, capsize=3, label=who)
        ax.set_xticks(list(range(len(groups))), list(groups), fontsize=8)
        ax.legend(fontsize=8)

    tp = data.get("throughput") or {}
    su = data.get("startup") or {}
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    if tp:
        bars(axes[0], tp, ((-0.27, "tfps"), (0, "classic"), (0.27, "single")), 0.27)
        axes[0].set_ylabel("examples/s (median, range)")
        axes[0].set_title("training throughput (1 ps + 2 workers)")
    if su:
        groups = {k.replace("_", " "): v for k, v in su.items() if k in ("all_at_once", "ps_serving")}
        bars(axes[1], groups, ((-0.2, "tfps"), (0.2, "classic")), 0.4)
        axes[1].set_ylabel("s, launch -> all workers training")
        axes[1].set_title("start-up (median, range)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def machine() -> str:
    cpu = "unknown CPU"
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    import tensorflow as tf  # noqa: F401 - version only
    return (f"{platform.node()}: {os.cpu_count()} cores ({cpu}), {mem:.0f} GiB RAM, {platform.platform()}, "
            f"Python {platform.python_version()}, TensorFlow {tf.__version__}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer steps, skip the 1 GB save")
    ap.add_argument("--skip", default="", help="comma-separated: startup,throughput,final_save,image,deploy")
    ap.add_argument("--repeat", type=int, default=3,
                    help="runs per figure; each figure is their median, with their range (default 3)")
    ap.add_argument("--image", default="tfps:latest", help="the image whose size is reported")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs"))
    a = ap.parse_args()
    if a.repeat < 1:
        ap.error("--repeat must be at least 1")
    skip = set(filter(None, a.skip.split(",")))
    rows: list[tuple] = []
    data = {}
    loads = [os.getloadavg()]
    for name, fn in (("startup", lambda: bench_startup(rows, a.quick, a.repeat)),
                     ("throughput", lambda: bench_throughput(rows, a.quick, a.repeat)),
                     ("final_save", lambda: bench_final_save(rows, a.quick)),
                     ("image", lambda: bench_image(rows, a.image)), ("deploy", lambda: bench_deploy(rows))):
        if name in skip:
            continue
        print(f"running {name} ...", file=sys.stderr, flush=True)
        data[name] = fn()
        loads.append(os.getloadavg())
    data["load_average_1_5_15"] = loads
    header = ("benchmark", "tfps", "baseline", "ratio", "target")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(5)]
    table = "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths)) for r in [header, *rows])
    print(table)
    os.makedirs(a.out, exist_ok=True)
    chart(data, os.path.join(a.out, "benchmarks.png"))
    load = max(l[0] for l in loads)
    md = [f"Measured {time.strftime('%Y-%m-%d')} with `bench/run.py {' '.join(sys.argv[1:])}` on {machine()}; "
          f"load average (1 min) between the benches up to {load:.1f}. Each figure is the median of "
          f"{a.repeat} run(s) ({max(a.repeat, STARTUP_MIN_RUNS)} for start-up), the range in brackets.", "",
          "| " + " | ".join(header) + " |", "|" + "---|" * 5]
    md += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    md += ["", "![benchmarks](benchmarks.png)", "", "Raw figures:", "", "```json",
           json.dumps(data, indent=1, default=str), "```", ""]
    write_section(os.path.join(a.out, "benchmarks.md"), "\n".join(md))
    return 0


BEGIN, END = "<!-- bench:begin (written by bench/run.py) -->", "<!-- bench:end -->"


def write_section(path: str, body: str) -> None:
    """Replace the generated part of docs/benchmarks.md, keep the prose around it."""
    text = open(path).read() if os.path.exists(path) else "# Benchmarks\n\n" + BEGIN + "\n" + END + "\n"
    if BEGIN not in text:
        text += "\n" + BEGIN + "\n" + END + "\n"
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1] if END in rest else ""
    with open(path, "w") as fh:
        fh.write(head + BEGIN + "\n" + body + "\n" + END + tail)


if __name__ == "__main__":
    sys.exit(main())

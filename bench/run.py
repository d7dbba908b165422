"""tfps benchmarks: every figure measured side by side in one run, reported as ratios.

    .venv/bin/python bench/run.py [--quick] [--skip deploy,image,final_save,ctr]

1. start-up: launch -> every worker past its first step, tfps local vs the classic script
2. throughput: examples/s, async and sync, MLP and CNN: tfps vs classic feed_dict loop vs
   one process (the ceiling on one machine)
2b. backup: a sync job of 3 workers with one frozen (SIGSTOP) for 20 s, with and without
   --backup_workers 1: the steps the job still makes in the freeze
3. final save: checkpoint + export of ~100 MB and ~1 GB of variables, under default settings
4. deployment: ansible-playbook wall time on the 3-host test cluster (first and no-change run)
5. image size of the CPU image vs the official CPU TensorFlow image's published size
6. CTR: examples/s of a model with a 256 MiB embedding table, tfps (1 and 2 ps) vs TF2's
   ParameterServerStrategy + ClusterCoordinator (bench/ctr_tf2.py) vs one process's
   model.fit; each ps's peak RSS; a 4x larger table; Adam as compiled
7. dynamic: wide_deep on a stream of churning users (bench/ctr_stream.py: 1 M distinct,
   50 k active at a time; --stream_scale shrinks it), hashed against dynamic tables of the
   same memory budget, 2 ps + 2 workers each reading its share once (--epochs 1): AUC on
   the next part of the stream (and the dynamic side's on the stream with one constant
   user), ps RSS at 25 % and 100 % of the steps,
   examples/s, and a continuation saved on 2 ps resumed on 3
8. dlrm: a Criteo-shaped DLRM (bench/dlrm.py: 13 numeric and 26 categorical columns, dim 16,
   MLPs 512-256-16 and 512-256-1, batch 512, Adagrad): examples/s and examples/s per vCPU of
   tfps (1 ps + 2 workers) with hashed and with dynamic tables, one process's model.fit and
   TF2 PSS (hashed), each run's held-out AUC; against DeepRec modelzoo's published anchors
9. export: the chief's examples/s with versions exported while it trains (--export_every)
   against the same job without (1 ps + 1 worker, the order alternating between rounds)
10. stream: a followed job (--follow, dynamic table) on a drifting stream whose partitions land
   while it runs, against the same model trained on the first quarter and never updated, one
   worker in stream order with a collision-free table (the ceiling), the same job on a fixed
   file list and on static halves (bench/sec_stream.py): progressive AUC on the last window
   and over time (a plot beside the results file), lag behind the newest partition, examples/s
11. delta: delta checkpoints against full ones on a dynamic table of 2 M live rows on 2 ps,
   ~1 % of its rows changed between saves: bytes, save time, training pause, restore time

Every run is appended to the results file (JSON lines, ``--results``; by default
docs/bench-data/<UTC time>.jsonl) and printed as it ends, so a bench that is stopped or runs
out of time keeps every figure it measured; ``--report FILE`` prints the tables from such a
file again (``--write_docs`` also rewrites docs/benchmarks.md from it). At the end the tables
go to stdout, docs/benchmarks.md and docs/benchmarks.png. A classic run that stalls in
MonitoredTrainingSession's readiness race is recorded as hung and counted, not retried
(bench/sec_basic.py). Each section has a time budget (``--budget``); one that runs out
reports what it has and says so. SIGTERM, SIGINT and SIGHUP end every process the bench
started (bench/procs.py). These machines are noisy: absolute times are context, ratios
measured in the same run are the result.

The sections live in bench/sec_*.py, the results file in bench/results.py, the tables in
bench/report.py.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)                        # bench/: the section modules
sys.path.insert(1, os.path.dirname(HERE))       # the checkout: tfps

import procs  # noqa: E402
import report  # noqa: E402
import results  # noqa: E402
from procs import ROOT, OutOfTime  # noqa: E402

SECTIONS = ("startup", "throughput", "backup", "final_save", "image", "deploy", "ctr", "dynamic", "dlrm", "export",
            "stream", "delta")
#: Minutes each section may take. --quick: the sections startup and throughput (what
#: `--quick --skip deploy,image,final_save,ctr,backup,dynamic,dlrm` runs) end within 17
#: minutes together on 2 cores, whatever the load: issue 52's run had not ended after 40.
BUDGET_MIN = {"startup": 60, "throughput": 120, "backup": 30, "final_save": 30, "image": 2, "deploy": 60,
              "ctr": 90, "dynamic": 300, "dlrm": 90, "export": 60, "stream": 30, "delta": 30}
BUDGET_MIN_QUICK = {"startup": 6, "throughput": 11, "backup": 8, "final_save": 5, "image": 1, "deploy": 30,
                    "ctr": 25, "dynamic": 30, "dlrm": 25, "export": 10, "stream": 10, "delta": 10}


class Context:
    """What a section needs: the settings, the results file and its own deadline."""

    def __init__(self, a, out: results.ResultsFile):
        self.quick, self.repeat, self.image, self.stream_scale = a.quick, a.repeat, a.image, a.stream_scale
        self.out = out
        self.section, self.deadline = "", float("inf")

    def check(self) -> None:
        """OutOfTime once the section's budget has run out."""
        if time.time() > self.deadline:
            raise OutOfTime("the section's budget ran out")

    def info(self, data: dict) -> None:
        self.out.add({"type": "info", "section": self.section, "data": data})


def section_fn(name: str):
    """The function that runs section ``name`` (imported late: only the sections run load)."""
    import sec_basic
    import sec_other
    if name in ("startup", "throughput"):
        return getattr(sec_basic, f"bench_{name}")
    if name in ("backup", "final_save", "image", "deploy"):
        return getattr(sec_other, f"bench_{name}")
    module = __import__(f"sec_{name}")
    return getattr(module, f"bench_{name}")


def parse_budget(text: str | None, quick: bool) -> dict[str, float]:
    """``--budget``: ``MIN`` (every section) or ``SECTION=MIN,...`` (those sections); the
    rest keep their defaults. ValueError with what to change."""
    budgets = dict(BUDGET_MIN_QUICK if quick else BUDGET_MIN)
    if not text:
        return budgets
    for item in text.split(","):
        name, _, value = item.rpartition("=")
        try:
            minutes = float(value)
        except ValueError:
            raise ValueError(f"--budget {text}: {value!r} is not a number of minutes (e.g. --budget 10 or "
                             "--budget startup=5,throughput=12)") from None
        if not minutes > 0:
            raise ValueError(f"--budget {text}: give each section more than 0 minutes")
        if name and name not in SECTIONS:
            raise ValueError(f"--budget {text}: no section {name!r}; sections: {','.join(SECTIONS)}")
        for s in ([name] if name else SECTIONS):
            budgets[s] = minutes
    return budgets


def machine() -> str:
    from importlib import metadata
    cpu = "unknown CPU"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    tf = "?"
    for dist in ("tensorflow", "tensorflow-cpu"):
        try:
            tf = metadata.version(dist)
            break
        except metadata.PackageNotFoundError:
            continue
    return (f"{platform.node()}: {os.cpu_count()} cores ({cpu}), {mem:.0f} GiB RAM, {platform.platform()}, "
            f"Python {platform.python_version()}, TensorFlow {tf}")


def arguments(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer steps, skip the 1 GB save, shorter budgets")
    ap.add_argument("--skip", default="", help=f"comma-separated sections to leave out: {','.join(SECTIONS)}")
    ap.add_argument("--only", default="", help="comma-separated: run only these sections")
    ap.add_argument("--budget", help="minutes per section: MIN for every section, or SECTION=MIN,... "
                    f"(defaults with --quick: {BUDGET_MIN_QUICK}; without: {BUDGET_MIN})")
    ap.add_argument("--stream_scale", type=float,
                    help="dynamic: users and rows of the stream x this (default 1, with --quick 0.05)")
    ap.add_argument("--repeat", type=int, default=3,
                    help="runs per figure; each figure is their median, with their range (default 3)")
    ap.add_argument("--image", default="tfps:latest", help="the image whose size is reported")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs"), help="where benchmarks.md and the chart go")
    ap.add_argument("--results", help="the results file to append to (JSON lines; default "
                    "OUT/bench-data/<UTC time>.jsonl)")
    ap.add_argument("--report", metavar="FILE", help="print the tables of a results file (of a bench that ended, "
                    "ran out of time or was killed) and run nothing")
    ap.add_argument("--write_docs", action="store_true", help="with --report: also rewrite OUT/benchmarks.md")
    a = ap.parse_args(argv)
    if a.repeat < 1:
        ap.error("--repeat must be at least 1")
    for flag in ("skip", "only"):
        unknown = [s for s in getattr(a, flag).split(",") if s and s not in SECTIONS]
        if unknown:
            ap.error(f"--{flag}: no section {', '.join(unknown)}; sections: {','.join(SECTIONS)}")
    try:
        a.budgets = parse_budget(a.budget, a.quick)
    except ValueError as e:
        ap.error(str(e))
    if a.report and not os.path.isfile(a.report):
        ap.error(f"--report {a.report}: no such file; give a results file a bench wrote (--results)")
    if a.write_docs and not a.report:
        ap.error("--write_docs goes with --report FILE")
    return a


def show(records: list[dict], out_dir: str, results_path: str, write: bool) -> None:
    print(report.report(records), flush=True)
    if write:
        os.makedirs(out_dir, exist_ok=True)
        link = os.path.relpath(os.path.abspath(results_path), os.path.abspath(out_dir))
        parts = report.write_docs(records, os.path.join(out_dir, "benchmarks.md"), link)
        if "general" in parts:
            report.chart(records, os.path.join(out_dir, "benchmarks.png"))
        print(f"wrote {', '.join(parts) or 'no'} part(s) of {os.path.join(out_dir, 'benchmarks.md')}", file=sys.stderr)


def run_section(name: str, ctx: Context, budget_min: float) -> None:
    """Run one section within its budget and record how it ended."""
    print(f"running {name} (budget {budget_min:g} min) ...", file=sys.stderr, flush=True)
    t0 = time.time()
    ctx.section, ctx.deadline = name, t0 + budget_min * 60
    status, why = "done", ""
    try:
        section_fn(name)(ctx)
    except OutOfTime as e:
        status, why = "budget", str(e)
        print(f"{name}: ran out of its {budget_min:g} min budget; reporting what it has", file=sys.stderr,
              flush=True)
    except Exception as e:  # noqa: BLE001 - one section's failure must not lose the others' figures
        status, why = "failed", f"{type(e).__name__}: {e}\n{traceback.format_exc()[-3000:]}"
        print(f"{name} failed: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr,
              flush=True)
    finally:
        procs.end_all()
    ctx.out.add({"type": "section", "section": name, "status": status, "why": why[:4000],
                 "elapsed_s": round(time.time() - t0, 1), "budget_min": budget_min})


def main(argv=None) -> int:
    a = arguments(argv)
    if a.report:
        show(results.load(a.report), a.out, a.report, a.write_docs)
        return 0
    procs.install()
    path = a.results or os.path.join(a.out, "bench-data", time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + ".jsonl")
    out = results.ResultsFile(path)
    print(f"results: {path} (appended as each run ends; `bench/run.py --report {path}` prints them)",
          file=sys.stderr, flush=True)
    skip, only = set(filter(None, a.skip.split(","))), set(filter(None, a.only.split(",")))
    chosen = [s for s in SECTIONS if s not in skip and (not only or s in only)]
    out.add({"type": "start", "date": time.strftime("%Y-%m-%d", time.gmtime()),
             "command": "bench/run.py " + " ".join(sys.argv[1:] if argv is None else argv), "machine": machine(),
             "sections": chosen, "quick": a.quick, "repeat": a.repeat,
             "budgets_min": {s: a.budgets[s] for s in chosen}})
    ctx = Context(a, out)
    for name in chosen:
        run_section(name, ctx, a.budgets[name])
    show(results.load(path), a.out, path, True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The bench's results file and report (bench/results.py, bench/report.py, issue 52): every
run is a line on disk as soon as it ends, a file cut short by a killed bench still reports
what it holds, a hung baseline run is counted beside its figure and kept out of its
median, and each median says how many runs it holds. No TensorFlow, no subprocess."""

from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))

import report  # noqa: E402
import results  # noqa: E402
import run as bench_run  # noqa: E402
import sec_basic  # noqa: E402
from procs import OutOfTime  # noqa: E402


def _throughput_file(path, cut_last_line=False):
    """A bench stopped in throughput: classic sync hung twice in 4 starts, the file's last
    line cut short as a kill mid-write leaves it."""
    out = results.ResultsFile(str(path))
    out.add({"type": "start", "command": "bench/run.py --quick", "machine": "box: 2 cores", "date": "2026-12-07"})
    out.run("startup", "all_at_once", "tfps", "ok", 3.0)
    out.run("startup", "all_at_once", "classic", "ok", 6.0)
    out.add({"type": "section", "section": "startup", "status": "budget", "elapsed_s": 360.0, "budget_min": 6})
    for v in (1000.0, 1200.0, 1100.0):
        out.run("throughput", "mlp-sync", "tfps", "ok", v)
    for outcome, v in (("ok", 500.0), ("hung", None), ("ok", 700.0), ("hung", None)):
        out.run("throughput", "mlp-sync", "classic", outcome, v,
                why="a worker trained 0 steps in the 15 s after worker0's first step" if v is None else "")
    if cut_last_line:
        with open(path, "a") as fh:
            fh.write('{"type": "run", "section": "throughput", "figure": "mlp-sy')
    return str(path)


def test_each_run_is_on_disk_as_soon_as_it_is_recorded(tmp_path, capsys):
    out = results.ResultsFile(str(tmp_path / "data" / "r.jsonl"))
    out.run("throughput", "mlp-async", "tfps", "ok", 1234.5, {"first": {"worker0": 3.1}})
    line = capsys.readouterr().out
    assert "mlp-async tfps: 1234" in line
    (rec,) = results.load(str(tmp_path / "data" / "r.jsonl"))
    assert rec["value"] == 1234.5 and rec["data"]["first"]["worker0"] == 3.1 and rec["outcome"] == "ok"


def test_a_hung_run_is_counted_and_kept_out_of_the_median(tmp_path):
    records = results.load(_throughput_file(tmp_path / "r.jsonl"))
    f = results.figures(records, "throughput")[("mlp-sync", "classic")]
    assert f.values == [500.0, 700.0] and f.med() == 600.0
    assert (f.hangs, f.starts) == (2, 4) and f.hang_note() == "2 hung in 4 starts"
    assert results.hang_counts(records)[("throughput", "classic")] == (2, 4)
    assert results.hang_counts(records)[("throughput", "tfps")] == (0, 3)
    rows = {r[0]: r for r in report.throughput_rows(records)}
    row = rows["throughput mlp sync (examples/s)"]
    assert row[1] == "1100 (1000-1200, 3 runs)"
    assert row[2] == "600 (500-700, 2 runs); 2 hung in 4 starts"
    assert row[3].startswith("1.83x (medians of 3 tfps and 2 classic runs) classic")
    hangs = {r[0]: r for r in report.hang_rows(records, ("throughput",))}
    assert hangs["throughput: hung runs (counted, left out of the medians)"][1:3] == (
        "0 hung in 3 starts", "2 hung in 4 starts")


def test_a_file_cut_short_by_a_killed_bench_still_reports_its_figures(tmp_path):
    path = _throughput_file(tmp_path / "r.jsonl", cut_last_line=True)
    records = results.load(path)
    assert len([r for r in records if r["type"] == "run"]) == 9   # the cut line is left out, nothing else
    text = report.report(records)
    assert "600 (500-700, 2 runs); 2 hung in 4 starts" in text
    assert "Section throughput: the bench was stopped in it" in text
    assert "Section startup: ran out of its budget (6 min) after 360 s" in text
    assert "bench/run.py --quick" in text and "box: 2 cores" in text


def test_report_flag_prints_the_tables_of_a_partial_file(tmp_path, capsys):
    path = _throughput_file(tmp_path / "r.jsonl", cut_last_line=True)
    assert bench_run.main(["--report", path]) == 0
    out = capsys.readouterr().out
    assert "throughput mlp sync (examples/s)" in out and "2 hung in 4 starts" in out
    assert "3.00 (1 run)" in out       # start-up: a median says how many runs it holds


def test_report_writes_the_docs_parts_with_date_machine_command_runs_and_hangs(tmp_path):
    path = _throughput_file(tmp_path / "r.jsonl")
    md = tmp_path / "benchmarks.md"
    md.write_text("# Benchmarks\n\nprose\n\n" + report.BEGIN + "\nold\n" + report.END + "\n\nmore prose\n")
    assert report.write_docs(results.load(path), str(md), "bench-data/r.jsonl") == ["general"]
    text = md.read_text()
    assert "old" not in text and "prose" in text and "more prose" in text
    assert "Measured 20" in text and "`bench/run.py --quick`" in text and "box: 2 cores" in text
    assert "[r.jsonl](bench-data/r.jsonl)" in text and "2 hung in 4 starts" in text


def test_median_and_spread_say_how_many_runs():
    assert results.median([3, 1, 2]) == 2 and results.median([4, 1, 2, 3]) == 2.5
    assert results.spread([1.0, 2.0, 3.0]) == "2.00 (1.00-3.00, 3 runs)"
    assert results.spread([]) == "no run"
    assert results.ratio(results.Figure([]), results.Figure([])).startswith("n/a")


def test_a_worker_that_trains_nothing_in_the_window_is_hung_not_waited_for():
    # worker0 made its first step 20 s after t0; worker1 none, with a window of 15 s: hung at once.
    with pytest.raises(sec_basic.Hung, match="trained 0 steps in the 15 s after worker0's first step"):
        sec_basic.watch_workers(lambda: {"worker0": 0.0}, dict, lambda: True, t0=0.0, workers=2, window=15,
                                deadline=float("inf"))
    # The sync chief that does not end after the other worker did: hung too.
    with pytest.raises(sec_basic.Hung, match="had not ended 15 s after worker1 ended"):
        sec_basic.watch_workers(lambda: {"worker0": 0.0, "worker1": 0.0}, lambda: {"worker1": 0.0}, lambda: True,
                                t0=0.0, workers=2, window=15, deadline=float("inf"), end_window=15)
    # Both trained and ended: the run is complete; past the budget's deadline: OutOfTime.
    sec_basic.watch_workers(lambda: {"worker0": 0.0, "worker1": 1.0}, lambda: {"worker0": 1, "worker1": 1},
                            lambda: True, t0=0.0, workers=2, window=15, deadline=float("inf"))
    with pytest.raises(OutOfTime):
        sec_basic.watch_workers(dict, dict, lambda: True, t0=0.0, workers=2, window=15, deadline=0.0)


def test_classic_examples_s_from_the_chiefs_lines():
    out = "BENCH first_step 100.000 3\nnoise\nBENCH done 303 100.000 110.000\n"
    assert sec_basic.classic_examples_s(out, 64, sync=False) == pytest.approx(300 * 64 / 10)
    assert sec_basic.classic_examples_s(out, 64, sync=True) == pytest.approx(2 * 300 * 64 / 10)


def test_budget_flag():
    quick = bench_run.parse_budget(None, True)
    assert quick["startup"] + quick["throughput"] < 20
    assert bench_run.parse_budget("4", True)["ctr"] == 4
    b = bench_run.parse_budget("startup=2,throughput=3.5", False)
    assert (b["startup"], b["throughput"], b["ctr"]) == (2, 3.5, bench_run.BUDGET_MIN["ctr"])
    for bad, says in (("x", "not a number"), ("0", "more than 0"), ("foo=3", "no section 'foo'")):
        with pytest.raises(ValueError, match=says):
            bench_run.parse_budget(bad, True)


def test_bad_flags_are_refused_with_one_line(capsys):
    for argv in (["--budget", "nope"], ["--skip", "startup,nope"], ["--report", "/nonexistent.jsonl"]):
        with pytest.raises(SystemExit) as e:
            bench_run.arguments(argv)
        assert e.value.code == 2
        last = capsys.readouterr().err.strip().splitlines()[-1]
        assert "error: --" in last and ("budget" in last or "section" in last or "no such file" in last)


def test_results_lines_are_json_objects(tmp_path):
    path = _throughput_file(tmp_path / "r.jsonl")
    with open(path) as fh:
        assert all(isinstance(json.loads(line), dict) for line in fh)


def test_the_ctr_dynamic_and_dlrm_tables_of_a_section_stopped_halfway(tmp_path):
    out = results.ResultsFile(str(tmp_path / "r.jsonl"))
    out.add({"type": "info", "section": "ctr", "data": {"steps": 2000, "batch_size": 256}})
    out.run("ctr", "single", "single", "ok", 170000.0, {"examples_s": 170000.0, "cpu_s_per_1k_examples": 0.006})
    out.run("ctr", "tfps_1ps", "tfps", "ok", 85000.0, {"examples_s": 85000.0, "ps_peak_rss_mib": {"ps0": 1800}})
    out.run("ctr", "pss_1ps", "pss", "failed", why="ctr_tf2.py pss failed (1)")
    out.add({"type": "info", "section": "dynamic", "data": {"scale": 0.05, "steps": 400, "stream": {
        "users_seen": {"25%": 10, "100%": 40}, "active_users": 5}}})
    out.run("dynamic", "hashed", "hashed", "ok", 9000.0, {"auc_next": 0.64, "examples_s": 9000,
                                                          "examples_s_from": "progress lines",
                                                          "ps_rss_mib_25": {"ps0": 100}, "ps_rss_mib_100": {"ps0": 110}})
    out.add({"type": "info", "section": "dlrm", "data": {"vcpus": 2}})
    out.run("dlrm", "tfps_hashed", "tfps", "ok", 15000.0, {"examples_s": 15000.0, "examples_per_cpu_s": 7000.0,
                                                           "auc": 0.7, "cpu_s": {"ps0": 1.0, "worker0": 2.0}})
    text = report.report(results.load(str(tmp_path / "r.jsonl")))
    assert "85000" in text and "0.50x one process" in text
    assert "not measured" in text                       # pss, the 1 GiB table, Adam: not run
    assert "0.6400, 9000 (progress lines)" in text       # the dynamic section's hashed side
    assert "dynamic bench, dynamic" in text and "continued on 3 (AUC)" in text
    assert "DLRM tfps 1 ps + 2 workers, hashed: examples/s" in text and "15000 (1 run)" in text
    assert "Section ctr: the bench was stopped in it" in text


def test_the_ctr_window_refuses_the_few_lines_after_a_long_first_checkpoint():
    import sec_ctr
    # Issue 52 item 6, as measured: the 1 GiB table's first checkpoint ended at step 5881 of
    # 6000; the lines after it are the chief's restart at the job's end, not a steady state.
    lines = [(100.0 + i, s) for i, s in enumerate(range(0, 6001, 100))] + [(159.8, 5950)]
    with pytest.raises(ValueError, match="held 50 steps .at least 500 needed.: the chief's first checkpoint was "
                                         "complete at global step 5900 of 6000"):
        sec_ctr.steady_window(sorted(lines), 159.5, 6000, 500)
    (t0, s0), (t1, s1) = sec_ctr.steady_window(sorted(lines), 120.5, 6000, 500)
    assert (s0, s1) == (2100, 6000) and t1 - t0 == 39


def test_the_4x_table_run_trains_long_enough_for_its_first_checkpoint():
    import sec_ctr
    # A quiet machine: 75 k examples/s, the 256 MiB table's first checkpoint 4 s. The 1 GiB
    # one takes up to 6x as long, and the job makes ~7000 steps meanwhile: 3x 2000 was short.
    n = sec_ctr.steps_for_4x(2000, {"examples_s": 75000.0, "first_checkpoint_s": 4.0})
    assert n == int(2000 + 75000 * 6 * 4 / 256) == 9031
    assert sec_ctr.steps_for_4x(2000, {"examples_s": 5000.0, "first_checkpoint_s": 4.0}) == 6000   # at least 3x
    assert sec_ctr.steps_for_4x(2000, {"examples_s": 9e5, "first_checkpoint_s": 30.0}) == 20000    # at most 10x
    assert sec_ctr.steps_for_4x(2000, None) == 6000


def test_a_failed_run_keeps_what_failed_before_the_outputs_tail(tmp_path, capsys):
    class Ctx:
        section, out = "ctr", results.ResultsFile(str(tmp_path / "r.jsonl"))

        def check(self):
            pass

    def run():
        raise RuntimeError("tfps local (ctr, 2 ps): its steady window held 0 steps\n" + "progress line\n" * 500)
    assert sec_basic.measure(Ctx(), "adam_tfps_2ps", "tfps", run, lambda r: (1.0, None)) is None
    (rec,) = results.load(str(tmp_path / "r.jsonl"))
    assert rec["outcome"] == "failed" and rec["why"].startswith("tfps local (ctr, 2 ps): its steady window held 0")
    assert "steady window held 0 steps" in capsys.readouterr().out


def test_the_export_section_is_a_part_of_the_bench_and_of_its_docs(tmp_path):
    """bench/run.py --only export (bench/sec_export.py): each job's examples/s with versions and
    without, their ratio, the versions per job; a failed run counted beside its figure; the
    part written between its markers in docs/benchmarks.md."""
    a = bench_run.arguments(["--only", "export", "--quick"])
    assert a.only == "export" and a.budgets["export"] == bench_run.BUDGET_MIN_QUICK["export"]
    out = results.ResultsFile(str(tmp_path / "r.jsonl"))
    out.add({"type": "start", "command": "bench/run.py --only export", "machine": "box: 2 cores", "date": "2026-12-07"})
    out.add({"type": "info", "section": "export",
             "data": {"jobs": {"mlp-every-3s": {"model": "--model mlp", "steps": 6000, "every": "3s"}}}})
    for side, v, n in (("none", 20000.0, 0), ("versions", 19000.0, 5), ("versions", 18000.0, 6), ("none", 21000.0, 0)):
        out.run("export", "mlp-every-3s", side, "ok", v, {"examples_s": v, "versions": n})
    out.run("export", "mlp-every-3s", "versions", "failed", why="tfps local failed (1)")
    out.add({"type": "section", "section": "export", "status": "done", "elapsed_s": 100.0, "budget_min": 10})
    records = results.load(str(tmp_path / "r.jsonl"))
    (row,) = report.export_table(records)
    assert row[0] == "chief examples/s, --model mlp, 6000 steps, a version every 3s (5-6 per job)"
    assert row[1] == "18500 (18000-19000, 2 runs); 1 failed in 3 starts" and row[2] == "20500 (20000-21000, 2 runs)"
    assert row[3].startswith("0.90x (medians of 2 with and 2 without runs)") and row[4] == ">= 0.9x"
    md = tmp_path / "benchmarks.md"
    begin, end = report.MARKERS["export"]
    md.write_text(f"# Benchmarks\n\n## Versions while it trains\n\n{begin}\n{end}\n\nthe hand-made table\n")
    assert report.write_docs(records, str(md)) == ["export"]
    text = md.read_text()
    assert text.index(begin) < text.index("18500 (18000-19000") < text.index(end) < text.index("the hand-made table")


def test_the_stream_section_judges_auc_lag_and_speed_from_its_runs(tmp_path):
    """bench/run.py --only stream (bench/sec_stream.py): (a) against (c) and (b) on the last
    window and the next part, the lag in seconds from landing (not the chief's own
    "partitions behind", which counts only what it has listed), examples/s against the fixed
    list; the part written between its markers."""
    import sec_stream
    a = bench_run.arguments(["--only", "stream"])
    assert a.only == "stream" and a.budgets["stream"] == bench_run.BUDGET_MIN["stream"]
    # The lag: landing times from the writer, reached times from the chief's lines.
    lander = sec_stream.Lander([], 0.5)
    lander.started_at = 100.0
    lander.landed = {"part-0001.csv": 99.0, "part-0002.csv": 101.0, "part-0003.csv": 101.5}
    line = "[worker0] 01:00:00 I chief: stream at partition /s/{} (slice {}); newest complete /s/{}, {} partition(s) behind"
    lines = [(100.5, line.format("part-0001.csv", 0, "part-0001.csv", 0)),
             (103.0, line.format("part-0002.csv", 1, "part-0002.csv", 0)),
             (104.0, line.format("part-0003.csv", 2, "part-0003.csv", 0)),
             (110.0, "[worker0] 01:00:09 I chief: job tfps-wide_deep succeeded at step 9")]
    lag = sec_stream.lag(lines, lander)
    assert lag["partitions_live"] == 2 and lag["seconds"] == [2.0, 2.5] and lag["last_partition_lag_s"] == 2.5
    assert lag["last_landed_to_job_end_s"] == 8.5 and lag["max_behind_after_caught_up"] == 0
    out = results.ResultsFile(str(tmp_path / "r.jsonl"))
    out.add({"type": "start", "command": "bench/run.py --only stream", "machine": "box: 2 cores", "date": "2026-12-08"})
    out.run("stream", "stream", "fixed", "ok", 0.70, {"examples_s": 1000, "auc_next": 0.69, "auc_last_window": 0.70})
    out.run("stream", "stream", "follow", "ok", 0.72, {"examples_s": 950, "auc_next": 0.71, "auc_last_window": 0.72,
                                                       "lag": {**lag, "last_partition_lag_s": 30.0}})
    out.run("stream", "stream", "static", "ok", 0.66, {"auc_next": 0.65, "auc_last_window": 0.66})
    out.run("stream", "stream", "stale", "ok", 0.60, {"auc_next": 0.62})
    out.run("stream", "stream", "stale_scored", "ok", 0.61, {"points": [[10, 0.6]]})
    out.run("stream", "stream", "ceiling", "failed", why="tfps local failed (1)")
    records = results.load(str(tmp_path / "r.jsonl"))
    rows = {r[0].split(":")[0]: r for r in report.stream_table(records)}
    assert rows["(a) follow vs (c) one worker, collision-free"][4] == "within 0.01: FAIL"   # (c) not measured
    assert rows["(a) follow vs (b) first quarter, never updated"][3] == "+0.1100"
    assert rows["(a) follow vs (b)"][4] == ">= +0.02: PASS"
    assert rows["(a) lag behind the stream arriving at 0.8x the fixed list's examples/s"][4] == "<= 10 s: FAIL"
    assert rows["(a) follow vs fixed list"][3] == "0.95x" and rows["(a) follow vs fixed list"][4] == ">= 0.9x: PASS"
    md = tmp_path / "benchmarks.md"
    begin, end = report.MARKERS["stream"]
    md.write_text(f"# Benchmarks\n\n{begin}\n{end}\n")
    assert report.write_docs(records, str(md)) == ["stream"]
    text = md.read_text()
    assert "stream ceiling: tfps local failed (1)" in text and "+0.1100" in text

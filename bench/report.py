"""The bench's tables, made from its results file (bench/results.py) alone: the same
tables whether the bench ran to its end, ran out of a budget or was killed halfway
(``bench/run.py --report FILE``). Each part of docs/benchmarks.md that the bench writes
says its date, machine, command, runs per figure and hangs.

Pure Python (matplotlib only for the chart): no TensorFlow.
"""

from __future__ import annotations

import os
import time

from results import Figure, figures, hang_counts, info, ratio, section_status, spread, starts

HEADER = ("benchmark", "tfps", "baseline", "ratio", "target")
GENERAL = ("startup", "throughput")
OTHER = ("backup", "final_save", "image", "deploy")
BEGIN, END = "<!-- bench:begin (written by bench/run.py) -->", "<!-- bench:end -->"
MARKERS = {"general": (BEGIN, END),
           "other": ("<!-- bench:other:begin (written by bench/run.py) -->", "<!-- bench:other:end -->"),
           "ctr": ("<!-- bench:ctr:begin (written by bench/run.py) -->", "<!-- bench:ctr:end -->"),
           "dynamic": ("<!-- bench:dynamic:begin (written by bench/run.py) -->", "<!-- bench:dynamic:end -->"),
           "dlrm": ("<!-- bench:dlrm:begin (written by bench/run.py) -->", "<!-- bench:dlrm:end -->"),
           "export": ("<!-- bench:export:begin (written by bench/run.py) -->", "<!-- bench:export:end -->"),
           "stream": ("<!-- bench:stream:begin (written by bench/run.py) -->", "<!-- bench:stream:end -->"),
           "delta": ("<!-- bench:delta:begin (written by bench/run.py) -->", "<!-- bench:delta:end -->")}


def _cell(f: Figure | None, fmt: str) -> str:
    """A side's median with its range and runs, and its hangs and failures, if any."""
    if f is None:
        return "not measured"
    note = f.hang_note()
    return spread(f.values, fmt) + (f"; {note}" if note else "")


def startup_rows(records: list[dict]) -> list[tuple]:
    fs = figures(records, "startup")
    rows = []
    for fig, what, target, fmt in (
            ("all_at_once", "start-up, all at once: launch -> all workers training (s)", ">= 1.0x", "{:.2f}"),
            ("ps_serving_join", "start-up, ps serving: non-chief joins after the chief (s)", "within 2 s, >= 10x",
             "{:.1f}"),
            ("ps_serving", "start-up, ps serving: launch -> all workers training (s)", ">= 1.0x", "{:.2f}")):
        t, c = fs.get((fig, "tfps")), fs.get((fig, "classic"))
        if fig == "ps_serving_join":   # its hangs are those of ps_serving
            t, c = _with_hangs(t, fs.get(("ps_serving", "tfps"))), _with_hangs(c, fs.get(("ps_serving", "classic")))
        # a join of about 0 s (or below: worker1 first) counts as 0.05 s in the ratio
        floor = Figure([{"outcome": "ok", "value": max(v, 0.05)} for v in t.values]) if t else t
        r = ratio(c, floor if fig == "ps_serving_join" else t, names=("classic", "tfps"))
        rows.append((what, _cell(t, fmt), _cell(c, fmt), r.replace("x (", "x sooner (", 1), target))
    return rows


def _with_hangs(join: Figure | None, parent: Figure | None) -> Figure | None:
    if join is None or parent is None:
        return join
    return Figure(join.runs + [r for r in parent.runs if r["outcome"] != "ok"])


def throughput_rows(records: list[dict]) -> list[tuple]:
    fs = figures(records, "throughput")
    rows = []
    for model in ("mlp", "cnn"):
        single = fs.get((f"{model}-single", "single"))
        for mode in ("async", "sync"):
            t, c = fs.get((f"{model}-{mode}", "tfps")), fs.get((f"{model}-{mode}", "classic"))
            if t is None and c is None:
                continue
            rows.append((f"throughput {model} {mode} (examples/s)", _cell(t, "{:.0f}"), _cell(c, "{:.0f}"),
                         f"{ratio(t, c, names=('tfps', 'classic'))} classic; "
                         f"{ratio(t, single, names=('tfps', 'one-process'))} one process",
                         ">= 1.3x classic, >= 0.6x one process" if mode == "async" else ""))
        a, s = fs.get((f"{model}-async", "tfps")), fs.get((f"{model}-sync", "tfps"))
        if a and s and a.med() and s.med():
            rows.append((f"throughput {model}: sync/async (tfps)", ratio(s, a, names=("sync", "async")), "", "", ""))
        if single:
            rows.append((f"throughput {model}: one process (examples/s)", "", _cell(single, "{:.0f}"), "", ""))
    return rows


def backup_rows(records: list[dict]) -> list[tuple]:
    fs, meta = figures(records, "backup"), info(records, "backup")
    freeze = meta.get("freeze_s", "?")
    rows = []
    for backup in (1, 0):
        f = fs.get((f"backup_{backup}", "tfps"))
        if f is None:
            continue
        d = f.data()
        what = "3 workers, 1 backup" if backup else "3 workers, no backup"
        rows.append((f"sync, worker2 frozen {freeze} s, {what}: steps in the freeze / the {freeze} s before",
                     f"{spread([x['steps_frozen'] for x in d], '{:.0f}')} / "
                     f"{spread([x['steps_before'] for x in d], '{:.0f}')}",
                     "", f"{spread(f.values)} of the steps lost", "<= 0.10 lost" if backup else ""))
        rows.append((f"sync, worker2 frozen {freeze} s, {what}: whole job (examples/s)",
                     spread([x["examples_s"] for x in d], "{:.0f}"), "", "", ""))
    return rows


def other_rows(records: list[dict]) -> list[tuple]:
    rows = []
    for (label, _), f in figures(records, "final_save").items():
        done = all(x.get("complete") for x in f.data())
        rows.append((f"final save, {label} of variables (s)", _cell(f, "{:.1f}"), "",
                     "complete" if f.values and done else "CUT SHORT or not measured",
                     "complete within 1800 s default"))
    for (_, side), f in figures(records, "image").items():
        gb = f.med()
        image = (f.data() or [{}])[0].get("image", side)
        official = 1.76
        rows.append((f"CPU image size (GB, {image})", f"{gb:.2f}" if gb else "n/a", f"{official:.2f} (official)",
                     f"{gb / official:.2f}x" if gb else "", "<= 1.2 GB"))
    fs = figures(records, "deploy")
    if fs:
        first, second = fs.get(("first_s", "tfps")), fs.get(("second_s", "tfps"))
        rows.append(("ansible deploy, first run (s)", _cell(first, "{:.0f}"), "", "", ""))
        changed = (second.data() or [{}])[0].get("changed") if second else None
        rows.append(("ansible deploy, no-change run (s)", _cell(second, "{:.1f}"), "", f"changed={changed}",
                     "changed=0, < 30 s"))
    return rows


def hang_rows(records: list[dict], sections) -> list[tuple]:
    """Per section: each side's hung runs in its starts (tfps's should be 0)."""
    counts = hang_counts(records)
    rows = []
    for s in sections:
        sides = {side: counts[(sec, side)] for sec, side in counts if sec == s and side in ("tfps", "classic")}
        if "classic" in sides:
            cell = {k: f"{h} hung in {n} starts" for k, (h, n) in sides.items()}
            rows.append((f"{s}: hung runs (counted, left out of the medians)", cell.get("tfps", ""),
                         cell.get("classic", ""), "", "tfps 0"))
    return rows


def general_rows(records: list[dict]) -> list[tuple]:
    return [*startup_rows(records), *throughput_rows(records), *hang_rows(records, GENERAL)]


def more_rows(records: list[dict]) -> list[tuple]:
    return [*backup_rows(records), *other_rows(records)]


def ctr_table(records: list[dict]) -> list[tuple]:
    from sec_ctr import ctr_rows
    return ctr_rows({name: {**(f.data()[0] if f.data() else {}), "examples_s": f.med()}
                     for (name, _), f in figures(records, "ctr").items() if f.values})


def dynamic_table(records: list[dict]) -> list[tuple]:
    from sec_dynamic import dynamic_rows
    r = info(records, "dynamic")
    r.update({name: f.data()[0] for (name, _), f in figures(records, "dynamic").items() if f.values})
    return dynamic_rows(r)


def dlrm_table(records: list[dict]) -> list[tuple]:
    from sec_dlrm import dlrm_rows
    return dlrm_rows(info(records, "dlrm"), {name: f.data() for (name, _), f in figures(records, "dlrm").items()})


def export_table(records: list[dict]) -> list[tuple]:
    from sec_export import export_rows
    return export_rows(records)


def stream_table(records: list[dict]) -> list[tuple]:
    from sec_stream import stream_rows
    return stream_rows(records)


def delta_table(records: list[dict]) -> list[tuple]:
    from sec_delta import delta_rows
    return delta_rows(records)


PARTS = {"general": (GENERAL, general_rows), "other": (OTHER, more_rows), "ctr": (("ctr",), ctr_table),
         "dynamic": (("dynamic",), dynamic_table),
         "dlrm": (("dlrm",), dlrm_table), "export": (("export",), export_table),
         "stream": (("stream",), stream_table),
         "delta": (("delta",), delta_table)}


def measured(records: list[dict], sections) -> bool:
    return any(r.get("type") in ("run", "section") and r.get("section") in sections for r in records)


def preamble(records: list[dict], sections, data_link: str = "") -> str:
    """Date, machine, command, load, runs per figure and each section's status."""
    st = starts(records)
    first = st[0] if st else {}
    runs = [r for r in records if r.get("type") == "run" and r.get("section") in sections]
    loads = [r["load1"] for r in runs if isinstance(r.get("load1"), (int, float))]
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(runs[0]["t"])) if runs else first.get("date", "?")
    out = [f"Measured {when} with `{first.get('command', 'bench/run.py')}` on {first.get('machine', 'unknown')}."]
    if loads:
        out.append(f"Load average (1 min) as the runs ended: {min(loads):.1f} to {max(loads):.1f}.")
    out.append(f"{len(runs)} runs in all; each figure is the median of its completed runs, the range and the "
               "number of runs in brackets; a hung or failed run is counted beside its figure, never in it.")
    for s in sections:
        end = section_status(records, s)
        if end is None and measured(records, (s,)):
            out.append(f"Section {s}: the bench was stopped in it; the figures it had measured are shown.")
        elif end and end.get("status") == "budget":
            out.append(f"Section {s}: ran out of its budget ({end.get('budget_min')} min) after "
                       f"{end.get('elapsed_s', 0):.0f} s; the figures it had measured are shown.")
        elif end and end.get("status") == "failed":
            out.append(f"Section {s}: failed ({(end.get('why') or '').splitlines()[0][:300]}).")
    failed = [r for r in runs if r["outcome"] == "failed"]
    if failed:
        out.append("Failed runs (recorded, not in the figures): " + "; ".join(
            f"{r['figure']} {r['side']}: {(r.get('why') or '?').splitlines()[0][:200]}" for r in failed) + ".")
    if data_link:
        out.append(f"Raw results (JSON lines, one record a run): [{os.path.basename(data_link)}]({data_link}).")
    return " ".join(out)


def table(rows) -> str:
    widths = [max(len(str(r[i])) for r in [HEADER, *rows]) for i in range(5)]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths)) for r in [HEADER, *rows])


def markdown(rows) -> list[str]:
    return ["| " + " | ".join(HEADER) + " |", "|" + "---|" * 5,
            *("| " + " | ".join(str(c) for c in r) + " |" for r in rows)]


def report(records: list[dict]) -> str:
    """Every part measured in ``records``, as text tables (what the bench prints)."""
    out = []
    for part, (sections, rows) in PARTS.items():
        if measured(records, sections):
            out += [f"== {part}", preamble(records, sections), table(rows(records)), ""]
    return "\n".join(out)


def write_docs(records: list[dict], path: str, data_link: str = "") -> list[str]:
    """Rewrite each measured part of docs/benchmarks.md (``path``); the parts written."""
    done = []
    for part, (sections, rows) in PARTS.items():
        if measured(records, sections):
            chart_link = ["", "![benchmarks](benchmarks.png)"] if part == "general" else []
            body = "\n".join([preamble(records, sections, data_link), "", *markdown(rows(records)), *chart_link, ""])
            write_section(path, body, *MARKERS[part])
            done.append(part)
    return done


def write_section(path: str, body: str, begin: str = BEGIN, end: str = END) -> None:
    """Replace one generated part of docs/benchmarks.md (``begin`` to ``end``), keep the
    prose and the other parts around it."""
    text = open(path).read() if os.path.exists(path) else "# Benchmarks\n"
    if begin not in text:
        text += "\n" + begin + "\n" + end + "\n"
    head, rest = text.split(begin, 1)
    tail = rest.split(end, 1)[1] if end in rest else ""
    with open(path, "w") as fh:
        fh.write(head + begin + "\n" + body + "\n" + end + tail)


def chart(records: list[dict], path: str) -> None:
    """Bars at the medians, whiskers over the range of the runs (throughput and start-up)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def bars(ax, groups: dict[str, dict[str, Figure]], who_offsets, width):
        for off, who in who_offsets:
            st = [g.get(who) for g in groups.values()]
            med = [f.med() or 0 if f else 0 for f in st]
            err = [[m - (min(f.values) if f and f.values else m) for m, f in zip(med, st)],
                   [(max(f.values) if f and f.values else m) - m for m, f in zip(med, st)]]
            ax.bar([i + off for i in range(len(st))], med, width=width, yerr=err, capsize=3, label=who)
        ax.set_xticks(list(range(len(groups))), list(groups), fontsize=8)
        ax.legend(fontsize=8)

    tp, su = figures(records, "throughput"), figures(records, "startup")
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    groups = {}
    for (name, side), f in tp.items():
        key = name.replace("-single", "-async") if side == "single" else name
        groups.setdefault(key, {})[side] = f
    for (name, side), f in tp.items():   # one process beside sync too
        if side == "single" and name.replace("-single", "-sync") in groups:
            groups[name.replace("-single", "-sync")]["single"] = f
    if groups:
        bars(axes[0], groups, ((-0.27, "tfps"), (0, "classic"), (0.27, "single")), 0.27)
        axes[0].set_ylabel("examples/s (median, range)")
        axes[0].set_title("training throughput (1 ps + 2 workers)")
    sg = {}
    for (name, side), f in su.items():
        if name in ("all_at_once", "ps_serving"):
            sg.setdefault(name.replace("_", " "), {})[side] = f
    if sg:
        bars(axes[1], sg, ((-0.2, "tfps"), (0.2, "classic")), 0.4)
        axes[1].set_ylabel("s, launch -> all workers training")
        axes[1].set_title("start-up (median, range)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)

"""The tutorials' output blocks come from docs/gen_outputs.py: every block names a known
output and every output has its block (tests/integration/test_docs_quick_outputs.py compares the
quick ones with a fresh run; tests/integration/test_async_job.py the first job's)."""

from __future__ import annotations

import sys

import docblocks

sys.path.insert(0, str(docblocks.DOCS))
import gen_outputs  # noqa: E402


def test_every_output_block_names_an_output_and_every_output_has_its_block():
    found = gen_outputs.markers()
    assert set(found) == set(gen_outputs.OUTPUTS), (sorted(found), sorted(gen_outputs.OUTPUTS))
    for key, page in found.items():
        assert page == gen_outputs.OUTPUTS[key].page, (key, page)
        assert gen_outputs.blocks(page)[key].strip(), f"docs/{page}: the {key} block is empty"


def test_the_commands_are_the_pages():
    # Each output's command is one the page gives (a block of its own, or a line of one).
    for key, out in gen_outputs.OUTPUTS.items():
        text = (docblocks.DOCS / out.page).read_text(encoding="utf-8")
        for argv in out.commands:
            assert "tfps " + " ".join(argv) in text, f"docs/{out.page} does not give `tfps {' '.join(argv)}` ({key})"


def test_times_do_not_make_an_output_stale_but_a_change_does():
    a = "# Written by tfps slurm 0.2.0 on 2026-12-07 21:25 UTC\n#SBATCH --output=runs/x-20261207-212521.slurm\n"
    b = "# Written by tfps slurm 0.2.0 on 2027-01-02 08:00 UTC\n#SBATCH --output=runs/x-20270102-080000.slurm\n"
    assert gen_outputs.same(a, b)
    assert not gen_outputs.same(a, a.replace("0.2.0", "0.3.0"))


def test_write_fills_only_its_block(tmp_path, monkeypatch):
    page = tmp_path / "page.md"
    marker = "<!-- output: {} (written by `make docs-outputs` from a real run; do not edit) -->\n"
    page.write_text("intro\n" + marker.format("a") + "```text\nold a\n```\nmiddle\n"
                    + marker.format("b") + "```text\n```\nend\n")
    monkeypatch.setattr(gen_outputs, "DOCS", tmp_path)
    monkeypatch.setitem(gen_outputs.OUTPUTS, "b", gen_outputs.Output("page.md", ()))
    assert gen_outputs.write("b", "new b\n")
    assert page.read_text() == ("intro\n" + marker.format("a") + "```text\nold a\n```\nmiddle\n"
                                + marker.format("b") + "```text\nnew b\n```\nend\n")
    assert not gen_outputs.write("b", "new b\n")

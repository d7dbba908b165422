"""The documentation site (issue 50): a short README, a docs site that builds with --strict,
reference pages that cannot drift from the code, and nothing of the old README lost."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"


def _generator():
    spec = importlib.util.spec_from_file_location("gen_reference", DOCS / "gen_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_generated_reference_pages_are_current():
    """docs/reference/{cli,role-variables,results-schema}.md and the generated block of
    exit-codes.md are what docs/gen_reference.py writes from the code today."""
    gen = _generator()
    assert gen.stale() == [], "out of date: run python docs/gen_reference.py"


def test_the_generated_pages_hold_every_option_variable_field_and_code():
    gen = _generator()
    from tfps import cli, compat
    from tfps.cluster.variables import catalogue
    from tfps.exitcodes import ExitCode
    from tfps.outcome.contract import JobResult
    cli_page = gen.cli_page()
    local = compat.subcommands(cli.build_parser())["local"]
    for action in compat.parser_actions(local):
        if action.option_strings and action.help != "==SUPPRESS==" and action.dest != "help":
            assert f"`{action.option_strings[-1].replace('_', '-')}" in cli_page, action.option_strings
    assert "| `--train-steps TRAIN_STEPS` | `1000` |" in cli_page
    role = gen.role_page()
    assert all(f"| `{name}` |" in role for name in catalogue())
    results = gen.results_page()
    assert all(f"| `{name}` |" in results for name in JobResult.__dataclass_fields__ if name != "extra")
    assert "## Restart" in results and "## Versions" in results
    codes = gen.exit_codes_block()
    assert all(f"| {code.value} | `{code.name}` |" in codes for code in ExitCode)


def test_a_stale_page_is_named(tmp_path, monkeypatch):
    """The check fails, naming the page, when the code changes under a generated page."""
    gen = _generator()
    monkeypatch.setattr(gen, "REF", tmp_path)
    (tmp_path / "exit-codes.md").write_text((DOCS / "reference" / "exit-codes.md").read_text())
    for path, text in gen.pages().items():
        path.write_text(text)
    assert gen.stale() == []
    monkeypatch.setattr(gen, "exit_codes_block", lambda: gen.BEGIN + "| 0 | `OK` | a new meaning |\n" + gen.END)
    monkeypatch.setattr(gen, "role_page", lambda: "# Role variables\n\n| `tfps_new` | str |\n")
    assert gen.stale() == [str(tmp_path / "role-variables.md"), str(tmp_path / "exit-codes.md")]
    assert gen.main(["--check"]) == 1


def test_the_site_builds_with_strict(tmp_path):
    """mkdocs build --strict (in-process, about 4 s): a broken link or anchor, or a page left
    out of the nav, fails it. The site works from file:// (use_directory_urls: false)."""
    from mkdocs.commands.build import build
    from mkdocs.config import load_config
    config = load_config(str(REPO / "mkdocs.yml"), site_dir=str(tmp_path / "site"), strict=True)
    assert config["use_directory_urls"] is False
    build(config)
    site = tmp_path / "site"
    assert (site / "index.html").is_file() and (site / "tutorials" / "first-job.html").is_file()
    assert (site / "reference" / "cli.html").is_file() and (site / "console-status.svg").is_file()
    assert not list(site.rglob("*.py")), "the generators are not pages"


def test_a_broken_link_fails_the_build(tmp_path):
    import shutil

    from mkdocs.commands.build import build
    from mkdocs.config import load_config
    from mkdocs.exceptions import Abort
    docs = tmp_path / "docs"
    shutil.copytree(DOCS, docs)
    (docs / "tutorials" / "index.md").write_text((docs / "tutorials" / "index.md").read_text()
                                                 + "\n[gone](first-job.md#no-such-section)\n")
    config = load_config(str(REPO / "mkdocs.yml"), docs_dir=str(docs), site_dir=str(tmp_path / "site"),
                         strict=True)
    with pytest.raises(Abort):
        build(config)


def test_the_readme_is_short_and_starts_people_off():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    blocks = re.findall(r"```sh\n(.*?)```", text, re.S)
    assert any("make demo" in b and "make test" in b for b in blocks)
    launchers = [line for line in text.splitlines() if re.match(r"\| `tfps (local|compose|deploy|slurm)", line)]
    assert len(launchers) == 4
    for link in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (REPO / link).is_file(), link


#: Each section of the README before issue 50 (its heading), the page that holds it now, and
#: the last words of the section, which show that it moved whole. Lines were moved verbatim;
#: only headings and links to other pages were rewritten.
OLD_README = [
    ("Quick start", "tutorials/first-job.md", "ETA 0:27  slowest worker0 -59%  0:15"),
    ("Commands", "reference/commands.md", "tfps completion bash > tfps.bash && bash -n tfps.bash"),
    ("Cluster flags: classic flags or TF_CONFIG", "tutorials/classic-script.md",
     "When both flags and TF_CONFIG are given they must agree."),
    ("Run options (the same for `tfps run` and `tfps local`)", "reference/run-options.md",
     "a unit test checks it bit for bit against SyncReplicasOptimizer."),
    ("Your own model", "tutorials/keras-model.md", "`examples/custom_model.py`. Or write a Keras model:"),
    ("Your Keras model", "tutorials/keras-model.md", "The chief's `history.jsonl` records carry it too."),
    ("The compiled optimizer: every setting honoured, or refused by name", "reference/keras.md",
     "`examples/keras_model.py`."),
    ("Recommendation and CTR models", "tutorials/ctr.md", "process trains on the same 2 cores:"),
    ("The end of a job", "explanation/job-end.md",
     "one message per job; if it dies without one, the orchestrator sends the failure message."),
    ("A job knows its settings", "how-to/stop-resume.md", "`tfps compose --replace` puts `--replace` in the file."),
    ("tfps never deletes what it did not write", "reference/data.md", "to restore such a checkpoint, saying how"),
    ("results.json", "how-to/results.md", "per failure it learns of, and one at the end (a later run in the same"),
    ("Exit codes", "reference/exit-codes.md", "stopped everything at once: no final save |"),
    ("One machine: docker compose", "how-to/compose.md", "http://127.0.0.1:6006."),
    ("The image", "how-to/compose.md", "(`FROM tfps` + `COPY mymodels /opt/usermodels`)."),
    ("Your servers: Ansible", "tutorials/ansible.md", "Everything else, including every variable:"),
    ("Slurm", "tutorials/slurm.md", "(Debian 12's slurm-wlm in three containers, tests/system/test_slurm.py)."),
    ("Notifications", "how-to/notify.md", "logged, written into results or baked into images (docs/security.md)."),
    ("Tests and benchmarks", "explanation/layout.md", "unit and integration tests; their output (`.test-system.log`)"),
    ("Layout", "explanation/layout.md", "they never call a task."),
]


@pytest.mark.parametrize("heading, page, last_words", OLD_README, ids=[h for h, _, _ in OLD_README])
def test_each_old_readme_section_lives_on_its_page(heading, page, last_words):
    text = (DOCS / page).read_text()
    assert heading in text, f"{page} has no {heading!r}"
    assert last_words in text, f"{page} lost the end of {heading!r}"
    assert page in (REPO / "mkdocs.yml").read_text(), f"{page} is not in the site's nav"

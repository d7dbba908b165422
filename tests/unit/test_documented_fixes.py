"""Documented behaviour that once did not hold as written (issue 38's list): each is checked
here against the code or against the text."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from tfps import cli
from tfps.exitcodes import ExitCode

REPO = Path(__file__).resolve().parents[2]
#: The pages that now hold what the README said (issue 50 moved it into the docs site).
RUN_OPTIONS = (REPO / "docs" / "reference" / "run-options.md").read_text()
COMMANDS = (REPO / "docs" / "reference" / "commands.md").read_text()
CTR = (REPO / "docs" / "tutorials" / "ctr.md").read_text()


def test_plan_refuses_a_vars_file_beside_its_directory(capsys, tmp_path):
    """Ansible reads group_vars/all/ instead of group_vars/all.yml: the example inventory's
    comment promises that tfps plan refuses both, instead of planning with the defaults."""
    inv = tmp_path / "mycluster"
    (inv / "group_vars" / "all").mkdir(parents=True)
    (inv / "hosts.yml").write_text((REPO / "inventory" / "example" / "hosts.yml").read_text())
    (inv / "group_vars" / "all.yml").write_text("tfps_job_name: mine\n")
    (inv / "group_vars" / "all" / "vault.yml").write_text("tfps_notify_urls: []\n")
    code = cli.main(["plan", "-i", str(inv)])
    err = capsys.readouterr().err
    assert code == ExitCode.BAD_CONFIG
    assert err.splitlines() == [
        f"tfps: error: inventory: {inv}/group_vars/all.yml is ignored by Ansible because {inv}/group_vars/all/ "
        "exists; move the file into the directory (e.g. group_vars/all/vars.yml)"]
    assert "refuses an inventory that has both" in (REPO / "inventory/example/group_vars/all.yml").read_text()


def test_the_vault_recipe_moves_all_yml_into_all_first():
    text = (REPO / "docs" / "ansible.md").read_text()
    recipe = text[text.index("The notification URLs belong in a Vault file"):]
    recipe = recipe[:recipe.index("```", recipe.index("```sh") + 5)]
    assert recipe.index("mkdir inventory/mycluster/group_vars/all") < recipe.index("vault.yml")
    assert "group_vars/all/vars.yml" in recipe


def test_compose_creates_the_output_directory(tmp_path, capsys):
    out = tmp_path / "my-job" / "docker-compose.yml"
    assert cli.main(["compose", "--ps", "1", "--workers", "1", "-o", str(out)]) == ExitCode.OK
    assert out.is_file()


def test_compose_help_does_not_offer_notify(capsys):
    cli.main(["compose", "--help"])
    assert "--notify URL" not in capsys.readouterr().out


def test_the_built_in_models_are_listed_everywhere():
    from tfps import models
    names = ", ".join(models.BUILTIN)
    role = REPO / "tfps" / "ansible" / "roles" / "tfps"
    assert f"({names})" in (role / "defaults" / "main.yml").read_text()
    spec = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())
    assert f"({names})" in spec["argument_specs"]["main"]["options"]["tfps_model"]["description"]


def test_each_run_option_has_one_row():
    rows = re.findall(r"^\| (`--[^|]+)\|", RUN_OPTIONS, re.M)
    options = [o for row in rows for o in re.findall(r"`(--[a-z_]+)`", row.split("|")[0])]
    assert "--optimizer" in options
    assert len(options) == len(set(options)), sorted(o for o in options if options.count(o) > 1)


def test_the_plan_table_is_described_as_it_prints():
    row = next(line for line in COMMANDS.splitlines() if line.startswith("| `tfps plan"))
    assert "`--format json` adds each task's flags, TF_CONFIG, container name and command" in row


def test_the_ctr_figures_are_for_the_command_shown():
    """A 64 MiB table is split only with --partition_mb below 64; the figures quoted are
    what that command prints (MB meaning MiB)."""
    assert "--train_steps 3000 --partition_mb 32" in CTR
    assert "ps0 96, ps1 96`" not in CTR and "ps0 96, ps1 96.02" in CTR
    assert "ps0 0.02, ps1 192" in CTR


def test_the_wide_deep_auc_is_what_the_default_run_gives():
    """`tfps local --model wide_deep` with the defaults: eval AUC 0.665 on the demo data."""
    assert "AUC of about 0.70" not in CTR and "at an AUC of about 0.67 (0.665 measured)" in CTR

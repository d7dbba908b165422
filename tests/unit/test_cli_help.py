"""The tfps command's own help: dashed names, one-line errors with "did you mean", examples,
-V, --config job files, shell completion and the playbook commands' command lines."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tfps import cli, cli_tools, playbooks
from tfps.backends.ansible import playbook_args
from tfps.config import dashed
from tfps.exitcodes import ExitCode
from tfps.launch import playbook

REPO = Path(__file__).resolve().parents[2]


def _run(capsys, *argv):
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_help_shows_dashed_names_and_ends_with_examples(capsys):
    code, out, _ = _run(capsys, "local", "--help")
    assert code == ExitCode.OK
    assert "--train-steps" in out and "--train_steps" not in out and "--no-sync-replicas" in out
    assert out.rstrip().splitlines()[-3].startswith("  tfps local")
    assert "examples:" in out
    for name in set(cli_tools.EXAMPLES) - {"tfps"}:   # the commands' help ends with their examples
        code, out, _ = _run(capsys, name, "--help")
        assert code == ExitCode.OK and "examples:\n  tfps" in out, name


def test_dashed_collapses_the_alias_listed_twice():
    assert dashed("--vault_id ID, --vault-id ID  help") == "--vault-id ID  help"
    assert dashed("[--no-sync_replicas] tfps_train_steps --x") == "[--no-sync-replicas] tfps_train_steps --x"


@pytest.mark.parametrize("argv, line", [
    (["local", "--train-stpes", "5"],
     "tfps: error: unrecognized arguments: --train-stpes; did you mean --train-steps? (see tfps local --help)"),
    (["locl"], "tfps: error: 'locl' is not a tfps command; did you mean local? (see tfps --help)"),
    (["local", "--train_steps", "x"], "tfps: error: train_steps: invalid int value: 'x' (see tfps local --help)"),
])
def test_a_usage_error_is_one_line_with_did_you_mean(capsys, argv, line):
    code, out, err = _run(capsys, *argv)
    assert code == ExitCode.BAD_CONFIG and err.splitlines() == [line] and out == ""


def test_version_names_what_tfps_runs_with(capsys):
    for flag in ("-V", "--version"):
        code, out, _ = _run(capsys, flag)
        assert code == ExitCode.OK
        assert re.match(r"tfps \d+\.\d+\.\d+\nTensorFlow .+\ntf_keras .+\nansible-core .+\nPython 3", out), out


def test_a_job_file_gives_options_and_flags_win(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("train-steps: 7\nbatch_size: 16\nsync_replicas: true\nnotify: [a://x, b://y]\n"
                   "model_arg: {depth: 3}\n")
    parser = cli.build_parser()
    argv = cli_tools.expand_config(["local", "--config", str(job), "--batch_size", "8"], parser)
    ns = parser.parse_args(argv)
    assert (ns.train_steps, ns.batch_size, ns.sync_replicas, ns.notify, ns.model_arg) == \
        (7, 8, True, ["a://x", "b://y"], ["depth=3"])
    run = cli_tools.expand_config(["-v", "run", f"--config={job}", "--job_name", "ps"], parser)
    assert run[:3] == ["-v", "run", "--train_steps=7"] and "--config" not in " ".join(run)


@pytest.mark.parametrize("text, line", [
    ("trainsteps: 3\n", "'trainsteps' is not an option of tfps local; did you mean train-steps?"),
    ("- 1\n", "holds a list; give a mapping of option: value lines"),
    ("a: [\n", "is not valid YAML"),
])
def test_a_bad_job_file_is_refused_in_one_line(capsys, tmp_path, text, line):
    job = tmp_path / "job.yaml"
    job.write_text(text)
    code, _, err = _run(capsys, "local", "--config", str(job))
    assert code == ExitCode.BAD_CONFIG and len(err.splitlines()) == 1 and line in err, err
    assert err.startswith("tfps: error: config: ")


def test_config_is_an_option_of_run_local_and_compose_only(capsys, tmp_path):
    (tmp_path / "j.yaml").write_text("{}\n")
    code, _, err = _run(capsys, "--config", str(tmp_path / "j.yaml"), "plan", "-i", "x")
    assert code == ExitCode.BAD_CONFIG and "put it after the command" in err


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_completion_is_generated_from_the_parser(capsys, shell):
    code, out, _ = _run(capsys, "completion", shell)
    assert code == ExitCode.OK and "complete -o default -F _tfps tfps" in out
    assert "local) opts=" in out and "--train-steps" in out and "deploy) opts=" in out
    assert "notify_test" not in out


def test_playbook_commands_pass_options_through_to_ansible_playbook(tmp_path):
    (tmp_path / "hosts.ini").write_text("[ps]\na\n")
    ns = cli.build_parser().parse_args(cli.normalize_argv(
        ["deploy", "-i", str(tmp_path / "hosts.ini"), "-e", "tfps_train_steps=5", "--vault-id", "dev@prompt",
         "--check", "--diff", "--", "--limit", "a", "-vv"]))
    argv = playbook.playbook_argv(ns.playbook_command, ns.inventory, playbook_args(ns), ns.check, ns.diff,
                                  ns.playbook_options)
    assert argv[-12:] == [str(playbooks.ansible_dir() / "deploy.yml"), "-i", str(tmp_path / "hosts.ini"),
                          "-e", "tfps_train_steps=5", "--vault-id", "dev@prompt", "--check", "--diff",
                          "--limit", "a", "-vv"]
    assert Path(argv[0]).name in ("ansible-playbook", "python") or argv[1:3] == ["-m", "ansible"]


def test_the_ansible_files_are_package_data_and_the_checkout_links_them():
    assert playbooks.ansible_dir() == REPO / "tfps" / "ansible"
    assert (REPO / "ansible").resolve() == playbooks.ansible_dir().resolve()
    for name in playbooks.PLAYBOOKS.values():
        assert playbooks.playbook(name).is_file()
    assert (playbooks.role_dir() / "meta" / "argument_specs.yml").is_file()


def test_a_missing_collection_is_one_line_naming_the_command(monkeypatch, tmp_path):
    monkeypatch.setattr(playbooks, "collections_path", lambda environ=None: [str(tmp_path)])
    monkeypatch.setattr(playbooks.sys, "path", [])
    monkeypatch.setenv("TFPS_INSTALL_COLLECTIONS", "0")
    from tfps.errors import ConfigError
    with pytest.raises(ConfigError) as e:
        playbook.ensure_collections()
    assert str(e.value).startswith("collections: the Ansible collections community.docker 4.8.5")
    assert "install with: tfps collections" in str(e.value) and "\n" not in str(e.value)


def test_the_collections_come_from_the_ansible_release_the_ci_script_pins():
    script = (REPO / ".ci" / "ansible-collections.sh").read_text()
    assert f"ANSIBLE_RELEASE={playbook.ANSIBLE_RELEASE}\n" in script
    assert f"ANSIBLE_WHEEL_SHA256={playbook.ANSIBLE_WHEEL_SHA256}\n" in script


def test_every_option_of_every_command_has_help():
    parser = cli.build_parser()
    missing = {name: [a.option_strings[-1] if a.option_strings else a.dest for a in sub._actions if a.help is None]
               for name, sub in parser._subparsers._group_actions[0].choices.items()}
    assert {name: m for name, m in missing.items() if m} == {}


def _laughs() -> bytes:
    """The "billion laughs": nine levels of nine aliases of the level below (9**9 values), under
    an option whose list the job file's flags were made of (one string of gigabytes)."""
    lines = ["notify:", '- &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi"):
        lines.append(f"- &{name} [{','.join([f'*{prev}'] * 9)}]")
    return ("\n".join(lines) + "\n").encode()


@pytest.mark.parametrize("raw, line", [
    (b"train_steps: 5\nrun_name: caf\xe9\n", "is not UTF-8 text (byte 0xe9 at offset 28); save it as UTF-8"),
    (b'sync_replicas: "false"\n', "sync_replicas: 'false' is not true or false; write true or false without quotes"),
    (b"notify_started: 'no'\n", "notify_started: 'no' is not true or false"),
    (_laughs(), "stands for more than 10000 values once its YAML aliases (*name) are expanded"),
    (b"model_arg: &a [*a]\n", "nests values deeper than 20 levels (or an alias holds itself)"),
    (b"[" * 50000, "nests values deeper than 20 levels"),
    (b"# " + b"x" * (1 << 20) + b"\n", "is larger than 1048576 bytes; a job file is option: value lines"),
])
def test_a_job_file_that_is_not_utf8_quotes_a_switch_or_expands_without_bound_is_one_line(capsys, tmp_path,
                                                                                         raw, line):
    job = tmp_path / "job.yaml"
    job.write_bytes(raw)
    code, out, err = _run(capsys, "local", "--config", str(job), "--model_dir", str(tmp_path / "m"))
    assert code == ExitCode.BAD_CONFIG and len(err.splitlines()) == 1 and line in err, err
    assert err.startswith(f"tfps: error: config: {job}"), err
    assert not (tmp_path / "m").exists()

"""The parts of the ``tfps`` command around its subcommands: ``--version``, ``--config``
job files, shell completion and the examples that end each command's help."""

from __future__ import annotations

import argparse
import platform
import shlex
from importlib import metadata

from tfps import __version__, compat
from tfps.config import did_you_mean, job_flags, load_job_file
from tfps.errors import ConfigError

#: The examples at the end of each command's --help (2-3 each, as people type them).
EXAMPLES = {
    "tfps": """\
  tfps local --ps 1 --workers 2 --train-steps 500        a job on this machine
  tfps plan -i inventory/example                          what a deploy would start
  tfps deploy -i inventory/mycluster -e tfps_train_steps=5000""",
    "run": """\
  tfps run --ps-hosts h1:2222 --worker-hosts h2:2222,h3:2222 --job-name worker --task-index 0
  TF_CONFIG='{"cluster": ..., "task": {"type": "ps", "index": 0}}' tfps run --train-steps 1000
  tfps run --config job.yaml --job-name ps --task-index 0 --ps-hosts h1:2222 --worker-hosts h2:2222""",
    "local": """\
  tfps local --ps 1 --workers 2                              the demo model on the demo data
  tfps local --model mymodels.small:build_model --train-data 'data/*.csv' --train-steps 2000
  tfps local --config job.yaml --train-steps 100            the job file's settings, fewer steps""",
    "plan": """\
  tfps plan -i inventory/example
  tfps plan -i hosts.ini -e tfps_train_steps=500 --format json""",
    "jobs": """\
  tfps jobs -i inventory/mycluster
  tfps jobs -i hosts.ini --vault-password-file ~/.vault_pass
  tfps jobs --slurm                                        this user's jobs under Slurm""",
    "logs": """\
  tfps logs -i inventory/mycluster myjob                   the chief's last 100 lines
  tfps logs -i inventory/mycluster myjob ps0 -f            follow ps0
  tfps logs --slurm myjob worker1 -f                       a Slurm job's worker1 (name or job id)""",
    "deploy": """\
  tfps deploy -i inventory/mycluster
  tfps deploy -i inventory/mycluster --check --diff          what would change; changes nothing
  tfps deploy -i hosts.ini -e tfps_train_steps=5000 -- --limit ps:worker -vv""",
    "stop": """\
  tfps stop -i inventory/mycluster
  tfps stop -i inventory/mycluster -e tfps_job_name=myjob""",
    "status": """\
  tfps status -i inventory/mycluster""",
    "cleanup": """\
  tfps cleanup -i inventory/mycluster
  tfps cleanup -i inventory/mycluster -- --limit host2""",
    "collections": """\
  tfps collections                                          once, before the first deploy""",
    "compose": """\
  tfps compose --ps 1 --workers 2 -o my-job/docker-compose.yml
  tfps compose -i inventory/example -o compose/docker-compose.yml
  tfps compose --gpus 0,1 --config job.yaml -o gpu/docker-compose.yml""",
    "notify-test": """\
  tfps notify-test --notify 'mailto://user:pass@example.com'
  tfps notify-test --notify-config ~/.config/tfps/notify.yml""",
    "notify-failure": """\
  tfps notify-failure --reason 'chief container exited 137' --notify-config notify.yml""",
    "healthcheck": """\
  tfps healthcheck          (the image's HEALTHCHECK runs it; exit 0 when the port answers)""",
    "demo-data": """\
  tfps demo-data data/      then: tfps local --train-data 'data/train-*.csv'""",
    "completion": """\
  tfps completion bash > ~/.local/share/bash-completion/completions/tfps
  tfps completion zsh > ~/.zfunc/_tfps          (with fpath+=~/.zfunc in ~/.zshrc)""",
}

#: The commands whose options a ``--config`` job file may hold.
CONFIG_COMMANDS = ("run", "local", "compose", "slurm")


def versions() -> str:
    """``tfps -V``: tfps and the versions of what it runs with (installed distributions, not imported)."""
    def version(*names: str) -> str:
        for name in names:
            try:
                return f"{metadata.version(name)}" + ("" if name == names[0] else f" ({name})")
            except metadata.PackageNotFoundError:
                continue
        return "not installed"

    return "\n".join([
        f"tfps {__version__}",
        f"TensorFlow {version('tensorflow', 'tensorflow-cpu', 'tensorflow-gpu')}",
        f"tf_keras {version('tf_keras')}",
        f"ansible-core {version('ansible-core')}",
        f"Python {platform.python_version()}",
    ])


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """dest -> action of every option the parser takes (the names a job file may use)."""
    return {a.dest: a for a in compat.parser_actions(parser) if a.option_strings and a.dest not in ("help", "config")}


def expand_config(argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """``tfps local --config job.yaml --train_steps 5`` -> the file's options as flags, then the
    command line's: flags win (a repeatable option given on the command line replaces the
    file's list). Keys are the options' names, with dashes or underscores; an unknown key is
    refused by name. ``argv`` is normalized (underscores)."""
    if "--config" not in argv and not any(a.startswith("--config=") for a in argv):
        return argv
    cut = argv.index("--") if "--" in argv else len(argv)
    head, tail = argv[:cut], argv[cut:]
    commands = compat.subcommands(parser)
    command = next((a for a in head if a in CONFIG_COMMANDS and a in commands), None)
    out, path = [], None
    i = 0
    while i < len(head):
        a = head[i]
        if a == "--config" or a.startswith("--config="):
            if a == "--config":
                if i + 1 >= len(head):
                    raise ConfigError("give the job file: --config job.yaml", "config")
                path, i = head[i + 1], i + 2
            else:
                path, i = a.split("=", 1)[1], i + 1
            continue
        out.append(a)
        i += 1
    if command is None or path is None:
        raise ConfigError(f"--config is an option of tfps {', '.join(c for c in CONFIG_COMMANDS if c in commands)}; "
                          "put it after the command",
                          "config")
    sub = commands[command]
    options = _options(sub)
    given = {a[2:].split("=", 1)[0] for a in out if a.startswith("--")}
    flags: list[str] = []
    for key, value in load_job_file(path).items():
        dest = str(key).replace("-", "_")
        action = options.get(dest)
        if action is None:
            hint = did_you_mean(key, options)
            raise ConfigError(f"{path}: {key!r} is not an option of tfps {command}{hint}", "config")
        names = [o[2:] for o in action.option_strings if o.startswith("--")]
        if any(n in given or f"no-{n}" in given for n in names):
            continue   # the command line wins
        flags.extend(job_flags(action, value, path))
    at = out.index(command) + 1
    return out[:at] + flags + out[at:] + tail


def completion(shell: str, parser: argparse.ArgumentParser) -> str:
    """A bash or zsh completion script for ``tfps``, generated from the parser: commands,
    and each command's options (dashed names)."""
    choices = compat.subcommands(parser)
    top = sorted(o for a in compat.parser_actions(parser) for o in a.option_strings)
    commands = sorted(n for n in choices if "_" not in n)
    per = {n: sorted({o.replace("_", "-") if o.startswith("--") else o
                      for a in compat.parser_actions(p) for o in a.option_strings})
           for n, p in choices.items() if "_" not in n}
    cases = "\n".join(f"        {n}) opts={shlex.quote(' '.join(per[n]))} ;;" for n in commands)
    body = f"""_tfps() {{
    local cur cmd opts w
    cur="${{COMP_WORDS[COMP_CWORD]}}"
    cmd=""
    for w in "${{COMP_WORDS[@]:1:COMP_CWORD-1}}"; do
        case "$w" in -*) ;; *) cmd="$w"; break ;; esac
    done
    if [ -z "$cmd" ]; then
        opts={shlex.quote(' '.join(commands + top))}
    else
        case "$cmd" in
{cases}
        *) opts="" ;;
        esac
    fi
    if [[ "$cur" == -* || -z "$cmd" ]]; then
        COMPREPLY=( $(compgen -W "$opts" -- "$cur") )
    else
        COMPREPLY=( $(compgen -f -- "$cur") )
    fi
}}
complete -o default -F _tfps tfps
"""
    if shell == "bash":
        return "# bash completion for tfps (tfps completion bash)\n" + body
    if shell == "zsh":
        return ("#compdef tfps\n# zsh completion for tfps (tfps completion zsh), through bashcompinit\n"
                "autoload -U +X bashcompinit && bashcompinit\n" + body)
    raise ConfigError(f"{shell!r}: give bash or zsh", "shell")

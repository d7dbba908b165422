"""tfps completion bash, sourced by bash: commands, then each command's dashed options."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tfps import cli, cli_tools


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("words, cword, want", [
    ("tfps lo", 1, "local logs"),
    ("tfps local --train-s", 2, "--train-steps"),
    ("tfps -v deploy --ch", 3, "--check"),
    ("tfps compose --con", 2, "--config"),
])
def test_bash_completes_commands_and_options(tmp_path, words, cword, want):
    script = tmp_path / "tfps.bash"
    script.write_text(cli_tools.completion("bash", cli.build_parser()))
    done = subprocess.run(["bash", "-c", f'source {script}; COMP_WORDS=({words}); COMP_CWORD={cword}; _tfps; '
                                         'echo "${COMPREPLY[@]}"'], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.split() == want.split(), done.stdout + done.stderr

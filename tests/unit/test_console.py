"""``tfps local``'s console: what it says about a classic script's directory, and the job's
live status line (tfps.launch.console) rendered from the chief's status.json."""

from __future__ import annotations

import os

from tfps.launch.processes import _script_dir


def test_the_start_line_names_only_a_directory_the_script_is_given():
    assert _script_dir([]) == ""
    assert _script_dir(["--train_steps", "10"]) == ""
    assert _script_dir(["--train_dir", "/tmp/x", "--steps", "3"]) == "the script's --train_dir /tmp/x"
    assert _script_dir(["--log-dir=rel"]) == f"the script's --log-dir {os.path.abspath('rel')}"

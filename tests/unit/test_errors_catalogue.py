"""docs/errors.md's refusals, injected through the real command line (issue 35, "Done when").

``CATALOGUE`` holds, for rows of the docs/errors.md table (keyed by their field and message
cells as the table writes them), the command line (and files) that make tfps print that
row. A seeded draw of 20 rows runs each through ``cli.main`` in-process, as ``tfps`` would,
and checks the one line on stderr against the row (``‹...›`` parts match anything) and exit
code 2. Refusals come before anything starts, so no task, no TensorFlow server, no
model_dir. ``TFPS_ERRORS_SEED=N`` draws with another seed; ``TFPS_ERRORS_SEED=all`` runs every
entry.
"""

from __future__ import annotations

import os
import random
import re
from pathlib import Path

import pytest

from tfps import cli

REPO = Path(__file__).resolve().parents[2]
DRAW = 20
SEED = os.environ.get("TFPS_ERRORS_SEED", "35")

CLUSTER = ["--ps_hosts", "127.0.0.1:1", "--worker_hosts", "127.0.0.1:2,127.0.0.1:3"]
USER_FILE = "services:\n  db:\n    image: postgres\n"

#: "FIELD | MESSAGE" as docs/errors.md writes the row -> the argv after `tfps` ({tmp}: a
#: fresh directory; files it needs are made by FILES[key]).
CATALOGUE: dict[str, list[str]] = {
    # tfps/cli.py
    "restarts | ‹restarts› is negative; use 0 (never) or how many times to restart": ["local", "--restarts", "-1"],
    "restarts | restarts tfps's own tasks only; drop --restarts with --script":
        ["local", "--restarts", "1", "--script", "{tmp}/train.py"],
    "replace | concerns the model_dir of tfps's own tasks only; drop --replace with --script":
        ["local", "--replace", "--script", "{tmp}/train.py"],
    "task | ‹task› is not a task name; use ps0, ps1, ..., worker0 (the chief), worker1, ...":
        ["logs", "-i", "{tmp}/inventory", "job", "chief"],
    "lines | --lines ‹lines›: give at least 1": ["logs", "-i", "{tmp}/inventory", "job", "worker0", "-n", "0"],
    "directory | ‹path› is a file, not a directory; give a new or existing directory for the demo data":
        ["demo-data", "{tmp}/a-file"],
    "directory | cannot write the demo data to ‹where›: ‹strerror›; give a directory this user may write, on a disk "
    "with room": ["demo-data", "{tmp}/a-file/sub"],
    # tfps/cluster/gpu.py
    "gpus | ‹text› lists GPU ‹gpu› twice; one worker per GPU": ["local", "--gpus", "0,0"],
    "gpus | ‹text› has an empty item; give ‹kind›, separated by single commas": ["local", "--gpus", "0,,1"],
    "workers | --workers ‹workers› does not match ‹ids› GPU id(s) in --gpus; a GPU worker per GPU, so drop --workers":
        ["local", "--gpus", "0,1", "--workers", "3"],
    # tfps/cluster/spec.py
    "cluster | no cluster given; pass --ps_hosts, --worker_hosts, --job_name and --task_index, or set TF_CONFIG "
    "(see `tfps plan`)": ["run"],
    "job_name | wrong job name ‹job›; use ps or worker‹extra›": ["run", *CLUSTER, "--job_name", "boss",
                                                              "--task_index", "0"],
    "‹field› | ‹what› ‹text› has no port; write it as host:port, e.g. ‹text›:2222":
        ["run", "--ps_hosts", "ps0", "--worker_hosts", "127.0.0.1:2", "--job_name", "ps", "--task_index", "0"],
    "‹field› | ‹what› ‹text› has port ‹port›; use a port in 1..65535":
        ["run", "--ps_hosts", "h:70000", "--worker_hosts", "127.0.0.1:2", "--job_name", "ps", "--task_index", "0"],
    "‹field› | ‹prefix›‹index› is out of range for ‹n› ‹noun›; use 0..‹n›":
        ["run", *CLUSTER, "--job_name", "worker", "--task_index", "5"],
    # tfps/config/
    "embedding | unknown embedding ‹embedding›; use hashed (shared hash buckets) or dynamic (a row per id, with "
    "admission and eviction)": ["local", "--embedding", "sparse"],
    "embedding | the built-in model ‹model› has no id tables; --embedding dynamic is for ‹join› or your own model "
    "(tfps.layers.DynamicEmbedding)": ["local", "--model", "mlp", "--embedding", "dynamic"],
    "‹field› | is an option of dynamic tables; add --embedding dynamic, or drop --‹field›":
        ["local", "--model", "wide_deep", "--steps-to-live", "100"],
    "replicas_to_aggregate | ‹replicas_to_aggregate› is more than the ‹num_workers› worker(s) of the cluster, so no "
    "sync step could ever complete; use at most the number of workers":
        ["local", "--sync_replicas", "--replicas_to_aggregate", "5"],
    "backup_workers | ‹backup_workers› backup worker(s) of ‹num_workers› worker(s) leave no gradient to aggregate; "
    "use at most ‹num_workers›": ["local", "--sync_replicas", "--backup_workers", "2"],
    "backup_workers | ‹backup_workers› backup worker(s) of ‹num_workers› mean ‹num_workers› gradient(s) per step, "
    "and --replicas_to_aggregate says ‹replicas_to_aggregate›; give one of the two":
        ["local", "--workers", "3", "--sync_replicas", "--backup_workers", "1", "--replicas_to_aggregate", "1"],
    "replicas_to_aggregate | is used only by synchronous training; add --sync_replicas, or drop "
    "--replicas_to_aggregate": ["local", "--replicas_to_aggregate", "2"],
    "num_classes | must be 0 (regression) or the number of classes (>= 2)": ["local", "--num_classes", "-1"],
    "num_classes | 1 class cannot be learned; use 0 for regression or >= 2 classes": ["local", "--num_classes", "1"],
    "checkpoint_secs | give checkpoint_steps or checkpoint_secs, not both":
        ["local", "--checkpoint_steps", "10", "--checkpoint_secs", "60"],
    "final_save_timeout | ‹final_save_timeout› s is too short to write a final checkpoint and export; use at least "
    "‹MIN_FINAL_SAVE_TIMEOUT› (default ‹DEFAULT_FINAL_SAVE_TIMEOUT›)": ["local", "--final_save_timeout", "5"],
    "optimizer | unknown optimizer ‹optimizer›; use one of ‹join›": ["local", "--optimizer", "lion"],
    "hidden_units | layer sizes must be positive, e.g. 64,32": ["local", "--hidden_units", "64,0"],
    "hidden_units | ‹hidden_units› is not a comma-separated list of integers, e.g. 64,32":
        ["local", "--hidden_units", "64;32"],
    "model | unknown model ‹model›; ‹hint›use one of ‹join› or package.module:function": ["local", "--model", "mpl"],
    "model_dir | must name a directory for checkpoints and results": ["local", "--model_dir", ""],
    "model_args | ‹pair› is not KEY=VALUE with KEY a Python name (e.g. --model_arg units=128)":
        ["local", "--model_arg", "1units=128"],
    "model_args | ‹key›=‹text›: the value must be one number, string, true/false or null":
        ["local", "--model_arg", "units=[1, 2]"],
    "model_args | ‹key› is given twice; give each builder argument once":
        ["local", "--model_arg", "units=1", "--model_arg", "units=2"],
    "‹field› | must be a positive ‹value›, got ‹value›": ["local", "--batch_size", "0"],
    "‹field› | ‹value› is too large: TensorFlow counts in 64-bit integers, so use at most ‹MAX_INT64_FLAG›":
        ["local", "--train_steps", str(2**63)],
    "‹field› | ‹value› is too large: ‹why›; use at most ‹most›": ["local", "--partition_mb", "1e308"],
    "epochs | counts each worker's own passes over its data, which synchronous training cannot end on: a sync "
    "step waits for the gradients of workers that ran out; drop --sync_replicas (asynchronous), or drop --epochs "
    "and size --train_steps": ["local", "--sync_replicas", "--epochs", "2"],
    "backup_workers | is used only by synchronous training (asynchronous training never waits for a slow worker); "
    "add --sync_replicas, or drop --backup_workers": ["local", "--backup_workers", "1"],
    "‹field› | must be a number of seconds, 0 to turn it off; got ‹value›": ["local", "--stall_timeout", "-1"],
    "run_name | ‹name› holds ‹what›; a run name names one directory under runs/, so use letters, digits and -_.=[] "
    "(e.g. exp-lr0.01)": ["local", "--run_name", "exp/1"],
    "run_name | ‹name› is not a name; give the run a name of its own (e.g. exp-lr0.01)": ["local", "--run_name", ".."],
    # tfps/data/dataset.py and tfps/data/csvcheck.py (through tfps local's checks before start)
    "‹field› | no files match ‹pattern›; check the path (relative to ‹getcwd›) and the glob":
        ["local", "--train_data", "{tmp}/nothing-*.csv"],
    "‹field› | ‹path›:‹lineno› has ‹row› columns, the header has ‹header›; fix or remove that row":
        ["local", "--train_data", "{tmp}/short-row.csv"],
    "‹field› | ‹path› is empty; a CSV needs a header row and at least one data row":
        ["local", "--train_data", "{tmp}/empty.csv"],
    # tfps/launch/compose.py
    "notify | notification URLs hold passwords and tokens and do not belong in a compose file; write them to a file "
    "owned by uid ‹UID› with mode 0400 and pass --notify_urls_file FILE (see docs/security.md)":
        ["compose", "--notify", "json://localhost"],
    "restart_policy | ‹restart_policy› is not a restart policy; use no, always, unless-stopped or on-failure[:N]":
        ["compose", "--restart_policy", "sometimes"],
    "pids_limit | is ‹pids_limit›; TensorFlow needs a few hundred threads, use at least 256 (default "
    "‹DEFAULT_PIDS_LIMIT›)": ["compose", "--pids_limit", "10"],
    "pids_limit | is ‹pids_limit›; use at most ‹MAX_PIDS_LIMIT› (Linux's largest pid_max)":
        ["compose", "--pids_limit", str(10**22)],
    "log_max_file | is ‹log_max_file›; keep at least 1 log file": ["compose", "--log_max_file", "0"],
    "‹field› | ‹value› is not a size; use a number with b, k, m or g, e.g. 8g": ["compose", "--ps_memory", "8 GB"],
    "‹field› | is ‹value›; use a positive number of CPUs, e.g. 2 or 0.5 (at most ‹MAX_CPUS›)":
        ["compose", "--worker_cpus", "inf"],
    "‹field› | is ‹value›; a job needs at least one ps and one worker": ["compose", "--ps", "0"],
    "‹field› | ‹value› is not on the ‹VOLUME› volume; use a path under /data (default ‹MODEL_DIR›)":
        ["compose", "--model_dir", "/tmp/model"],
    "‹field› | ‹path› does not exist; Docker would mount an empty root-owned directory instead":
        ["compose", "--data_dir", "{tmp}/no-such-dir"],
    "inventory | take the layout from the inventory or from ‹join›, not both":
        ["compose", "-i", "{tmp}/inventory", "--ps", "1"],
    "notify_urls_file | cannot read ‹path› (‹strerror›); ‹fix›": ["compose", "--notify_urls_file", "{tmp}/no-urls"],
    "output | ‹path› is a directory; give -o the compose file to write, e.g. ‹join›": ["compose", "-o", "{tmp}"],
    "output | ‹path› exists and tfps compose did not write it (its first lines are not a tfps compose header), so it "
    "was left as it is; give -o a new file, or move that one away": ["compose", "-o", "{tmp}/user-compose.yml"],
    "output | cannot write ‹path›: ‹strerror›; give -o a path this user may write":
        ["compose", "-o", "{tmp}/a-file/docker-compose.yml"],
    # tfps/launch/processes.py
    "‹'ps' if num_ps < 1 else 'workers'› | a cluster needs at least 1 ps and 1 worker": ["local", "--ps", "0"],
    "script | ‹script› does not exist": ["local", "--script", "{tmp}/no-such-script.py"],
    # issue 51's third adversarial round
    "directory | ‹path› holds files tfps did not write (‹shown›); give a new or empty directory for the demo data":
        ["demo-data", "{tmp}"],
    "‹field› | ‹path› holds a control character (‹bad›); name the directory with printable characters only "
    "(e.g. runs/exp1)": ["local", "--model_dir", "{tmp}/exp\nrm -rf x"],
    "run_name | ‹name› starts or ends with white space; give the name without it (e.g. ‹strip›)":
        ["local", "--run_name", " exp1"],
    "‹field› | ‹path› is not UTF-8 text (byte 0x‹raw› at offset ‹start›); save it as UTF-8":
        ["local", "--config", "{tmp}/latin1.yml"],
    "‹field› | ‹where›: ‹dest›: ‹value› is not true or false; write true or false without quotes":
        ["local", "--config", "{tmp}/quoted-false.yml"],
    "‹field› | ‹path› stands for more than ‹MAX_JOB_FILE_VALUES› values once its YAML aliases (*name) are "
    "expanded; write the options out instead of nesting anchors in each other": ["local", "--config", "{tmp}/laughs.yml"],
    "‹field› | ‹value› holds ‹bad›, which an #SBATCH line of the script cannot carry; give ‹what› without it":
        ["slurm", "--partition", "a\nb", "-o", "{tmp}/job.sbatch"],
    "‹field› | ‹path› exists and tfps slurm did not write it (its first lines are not a tfps slurm script), so it "
    "was left as it is; give -o a new file, or move that one away": ["slurm", "-o", "{tmp}/user-compose.yml"],
}

#: The files every entry may use, written into {tmp} first.
FILES = {
    "a-file": "not a directory\n",
    "train.py": "print('a classic script')\n",
    "inventory": "[ps]\nh1\n[worker]\nh2\n",
    "short-row.csv": "f0,f1,label\n1,2,0\n3,4\n",
    "empty.csv": "",
    "user-compose.yml": USER_FILE,
    "latin1.yml": "train_steps: 10  # caf\xe9\n".encode("latin-1"),
    "quoted-false.yml": 'sync_replicas: "false"\n',
    "laughs.yml": "a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
                  "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n",
}


def table_rows() -> set[str]:
    """"FIELD | MESSAGE" of every row of docs/errors.md, as its cells read (``\\|`` unescaped)."""
    rows = set()
    for line in (REPO / "docs" / "errors.md").read_text().splitlines():
        if not line.startswith("| ") or line.startswith(("| field ", "|---")):
            continue
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        rows.add(f"{cells[0]} | {cells[1]}")
    return rows


def pattern(key: str) -> re.Pattern:
    """The line a row promises: ``tfps: error: FIELD: MESSAGE``, each ``‹...›`` matching anything."""
    field, message = key.split(" | ", 1)
    text = message if field == "(none)" else f"{field}: {message}"
    parts = re.split(r"‹[^›]*›", text)
    # The table writes each run of whitespace as one space.
    return re.compile("tfps: error: " + ".*".join(r"\s+".join(map(re.escape, p.split(" "))) for p in parts), re.S)


def drawn() -> list[str]:
    keys = sorted(CATALOGUE)
    if SEED == "all":
        return keys
    return random.Random(int(SEED)).sample(keys, DRAW)


def test_the_catalogue_covers_enough_rows_of_the_table():
    rows = table_rows()
    missing = [k for k in CATALOGUE if k not in rows]
    assert not missing, f"catalogue entries whose row is no longer in docs/errors.md (reworded?): {missing}"
    assert len(CATALOGUE) >= 30


def test_a_row_does_not_match_another_rows_line():
    line = "tfps: error: num_classes: 1 class cannot be learned; use 0 for regression or >= 2 classes"
    assert pattern("num_classes | 1 class cannot be learned; use 0 for regression or >= 2 classes").fullmatch(line)
    assert not pattern("num_classes | must be 0 (regression) or the number of classes (>= 2)").fullmatch(line)
    assert not pattern("‹field› | must be a positive ‹value›, got ‹value›").fullmatch(line)
    assert pattern("‹field› | ‹value› is not a size; use a number with b, k, m or g, e.g. 8g").fullmatch(
        "tfps: error: ps_memory: '8 GB' is not a size; use a number with b, k, m or g, e.g. 8g")


@pytest.mark.parametrize("key", drawn(), ids=lambda key: re.sub(r"\W+", "-", key)[:70])
def test_a_documented_refusal_gives_its_line_and_exit_2(key, tmp_path, monkeypatch, capsys):
    for name, text in FILES.items():
        (tmp_path / name).write_bytes(text) if isinstance(text, bytes) else (tmp_path / name).write_text(text)
    before = sorted(p.name for p in tmp_path.iterdir())
    for var in ("TF_CONFIG", "APPRISE_URLS", "APPRISE_URLS_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)   # tfps local's default model_dir (runs/...) would land here
    argv = [a.replace("{tmp}", str(tmp_path)) for a in CATALOGUE[key]]
    if argv[0] == "local" and "--model_dir" not in argv:
        argv += ["--model_dir", str(tmp_path / "model")]
    code = cli.main(argv)
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2, (argv, out, err)
    assert len(lines) == 1, (argv, err)
    assert pattern(key).fullmatch(lines[0]), f"tfps {' '.join(argv)}\n  printed: {lines[0]}\n  row:     {key}"
    assert sorted(p.name for p in tmp_path.iterdir()) == before   # nothing started, nothing written

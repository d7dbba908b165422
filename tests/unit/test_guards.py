"""The guards before a job starts: directories tfps may write, batch sizes that fit, loopback binds."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tfps.config import RunConfig
from tfps.errors import ConfigError
from tfps.outcome import results
from tfps.task.net.loopback import is_loopback_host
from tfps.task.setup import JobSetup


def refused(field: str, fn, *args) -> str:
    with pytest.raises(ConfigError) as info:
        fn(*args)
    assert info.value.field == field, str(info.value)
    return str(info.value)


def test_an_empty_or_new_or_own_export_dir_is_accepted(tmp_path):
    results.check_export_dir(str(tmp_path / "new"), str(tmp_path / "model"))
    (tmp_path / "empty").mkdir()
    results.check_export_dir(str(tmp_path / "empty"), str(tmp_path / "model"))
    own = tmp_path / "own"
    own.mkdir()
    (own / results.EXPORT_MARKER).write_text('{"global_step": 5, "checkpoint": "m/model.ckpt-5", '
                                             '"completed_at": "2026-01-01T00:00:00+0000"}')
    (own / "saved_model.pb").write_bytes(b"x")
    (own / "notes.txt").write_text("a user's file in a tfps export: carried into the next export")
    results.check_export_dir(str(own), str(tmp_path / "model"))


def test_an_export_dir_with_other_files_or_a_file_or_the_model_dir_is_refused(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / "notes.txt").write_text("x")
    assert "holds files that tfps did not write (notes.txt)" in refused(
        "export_dir", results.check_export_dir, str(d), str(tmp_path / "m"))
    f = tmp_path / "f"
    f.write_text("x")
    assert "is a file" in refused("export_dir", results.check_export_dir, str(f), str(tmp_path / "m"))
    assert "is or holds the model_dir" in refused("export_dir", results.check_export_dir, str(tmp_path),
                                                  str(tmp_path / "m"))
    assert (d / "notes.txt").read_text() == "x" and f.read_text() == "x"


def test_a_model_dir_with_other_files_is_refused_and_tfps_own_is_resumed(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / "a").write_text("x")
    (d / "b").write_text("x")
    assert "(a, b)" in refused("model_dir", results.check_model_dir, str(d), {"run_name": "j"})
    own = tmp_path / "own"
    assert results.claim_model_dir(str(own), {"run_name": "j"}) is False
    (own / "history.jsonl").write_text("")
    assert results.check_model_dir(str(own), {"run_name": "j"}) is False


@pytest.fixture
def mount(tmp_path):
    """A small tmpfs, mounted for the test (these tests run as root, as CI does)."""
    mounted = []

    def make(options: str):
        d = tmp_path / f"mnt{len(mounted)}"
        d.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(d)], check=True)
        mounted.append(d)
        return d
    yield make
    for d in mounted:
        subprocess.run(["umount", str(d)], check=False)


def test_a_read_only_or_full_disk_is_refused_before_start(mount):
    ro = mount("ro,size=1m")
    assert "Read-only file system" in refused("model_dir", results.check_writable_dir, str(ro / "m"), "model_dir")
    small = mount("size=4m")
    assert "only 4 MiB free" in refused("model_dir", results.check_writable_dir, str(small / "m"), "model_dir")
    assert os.listdir(small) == []   # the probe left nothing


def test_a_batch_that_cannot_fit_the_host_is_refused(tmp_path):
    setup = JobSetup(RunConfig(batch_size=10_000_000).validate())
    per = setup.batch_bytes()
    assert per > 10_000_000 * 4 * 3 * setup.schema.feature_shape[0]
    assert "much smaller --batch_size" in refused("batch_size", setup.check_batch_fits, 2, per)
    setup.check_batch_fits(1, per)          # exactly fits one worker


@pytest.mark.parametrize("host, loopback", [("127.0.0.1", True), ("127.1.2.3", True), ("localhost", True),
                                            ("[::1]", True), ("10.0.0.2", False), ("ps-0", False),
                                            ("0.0.0.0", False)])
def test_which_addresses_are_loopback(host, loopback):
    assert is_loopback_host(host) is loopback


def test_a_tensorflow_server_on_a_loopback_address_listens_there_only():
    """In a fresh interpreter: TensorFlow's server for 127.0.0.1:PORT listens on 127.0.0.1 only,
    and a plain Python socket's wildcard bind is untouched by the change."""
    code = """
import os, socket
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import tensorflow as tf
from tfps.task.net.loopback import ensure_loopback_bind
assert ensure_loopback_bind()
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
server = tf.distribute.Server(tf.train.ClusterSpec({"ps": [f"127.0.0.1:{port}"]}), job_name="ps",
                              task_index=0, start=True)
other = socket.socket(); other.bind(("0.0.0.0", 0)); other.listen()
print(port, other.getsockname()[1])
with tf.compat.v1.Session(server.target) as sess:
    print(int(sess.run(tf.constant(2) + 3)))
mine = set()
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    for line in open(table).read().splitlines()[1:]:
        f = line.split()
        if f[3] == "0A" and int(f[1].split(":")[1], 16) in (port, other.getsockname()[1]):
            mine.add((int(f[1].split(":")[1], 16), f[1].split(":")[0]))
print(sorted(mine))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    port, other = map(int, lines[0].split())
    assert lines[1] == "5"   # the server works
    import ast
    listening = ast.literal_eval(lines[2])   # (port, hex address) of every listening socket of the two
    assert [a for p, a in listening if p == port] == ["0100007F"]    # 127.0.0.1 only, nothing on IPv6
    assert [a for p, a in listening if p == other] == ["00000000"]   # our own wildcard bind stays wildcard


def _got_offsets_one_by_one(path: str, symbol: str) -> list[int]:
    """The GOT slots of ``symbol``, read relocation by relocation (what tfps did before it
    read them as arrays): the reference for ``loopback._got_offsets``."""
    import mmap
    import struct
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as elf:
        shoff, = struct.unpack_from("<Q", elf, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", elf, 0x3A)
        sections = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
        dynsym = next(s for s in sections if s[1] == 11)
        strtab, wanted, found = sections[dynsym[6]], symbol.encode() + b"\0", []
        for s in sections:
            if s[1] != 4 or s[6] != sections.index(dynsym):
                continue
            for off in range(s[4], s[4] + s[5], 24):
                r_offset, r_info, _ = struct.unpack_from("<QQq", elf, off)
                st_name, = struct.unpack_from("<I", elf, dynsym[4] + (r_info >> 32) * 24)
                start = strtab[4] + st_name
                if (r_info & 0xFFFFFFFF) in (6, 7, 1025, 1026) and elf[start:start + len(wanted)] == wanted:
                    found.append(r_offset)
        return found


def test_the_got_slots_read_as_arrays_are_those_read_one_by_one():
    """``ensure_loopback_bind`` finds TensorFlow's ``bind`` slot at every task's start: read as
    arrays (about 0.07 s), the slots of libc functions TensorFlow calls are exactly the
    ones a relocation-by-relocation reading finds; a name TensorFlow never calls has none."""
    pytest.importorskip("tensorflow")
    code = ("import json, sys\n"
            "import tensorflow\n"
            "from tfps.task.net import loopback\n"
            "print(json.dumps(loopback._library_mapping()[0]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    import json

    from tfps.task.net import loopback
    path = json.loads(out.stdout.strip().splitlines()[-1])
    for symbol in ("bind", "connect", "listen", "tfps_no_such_symbol"):
        slots = loopback._got_offsets(path, symbol)
        assert slots == _got_offsets_one_by_one(path, symbol), symbol
        assert bool(slots) is (symbol != "tfps_no_such_symbol"), (symbol, slots)

"""tfps slurm --bind_interface: the interface's address on this machine, the script's step line,
and the refusals (the bind itself runs on the Slurm test cluster, tests/system/test_slurm.py)."""

from __future__ import annotations

import socket

import pytest

from tfps import cli
from tfps.cluster import slurm as cluster_slurm
from tfps.errors import ConfigError
from tfps.launch import slurm
from tfps.task.net import loopback

BASE = dict(name="job", num_ps=1, num_workers=2, model_dir="/shared/m", slurm_dir="/shared/m.slurm",
            workdir="/shared", python="/opt/venv/bin/python", run_options=["--train_steps", "100"], grace=1830)


def test_an_interfaces_ipv4_address_is_read_from_the_kernel():
    assert cluster_slurm.interface_address("lo") == "127.0.0.1"
    for _, name in socket.if_nameindex():
        try:
            address = cluster_slurm.interface_address(name)
        except ConfigError:   # an interface without IPv4 (IPv6 only, or down)
            continue
        socket.inet_aton(address)


@pytest.mark.parametrize("name, words", [
    ("nosuch0", "this node has no IPv4 address on interface nosuch0"),
    ("eth0; rm -rf /", "is not a network interface name"),
    ("", "is not a network interface name"),
])
def test_an_unknown_interface_is_one_line(name, words):
    with pytest.raises(ConfigError, match=words):
        cluster_slurm.interface_address(name)


def test_the_step_binds_every_task_to_the_interface():
    step = next(line for line in slurm.sbatch_script(**BASE, bind_interface="ib0").splitlines()
                if "tfps.launch.slurm_step" in line)
    assert "--bind_interface ib0 " in step
    assert "--bind_interface" not in slurm.sbatch_script(**BASE)


def test_a_bad_interface_name_is_refused_before_anything_is_written(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["slurm", "--bind-interface", "eth0 ib0", "--model_dir", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bind_interface: 'eth0 ib0' is not a network interface name" in err
    assert list(tmp_path.iterdir()) == []


def test_the_address_bind_takes_one_ipv4_address_only():
    for bad in ("0.0.0.0", "::1", "10.0.0"):
        with pytest.raises(ValueError):
            loopback.ensure_address_bind(bad)

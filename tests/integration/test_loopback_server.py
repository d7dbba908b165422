"""A cluster on 127.0.0.2 works (issue 35 item 22): tfps's server start makes each task listen
on its own loopback address, not on 127.0.0.1 where its peers do not look for it."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest
from integration_helpers import REPO, base_env

pytestmark = pytest.mark.integration

CODE = """
import os, socket, sys
import tensorflow as tf
from tfps.cluster import TaskRef
from tfps.config import RunConfig
from tfps.task.runtime.session import start_server

def free(host):
    s = socket.socket(); s.bind((host, 0)); port = s.getsockname()[1]; s.close(); return port

host = sys.argv[1]
ps, worker = f"{host}:{free(host)}", f"{host}:{free(host)}"
servers = [start_server(TaskRef.resolve(ps, worker, job, 0), RunConfig()) for job in ("ps", "worker")]
graph = tf.Graph()
with graph.as_default():
    with tf.device("/job:ps/task:0"):   # the worker reaches the ps at 127.0.0.2 over gRPC
        value = tf.constant(2) + 3
    config = tf.compat.v1.ConfigProto(operation_timeout_in_ms=60000)
    with tf.compat.v1.Session(servers[1].target, graph=graph, config=config) as sess:
        print(int(sess.run(value)))
ports = {int(a.rsplit(":")[1]) for a in (ps, worker)}
listening = set()
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    for line in open(table).read().splitlines()[1:]:
        f = line.split()
        if f[3] == "0A" and int(f[1].split(":")[1], 16) in ports:
            listening.add(f[1].split(":")[0])
print(sorted(listening))
"""


def test_a_cluster_on_127_0_0_2_listens_there_and_works():
    out = subprocess.run([sys.executable, "-c", CODE, "127.0.0.2"], capture_output=True, text=True, timeout=300,
                         cwd=str(REPO), env=base_env(TF_CPP_MIN_LOG_LEVEL="3"))
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert lines[-2] == "5"                                  # the ps answered the worker
    assert ast.literal_eval(lines[-1]) == ["0200007F"]       # both on 127.0.0.2 only: no wildcard, no 127.0.0.1

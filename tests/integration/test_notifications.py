"""Completion messages from real local-cluster jobs, to a real SMTP server and a real webhook.

One successful job is configured with three services at once through ``APPRISE_URLS``: an
SMTP server that requires a password full of URL-special characters, a ``json://``
webhook, and a URL whose port nothing listens on. The job must succeed regardless, each
reachable service must get exactly one message with both attachments, the dead one must be
logged as failed with its URL masked, and the password must appear nowhere: not in the
output, the results, the model directory, or any process's command line.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from urllib.parse import quote

import pytest
from integration_helpers import base_env, read_results, run_flags
from servers import free_port

pytestmark = pytest.mark.integration

PASSWORD = "p@ss%w;rd/1"   # every character apprise URLs trip over
USER = "ops"


def _cmdlines() -> list[str]:
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                out.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:
                pass
    return out


def _attachment_names(msg) -> dict[str, bytes]:
    return {part.get_filename(): part.get_payload(decode=True) for part in msg.iter_attachments()}


@pytest.mark.parametrize("smtp_server", [{"auth": (USER, PASSWORD)}], indirect=True)
def test_success_message_by_email_and_webhook_dead_url_and_no_secret_anywhere(procs, tmp_path, smtp_server,
                                                                            webhook_server):
    model_dir = tmp_path / "model"
    mail = smtp_server.url(userinfo=f"{USER}:{quote(PASSWORD, safe='')}")
    dead = f"json://127.0.0.1:{free_port()}/hook"
    env = base_env(APPRISE_URLS=f"{mail} {webhook_server.url('/hook')}, {dead}")
    launcher = procs.tfps("tfps-local-notify", "local", *run_flags(model_dir, "--run_name", "notify-demo", steps=300),
                          env=env)
    launcher.wait_for(r"first training step done", 120)
    running = [c for c in _cmdlines() if "tfps" in c]
    assert running and not [c for c in running if PASSWORD in c or quote(PASSWORD, safe="") in c]
    assert launcher.wait(300) == 0, launcher.tail()

    res = read_results(model_dir)
    assert res["status"] == "succeeded" and res["export_complete"] is True

    msgs = smtp_server.wait_for(1)
    assert len(msgs) == 1, [m["Subject"] for m in msgs]
    assert (USER, PASSWORD) in {(u, p) for _, u, p in smtp_server.logins}   # the encoded password arrived intact
    msg = msgs[0]
    assert "succeeded" in msg["Subject"] and "notify-demo" in msg["Subject"] and "FAILED" not in msg["Subject"]
    body = msg.get_body(preferencelist=("plain", "html")).get_content()
    for field in ("notify-demo", str(res["global_step"]), res["export_dir"], "worker0"):
        assert field in body, field
    files = _attachment_names(msg)
    png = next(v for k, v in files.items() if k.endswith(".png"))
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    attached = json.loads(next(v for k, v in files.items() if k.endswith(".json")))
    assert attached["status"] == "succeeded" and attached["global_step"] == res["global_step"]

    hooks = webhook_server.bodies("/hook")
    assert len(hooks) == 1
    assert hooks[0]["type"] == "success" and "succeeded" in hooks[0]["title"]
    kinds = {a["filename"].rsplit(".", 1)[-1] for a in hooks[0]["attachments"]}
    assert kinds == {"png", "json"}
    assert base64.b64decode(hooks[0]["attachments"][0]["base64"])

    out = launcher.output()
    failed = [line for line in out.splitlines() if "delivery failed" in line]
    assert len(failed) == 1 and "json://" in failed[0], failed    # only the dead URL, masked
    for text in (out, json.dumps(res)):
        assert PASSWORD not in text and quote(PASSWORD, safe="") not in text
    for f in model_dir.rglob("*"):
        if f.is_file():
            data = f.read_bytes()
            assert PASSWORD.encode() not in data and quote(PASSWORD, safe="").encode() not in data, f


def test_failed_job_sends_one_failure_email_with_the_error(procs, tmp_path, smtp_server):
    model_dir = tmp_path / "model"
    env = base_env(APPRISE_URLS=smtp_server.url())
    launcher = procs.tfps("tfps-local-notify-fail", "local",
                          *run_flags(model_dir, "--model", "tests.fixtures.bad_models:nan_loss", steps=200), env=env)
    assert launcher.wait(300) == 1, launcher.tail()
    msgs = smtp_server.wait_for(1)
    assert len(msgs) == 1
    assert "FAILED" in msgs[0]["Subject"]
    body = msgs[0].get_body(preferencelist=("plain", "html")).get_content()
    assert "FloatingPointError" in body and "nan" in body.lower()
    assert "Traceback" in body or "File " in body

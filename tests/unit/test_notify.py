"""The completion message, sent through apprise to a real SMTP server and a real webhook.

Everything travels over TCP on 127.0.0.1 (fixtures ``smtp_server`` and ``webhook_server``
in conftest.py); nothing in apprise or in the socket layer is replaced.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import math
import socket
import textwrap

import apprise
import pytest
from servers import free_port

from tfps.errors import ConfigError
from tfps.exitcodes import ExitCode
from tfps.notify.message import format_message
from tfps.notify.notifier import EVENTS, Notifier, notify_test
from tfps.notify.secrets import mask_url
from tfps.notify.urls import collect_urls
from tfps.outcome.plot import plot_history

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PASSWORD = "p@ss%w;rd/1"
PASSWORD_ENCODED = "p%40ss%25w%3Brd%2F1"

RESULTS = {
    "job": "demo", "status": "succeeded", "exit_code": 0, "model": "mlp", "mode": "async",
    "started_at": "2026-12-02T17:00:00+00:00", "ended_at": "2026-12-02T17:01:21+00:00", "duration_s": 81.2,
    "global_step": 400, "train_steps": 400, "final_loss": 0.21, "metrics": {"accuracy": 0.93},
    "eval_metrics": {"accuracy": 0.91, "loss": 0.25},
    "times": {"startup_s": 3.1, "training_s": 60.2, "final_save_s": 2.4},
    "checkpoint": "/data/model/model.ckpt-400", "export_dir": "/data/model/export", "export_complete": True,
    "cluster": {"ps": ["h1:2222"], "worker": ["h2:2222", "h3:2222"]}, "task": "worker0", "host": "h2",
}
TRACEBACK_TAIL = textwrap.dedent("""\
    Traceback (most recent call last):
      File "/app/tfps/worker.py", line 112, in after_run
        raise FloatingPointError(...)
    FloatingPointError: NaN loss at step 120""")
FAILED = {
    **RESULTS, "status": "failed", "exit_code": 1, "global_step": 120, "final_loss": float("nan"),
    "export_dir": None, "export_complete": False, "checkpoint": "/data/model/model.ckpt-100",
    "error": {"type": "FloatingPointError", "message": "NaN loss at step 120", "traceback_tail": TRACEBACK_TAIL},
}


@pytest.fixture
def attachments(tmp_path):
    """The two files the chief attaches: the loss plot and results.json."""
    history = [{"step": s, "loss": 2.0 * math.exp(-s / 80) + 0.2, "accuracy": 1 - math.exp(-s / 100)}
               for s in range(0, 401, 20)]
    png = plot_history(history, str(tmp_path / "loss.png"))
    results_json = tmp_path / "results.json"
    results_json.write_text(json.dumps(RESULTS))
    return [png, str(results_json)]


def text_of(message) -> str:
    part = message.get_body(preferencelist=("plain",))
    return part.get_content()


def attached(message) -> dict[str, bytes]:
    return {part.get_filename(): part.get_payload(decode=True) for part in message.iter_attachments()}


def all_log_text(caplog) -> str:
    return "\n".join(f"{r.name} {r.levelname} {r.getMessage()}" for r in caplog.records)


# --------------------------------------------------------------------------------------
# Email
# --------------------------------------------------------------------------------------

def test_success_email_arrives_once_with_the_facts_and_both_attachments(smtp_server, attachments):
    deliveries = Notifier([smtp_server.url()]).send("succeeded", RESULTS, attachments)

    assert [d.ok for d in deliveries] == [True]
    messages = smtp_server.wait_for(1)
    assert len(messages) == 1
    msg = messages[0]
    assert msg["Subject"] == "[tfps] ✔ job demo succeeded at step 400"
    assert smtp_server.envelopes[0].rcpt_tos == [smtp_server.recipient]
    body = text_of(msg)
    for fact in ("demo", "400 of 400", "0.21", "accuracy 0.93", "h1:2222", "h2:2222", "h3:2222",
                 "/data/model/model.ckpt-400", "/data/model/export (complete)", "2026-12-02 17:00:00 UTC",
                 "1 min 21 s", "worker0 on h2"):
        assert fact in body, fact
    files = attached(msg)
    assert set(files) == {"loss.png", "results.json"}
    assert files["loss.png"].startswith(PNG_SIGNATURE)
    assert json.loads(files["results.json"]) == RESULTS


def test_failure_email_says_failed_and_carries_the_error_and_traceback_tail(smtp_server):
    deliveries = Notifier([smtp_server.url()]).send("failed", FAILED)

    assert [d.ok for d in deliveries] == [True]
    msg = smtp_server.wait_for(1)[0]
    assert msg["Subject"] == "[tfps] ✘ job demo FAILED at step 120: NaN loss at step 120"
    body = text_of(msg)
    assert "FloatingPointError: NaN loss at step 120" in body
    assert 'File "/app/tfps/worker.py", line 112, in after_run' in body
    assert "/data/model/model.ckpt-100" in body
    assert "✔" not in msg["Subject"]


# --------------------------------------------------------------------------------------
# Webhook (json://)
# --------------------------------------------------------------------------------------

def test_webhook_gets_type_text_and_base64_attachments(webhook_server, attachments):
    notifier = Notifier([webhook_server.url("/hook")])
    assert notifier.send("succeeded", RESULTS, attachments)[0].ok
    assert notifier.send("failed", FAILED, attachments)[0].ok

    success, failure = webhook_server.bodies("/hook")
    assert success["type"] == "success"
    assert success["title"] == "[tfps] ✔ job demo succeeded at step 400"
    assert "/data/model/export (complete)" in success["message"]
    files = {a["filename"]: base64.b64decode(a["base64"]) for a in success["attachments"]}
    assert files["loss.png"].startswith(PNG_SIGNATURE)
    assert json.loads(files["results.json"]) == RESULTS
    assert failure["type"] == "failure"
    assert "FAILED" in failure["title"]
    assert "FloatingPointError: NaN loss at step 120" in failure["message"]


def test_stopped_and_started_use_warning_and_info(webhook_server):
    notifier = Notifier([webhook_server.url()])
    notifier.send("stopped", {"job": "demo", "status": "stopped", "global_step": 200})
    notifier.send("started", {"job": "demo", "status": "started", "mode": "sync", "cluster": RESULTS["cluster"]})

    stopped, started = webhook_server.bodies()
    assert (stopped["type"], stopped["title"]) == ("warning", "[tfps] job demo stopped at step 200")
    assert (started["type"], started["title"]) == ("info", "[tfps] job demo started (1 ps, 2 workers, sync updates)")


# --------------------------------------------------------------------------------------
# Tags
# --------------------------------------------------------------------------------------

def test_apprise_tag_filter_leaves_untagged_services_out():
    """Why the Notifier picks services itself: apprise 2.x's own filter cannot say "untagged too"."""
    a = apprise.Apprise()
    a.add("json://127.0.0.1:9/untagged")
    a.add("json://127.0.0.1:9/failed", tag="failed")
    a.add("json://127.0.0.1:9/always", tag="always")
    paths = lambda **kw: sorted(s.url(privacy=True).split("?")[0].rsplit("/", 1)[1] for s in a.find(**kw))  # noqa: E731
    assert paths(tag="failed") == ["always", "failed"]
    assert paths() == ["always", "failed", "untagged"]


@pytest.mark.parametrize("fmt", ["yaml", "text"])
def test_tags_route_failures_to_the_pager_and_successes_to_email(fmt, smtp_server, webhook_server, tmp_path):
    pager, everything, audit = (webhook_server.url(p) for p in ("/pager", "/everything", "/audit"))
    email = smtp_server.url()
    if fmt == "yaml":
        text = f"""\
            version: 1
            urls:
              - "{pager}":
                  tag: failed
              - "{email}":
                  tag: succeeded
              - "{audit}":
                  tag: always
              - "{everything}"
            """
    else:
        text = f"""\
            failed={pager}
            succeeded={email}
            always={audit}
            {everything}
            """
    config = tmp_path / f"notify.{'yml' if fmt == 'yaml' else 'txt'}"
    config.write_text(textwrap.dedent(text))
    notifier = Notifier(config_path=str(config))
    routes = dict(notifier.routes())
    assert routes[mask_url(pager)] == ("failed",)
    assert routes[mask_url(everything)] == EVENTS

    def counts():
        return (len(smtp_server.messages), len(webhook_server.bodies("/pager")),
                len(webhook_server.bodies("/everything")), len(webhook_server.bodies("/audit")))

    assert all(d.ok for d in notifier.send("succeeded", RESULTS))
    smtp_server.wait_for(1)
    assert counts() == (1, 0, 1, 1)
    assert all(d.ok for d in notifier.send("failed", FAILED))
    assert counts() == (1, 1, 2, 2)
    assert webhook_server.bodies("/pager")[0]["type"] == "failure"
    assert len(notifier.send("stopped", {"job": "demo", "status": "stopped"})) == 2
    assert counts() == (1, 1, 3, 3)
    assert smtp_server.messages[0]["Subject"].startswith("[tfps] ✔")


def test_a_url_given_twice_gets_one_message(webhook_server, monkeypatch):
    url = webhook_server.url()
    monkeypatch.setenv("APPRISE_URLS", url)
    notifier = Notifier.from_settings([url])
    assert notifier.describe() == [url]
    notifier.send("succeeded", RESULTS)
    assert len(webhook_server.requests) == 1


def test_a_service_with_only_unknown_tags_gets_nothing_and_a_warning(webhook_server, tmp_path, caplog):
    config = tmp_path / "notify.yml"
    config.write_text(f'urls:\n  - "{webhook_server.url()}":\n      tag: failure\n')
    notifier = Notifier(config_path=str(config))
    assert "will receive no message" in caplog.text
    for event in EVENTS:
        assert notifier.send(event, {"job": "demo", "status": event}) == []
    assert [d.ok for d in notifier.test()] == [True]  # the test message ignores tags


# --------------------------------------------------------------------------------------
# Failures never reach the caller
# --------------------------------------------------------------------------------------

def test_unreachable_service_fails_softly_and_says_so(webhook_server, caplog):
    caplog.set_level(logging.INFO, logger="tfps.notify")
    closed = f"json://127.0.0.1:{free_port()}/hook"
    notifier = Notifier([closed, webhook_server.url()])

    deliveries = notifier.send("failed", FAILED)

    assert [(d.url, d.ok) for d in deliveries] == [(mask_url(closed), False), (webhook_server.url(), True)]
    assert deliveries[0].detail
    failed = [r for r in caplog.records if r.name == "tfps.notify" and "delivery failed" in r.getMessage()]
    assert len(failed) == 1 and failed[0].levelno == logging.WARNING
    assert mask_url(closed) in failed[0].getMessage()


def test_a_refusing_service_is_tried_twice_at_most(webhook_server):
    webhook_server.status["/broken"] = 500
    notifier = Notifier([webhook_server.url("/broken") + "?retry=5"])

    [delivery] = notifier.send("succeeded", RESULTS)

    assert not delivery.ok
    assert "500" in delivery.detail
    assert len(webhook_server.requests) == 2


def test_a_service_that_never_answers_is_given_up_on():
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts connections (kernel backlog), never answers
    try:
        url = f"json://127.0.0.1:{silent.getsockname()[1]}/hook?cto=60&rto=60"
        [delivery] = Notifier([url], timeout=1.0).send("succeeded", RESULTS)
    finally:
        silent.close()
    assert not delivery.ok


def test_send_never_raises_on_odd_input(webhook_server, tmp_path):
    notifier = Notifier([webhook_server.url()])
    assert notifier.send("exploded", RESULTS) == []
    odd = {"job": "demo", "status": "failed", "cluster": "not a dict", "metrics": [1, 2], "error": "text",
           "duration_s": "soon", "started_at": "yesterday", "global_step": None, "times": None}
    [delivery] = notifier.send("failed", odd, [str(tmp_path / "missing.png")])
    assert delivery.ok
    assert webhook_server.bodies()[0]["title"] == "[tfps] ✘ job demo FAILED: text"


def test_nothing_configured_is_disabled_and_sends_nothing():
    notifier = Notifier.from_settings(None, None, environ={})
    assert not notifier.enabled
    assert notifier.describe() == []
    assert notifier.send("failed", FAILED) == []


# --------------------------------------------------------------------------------------
# Bad configuration
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("url, secret, says", [
    ("garbage-token-1234", "garbage-token-1234", "not a URL"),
    ("foo://ops:hunter2222@example.com/x", "hunter2222", "knows no service foo://"),
    ("msteams://tenant1234/webhooksecret99/channelsecret77", "webhooksecret99", "workflows://"),
    (f"mailto://ops:{PASSWORD}@127.0.0.1:2525?to=ops@example.com", "ss%w;rd", "%25"),
    ("mailto://ops:pa@ssword99@127.0.0.1:2525?to=ops@example.com", "ssword99", "%40"),
])
def test_malformed_url_is_refused_with_the_url_masked(url, secret, says, caplog):
    caplog.set_level(logging.DEBUG)
    with pytest.raises(ConfigError) as err:
        Notifier([url])
    assert err.value.field == "notify"
    assert says in str(err.value)
    assert secret not in str(err.value)
    assert secret not in all_log_text(caplog)


def test_unreadable_or_empty_config_file_is_refused(tmp_path):
    with pytest.raises(ConfigError) as err:
        Notifier(config_path=str(tmp_path / "missing.yml"))
    assert err.value.field == "notify_config" and "cannot read" in str(err.value)

    bad = tmp_path / "bad.yml"
    bad.write_text("urls:\n  - [unclosed\n")
    with pytest.raises(ConfigError) as err:
        Notifier(config_path=str(bad))
    assert "no usable notification URL" in str(err.value)


def test_config_entry_apprise_cannot_load_is_refused(tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    config = tmp_path / "notify.yml"
    config.write_text("urls:\n  - json://127.0.0.1:9/ok\n  - foo://ops:hunter2222@example.com/x\n")
    with pytest.raises(ConfigError) as err:
        Notifier(config_path=str(config))
    assert "could not load 1 of its entries" in str(err.value)
    assert "hunter2222" not in str(err.value) + all_log_text(caplog)


# --------------------------------------------------------------------------------------
# Passwords and secrets
# --------------------------------------------------------------------------------------

AUTH = [{"auth": ("ops", PASSWORD)}]


@pytest.mark.parametrize("smtp_server", AUTH, indirect=True)
@pytest.mark.parametrize("form", ["userinfo", "query"])
def test_password_with_at_percent_semicolon_slash_reaches_smtp_auth(form, smtp_server, caplog):
    caplog.set_level(logging.DEBUG)
    if form == "userinfo":
        url = smtp_server.url(userinfo=f"ops:{PASSWORD_ENCODED}")
    else:
        url = smtp_server.url(user="ops", **{"pass": PASSWORD_ENCODED})

    [delivery] = Notifier([url]).send("succeeded", RESULTS)

    assert delivery.ok, delivery.detail
    assert [(user, pw) for _, user, pw in smtp_server.logins] == [("ops", PASSWORD)]
    assert len(smtp_server.wait_for(1)) == 1
    for secret in (PASSWORD, PASSWORD_ENCODED):
        assert secret not in all_log_text(caplog)
        assert secret not in delivery.url + delivery.detail


@pytest.mark.parametrize("smtp_server", AUTH, indirect=True)
def test_a_wrong_password_is_a_failed_delivery(smtp_server):
    url = smtp_server.url(userinfo="ops:wrong-password")
    [delivery] = Notifier([url], timeout=2, attempts=1).send("succeeded", RESULTS)
    assert not delivery.ok
    assert smtp_server.logins[0][1:] == ("ops", "wrong-password")
    assert smtp_server.messages == []


@pytest.mark.parametrize("smtp_server", AUTH, indirect=True)
@pytest.mark.parametrize("value", [PASSWORD, PASSWORD_ENCODED])
def test_password_from_a_config_template_variable(value, smtp_server, tmp_path, monkeypatch):
    config = tmp_path / "notify.yml"
    config.write_text(textwrap.dedent(f"""\
        version: 1
        template:
          - SMTP_PASS
        urls:
          - "{smtp_server.url(userinfo='ops:${SMTP_PASS}')}"
        """))
    with pytest.raises(ConfigError, match="APPRISE_TEMPLATE_SMTP_PASS"):
        Notifier(config_path=str(config))

    monkeypatch.setenv("APPRISE_TEMPLATE_SMTP_PASS", value)
    [delivery] = Notifier(config_path=str(config)).send("succeeded", RESULTS)

    assert delivery.ok, delivery.detail
    assert [pw for _, _, pw in smtp_server.logins] == [PASSWORD]


@pytest.mark.parametrize("smtp_server", AUTH, indirect=True)
def test_no_secret_in_any_log_record_delivery_or_description(smtp_server, webhook_server, caplog):
    caplog.set_level(logging.DEBUG)
    token = "tok3nSecretValue"
    urls = [
        smtp_server.url(userinfo=f"ops:{PASSWORD_ENCODED}"),
        webhook_server.url("/hook").replace("://", f"://bot:{token}@"),
        f"json://alice:{token}X@127.0.0.1:{free_port()}/down",  # fails: its error path logs too
        f"mailto://ops:{PASSWORD_ENCODED}@127.0.0.1:{free_port()}?to=ops@example.com&from=t@example.com",
    ]
    notifier = Notifier(urls, attempts=1)  # apprise waits 5 s between two emails to one server
    deliveries = notifier.send("failed", FAILED)

    assert [d.ok for d in deliveries] == [True, True, False, False]
    shown = "\n".join([all_log_text(caplog)] + notifier.describe()
                      + [f"{d.url} {d.detail}" for d in deliveries])
    for secret in (PASSWORD, PASSWORD_ENCODED, token):
        assert secret not in shown
    assert webhook_server.requests[0]["headers"]["Authorization"].startswith("Basic ")  # it was really used


def test_a_service_echoing_the_credentials_does_not_put_them_in_the_log(webhook_server, caplog):
    """apprise logs a failing service's answer; services that echo the request are common."""
    caplog.set_level(logging.DEBUG)
    token = "echoedT0kenValue"
    webhook_server.status["/echo"] = 401
    webhook_server.replies["/echo"] = lambda req: json.dumps(
        {"error": "bad credentials", "authorization": req.headers["Authorization"],
         "seen": base64.b64decode(req.headers["Authorization"].split()[1]).decode()}).encode()
    url = webhook_server.url("/echo").replace("://", f"://bot:{token}@")

    [delivery] = Notifier([url], attempts=1).send("failed", FAILED)

    assert not delivery.ok and "401" in delivery.detail
    assert any("Response Details" in r.getMessage() and "bad credentials" in r.getMessage()
               for r in caplog.records)
    assert token not in all_log_text(caplog)


def test_mask_url_hides_passwords_and_tokens():
    assert mask_url(f"mailto://ops:{PASSWORD_ENCODED}@smtp.example.com:2525?to=a@example.com") == \
        "mailto://ops:****@smtp.example.com:2525/a%40example.com"
    assert mask_url("json://bot:s3cretT0ken@hooks.example.com/x") == "json://bot:****@hooks.example.com/x"
    masked = mask_url("discord://123456789/AbCdEfGhIjKlMnOp")
    assert "AbCdEfGhIjKlMnOp" not in masked and masked.startswith("discord://")
    # apprise cannot parse these: scheme and host-like hosts only
    assert mask_url("foo://u:pw@smtp.example.com:25/tok?key=v") == "foo://****@smtp.example.com:25/****?key=****"
    assert mask_url("msteams://tenant/webhook/secret") == "msteams://****/****/****"
    assert mask_url("not-a-url-but-a-token") == "****"
    # apprise would misread these (unencoded password): nothing of the password shows
    assert mask_url("mailto://ops:pa@ssword99@smtp.example.com?to=a@example.com") == \
        "mailto://****@smtp.example.com?to=****"
    assert mask_url(f"mailto://ops:{PASSWORD}@smtp.example.com") == "mailto://****@smtp.example.com"


# --------------------------------------------------------------------------------------
# URL sources and `tfps notify-test`
# --------------------------------------------------------------------------------------

def test_apprise_urls_split_on_spaces_and_commas():
    env = {"APPRISE_URLS": " json://h/a,json://h/b ,  mailto://u:p%40w@h?to=a@x.com,b@x.com\n\tjson://h/c, "}
    assert collect_urls(["json://h/cli", "json://h/a"], env) == [
        "json://h/cli", "json://h/a", "json://h/b", "mailto://u:p%40w@h?to=a@x.com,b@x.com", "json://h/c"]
    assert collect_urls(None, {}) == []
    assert collect_urls(["json://h/x, json://h/y"], {}) == ["json://h/x", "json://h/y"]


def test_urls_file_named_by_apprise_urls_file_is_read_after_the_other_sources(webhook_server, tmp_path):
    path = tmp_path / "notify_urls"
    path.write_text("# the team's hook\njson://h/a\n" + webhook_server.url("/file") + ", json://h/b\n")
    env = {"APPRISE_URLS": "json://h/a", "APPRISE_URLS_FILE": str(path)}
    assert collect_urls(["json://h/cli"], env) == ["json://h/cli", "json://h/a", webhook_server.url("/file"),
                                                   "json://h/b"]
    # The file's URLs are used as any other: the test message reaches the webhook.
    out = io.StringIO()
    assert notify_test(None, None, out=out, environ={"APPRISE_URLS_FILE": str(path)}) == 1   # json://h/* fail
    assert f"OK   {webhook_server.url('/file')}" in out.getvalue().splitlines()
    assert webhook_server.bodies("/file")[0]["title"].startswith("[tfps] test message from ")


def test_unreadable_urls_file_is_one_clear_error(tmp_path):
    out, err = io.StringIO(), io.StringIO()
    missing = tmp_path / "absent"
    assert notify_test(None, None, out=out, environ={"APPRISE_URLS_FILE": str(missing)}, err=err) == 2
    assert err.getvalue() == (f"tfps: error: APPRISE_URLS_FILE: cannot read {missing} (No such file or directory); "
                              "it must be a text file of apprise URLs that the task's user can read (in a container: "
                              "owned by uid 10001, mode 0400)\n")


def test_notify_test_prints_one_line_per_service_and_returns_the_outcome(webhook_server, tmp_path):
    out = io.StringIO()
    assert notify_test([webhook_server.url("/a"), webhook_server.url("/b")], None, out=out, environ={}) == 0
    assert out.getvalue().splitlines() == [f"OK   {webhook_server.url('/a')}", f"OK   {webhook_server.url('/b')}"]
    assert webhook_server.bodies("/a")[0]["title"].startswith("[tfps] test message from ")

    closed = f"json://bot:hunter2222@127.0.0.1:{free_port()}/down"
    out = io.StringIO()
    assert notify_test([webhook_server.url("/a")], None, out=out, environ={"APPRISE_URLS": closed}) == 1
    lines = out.getvalue().splitlines()
    assert lines[0] == f"OK   {webhook_server.url('/a')}"
    assert lines[1].startswith(f"FAIL {mask_url(closed)}: ")
    assert "hunter2222" not in out.getvalue()

    config = tmp_path / "notify.yml"
    config.write_text(f'urls:\n  - "{webhook_server.url("/pager")}":\n      tag: failed, stopped\n')
    out = io.StringIO()
    assert notify_test(None, str(config), out=out, environ={}) == 0
    assert out.getvalue() == f"OK   {webhook_server.url('/pager')} [failed, stopped]\n"


def test_notify_test_with_nothing_or_bad_configuration_returns_2():
    out, err = io.StringIO(), io.StringIO()
    assert notify_test(None, None, out=out, environ={}, err=err) == ExitCode.BAD_CONFIG == 2
    assert err.getvalue().startswith("tfps: error: no notification service configured")
    assert "APPRISE_URLS" in err.getvalue() and out.getvalue() == ""

    out, err = io.StringIO(), io.StringIO()
    assert notify_test(["foo://ops:hunter2222@example.com"], None, out=out, environ={}, err=err) == 2
    assert err.getvalue().startswith("tfps: error: notify: cannot use the notification URL foo://****@example.com")
    assert "hunter2222" not in err.getvalue() and out.getvalue() == ""


# --------------------------------------------------------------------------------------
# Message text
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("event", EVENTS)
def test_format_message_with_only_job_and_status(event):
    title, body = format_message(event, {"job": "demo", "status": event})
    assert title.startswith("[tfps] ") and "demo" in title
    assert "None" not in title + body
    assert ("✔" in title) == (event == "succeeded")
    assert ("FAILED" in title) == (event == "failed")


def test_message_names_the_image_the_job_ran_in():
    image = "sha256:" + "ab" * 32
    _, body = format_message("succeeded", {"job": "demo", "status": "succeeded", "image": image})
    assert any(line.split() == ["image", image] for line in body.splitlines()), body

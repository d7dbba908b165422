"""The docs site in a real browser (issue 50): Debian's chromium, headless, opens the built
site from file:// and the pages render with their images and without a console message.

chromium comes from ``.ci/chromium.sh`` (``make test`` runs it; it does nothing where
/usr/bin/chromium exists). Each page is opened with a probe script added to a copy of its
HTML in the test's site: it records every error event (a script error, an image or a
stylesheet that failed to load) and ``console.error`` call, and at the load event writes them
with each image's state into the DOM, which ``--dump-dom`` prints. Chromium's own console log
(``--enable-logging=stderr``) must hold no line of the page either. The screenshot of the home
page stays in the test's tmp directory (its path is printed). Cost: about 4 s of mkdocs build
and three chromium runs of 3-10 s each; no network is used (the site loads no web font).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")

PROBE = """<script>
window.__tfpsErrors = [];
window.addEventListener("error", function (e) {
  var t = e.target;
  window.__tfpsErrors.push(t && t !== window ? "failed to load " + (t.src || t.href) : String(e.message));
}, true);
var __tfpsConsoleError = console.error;
console.error = function () {
  window.__tfpsErrors.push(Array.prototype.join.call(arguments, " "));
  __tfpsConsoleError.apply(console, arguments);
};
window.addEventListener("load", function () {
  var probe = document.createElement("pre");
  probe.id = "tfps-probe";
  probe.textContent = JSON.stringify({
    errors: window.__tfpsErrors,
    images: Array.prototype.map.call(document.images, function (i) {
      return [i.getAttribute("src"), i.complete && i.naturalWidth > 0];
    }),
    title: document.title,
    nav: document.querySelectorAll("nav.md-nav a").length,
  });
  document.body.appendChild(probe);
});
</script>"""


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / "chromium-profile"
    return subprocess.run([str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                           "--no-first-run", "--disable-background-networking", "--disable-component-update",
                           "--disable-sync", f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
                           "--window-size=1280,1000",
                           # No name resolves: a page that reaches for the network fails to load it.
                           "--host-resolver-rules=MAP * ~NOTFOUND", *args],
                          capture_output=True, text=True, timeout=180, cwd=tmp_path)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    assert CHROMIUM.is_file(), "no /usr/bin/chromium: run bash .ci/chromium.sh (make test does)"
    from mkdocs.commands.build import build
    from mkdocs.config import load_config
    out = tmp_path_factory.mktemp("docs-site") / "site"
    build(load_config(str(REPO / "mkdocs.yml"), site_dir=str(out), strict=True))
    return out


def _open(site: Path, tmp_path: Path, page: str) -> dict:
    """What the probe saw on ``page`` (relative to the site), and chromium's console lines."""
    html = site / page
    probed = html.with_name(html.stem + ".probed.html")
    probed.write_text(html.read_text(encoding="utf-8").replace("<head>", "<head>" + PROBE, 1), encoding="utf-8")
    done = _chromium(tmp_path, "--virtual-time-budget=10000", "--dump-dom", probed.as_uri())
    assert done.returncode == 0, done.stderr[-2000:]
    probe = re.search(r'<pre id="tfps-probe">(.*?)</pre>', done.stdout, re.S)
    assert probe, f"{page}: the page never reached its load event\n{done.stdout[-2000:]}"
    seen = json.loads(probe.group(1).replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">")
                      .replace("&amp;", "&"))
    seen["console"] = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    return seen


@pytest.mark.parametrize("page, images", [("index.html", {"console-status.svg"}),
                                          ("tutorials/first-job.html", {"../console-loss.png"})])
def test_a_page_renders_with_its_images_and_no_console_error(site, tmp_path, page, images):
    seen = _open(site, tmp_path, page)
    assert seen["errors"] == [] and seen["console"] == [], seen
    assert seen["title"].endswith("tfps") and seen["nav"] > 30, seen   # Material's navigation is there
    shown = {src for src, loaded in seen["images"] if loaded}
    assert images <= shown, seen["images"]
    assert all(loaded for _, loaded in seen["images"]), seen["images"]


def test_the_probe_sees_a_missing_image_and_a_script_error(site, tmp_path):
    """The check above can fail: a page with a broken image and a throwing script is caught."""
    broken = site / "broken.html"
    broken.write_text((site / "index.html").read_text(encoding="utf-8").replace(
        "</body>", '<img src="no-such.png"><script>noSuchFunction();</script></body>', 1), encoding="utf-8")
    seen = _open(site, tmp_path, "broken.html")
    assert any("no-such.png" in e for e in seen["errors"]) and any("noSuchFunction" in e for e in seen["errors"])
    assert ["no-such.png", False] in seen["images"]
    assert any("noSuchFunction" in line for line in seen["console"])


def test_the_home_page_screenshot(site, tmp_path):
    shot = tmp_path / "home.png"
    done = _chromium(tmp_path, f"--screenshot={shot}", (site / "index.html").as_uri())
    assert done.returncode == 0, done.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    print(f"screenshot of the docs site's home page: {shot}")

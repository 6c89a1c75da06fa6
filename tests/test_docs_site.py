"""The documentation site: built with `mkdocs build --strict`, served on loopback, and every page
opened in headless Chromium. A page's DOM (after its scripts ran) must link only to files the
server has and to anchors the target page holds, and the generated reference pages must list
the config fields and the subcommands.

Needs the Debian packages chromium and chromium-driver (scripts/setup.sh installs them under
FLEETRL_SETUP_BROWSER=1, which scripts/test.sh sets). Without Chromium the test is skipped,
except in CI (CI=true), where it fails.
"""

from __future__ import annotations

import functools
import html.parser
import http.server
import os
import pathlib
import shutil
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
BROWSERS = ("chromium", "chromium-browser", "google-chrome")
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--virtual-time-budget=5000",  # let the page's scripts run before the DOM is dumped
)

pytestmark = pytest.mark.e2e


def _chromium() -> str:
    found = next((path for name in BROWSERS if (path := shutil.which(name))), None)
    if found:
        return found
    reason = "no Chromium on PATH (Debian: apt-get install chromium chromium-driver; scripts/test.sh does)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}: CI must run the docs site's browser test")
    pytest.skip(reason)


class _Links(html.parser.HTMLParser):
    """Every href and src of a document, and the ids it holds."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name == "id" and value:
                self.ids.add(value)
            if name in ("href", "src") and value and tag != "base":
                self.urls.append(value)


@pytest.fixture
def site(tmp_path: pathlib.Path) -> pathlib.Path:
    out = tmp_path / "site"
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet"]
    build = subprocess.run(
        [*command, "-f", str(ROOT / "mkdocs.yml"), "-d", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert build.returncode == 0, f"mkdocs build --strict failed:\n{build.stdout}\n{build.stderr}"
    return out


@pytest.fixture
def served(site: pathlib.Path) -> Iterator[str]:
    """The site on 127.0.0.1 at a free port; its base URL."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _dump_dom(browser: str, url: str, profile: pathlib.Path) -> str:
    result = subprocess.run(
        [browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom", url],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert result.returncode == 0 and "</html>" in result.stdout, (
        f"Chromium could not render {url} (exit {result.returncode}):\n{result.stderr[-2000:]}"
    )
    return result.stdout


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code


def test_every_page_renders_with_no_broken_link(site: pathlib.Path, served: str, tmp_path: pathlib.Path) -> None:
    browser = _chromium()
    pages = sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html") if p.name != "404.html")
    assert {"index.html", "reference/configuration.html", "reference/cli.html", "results.html"} <= set(pages)
    dumped: dict[str, _Links] = {}
    for page in pages:
        parser = _Links()
        parser.feed(_dump_dom(browser, served + page, tmp_path / "profile"))
        dumped[page] = parser

    broken = []
    checked: dict[str, int] = {}
    for page, links in dumped.items():
        for raw in links.urls:
            url = urllib.parse.urljoin(served + page, raw)
            if not url.startswith(served):
                continue  # outside the site: not ours to check offline
            target, fragment = urllib.parse.urldefrag(url)
            target = target.split("?", 1)[0]
            if target not in checked:
                checked[target] = _status(target)
            if checked[target] != 200:
                broken.append(f"{page}: {raw} -> HTTP {checked[target]}")
                continue
            path = urllib.parse.unquote(target[len(served) :]) or "index.html"
            if fragment and path in dumped and fragment not in dumped[path].ids:
                broken.append(f"{page}: {raw} -> no element with id {fragment!r} in {path}")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_reference_pages_are_generated_from_the_code(site: pathlib.Path) -> None:
    """The configuration and CLI references list what the code defines, marker replaced."""
    config = (site / "reference" / "configuration.html").read_text()
    cli = (site / "reference" / "cli.html").read_text()
    for field in ("max_wall_sec", "learner.batch_size", "sampler.num_samplers", "aggregator.grads_per_step"):
        assert field in config, f"configuration reference lacks {field}"
    for command in ("fleetrl train", "fleetrl export", "fleetrl fleet up", "--max-wall-sec"):
        assert command in cli, f"CLI reference lacks {command}"
    assert "fleetrl:config-reference" not in config and "fleetrl:cli-reference" not in cli

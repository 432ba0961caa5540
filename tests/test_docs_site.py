"""``make docs`` (docs/build_site.py): the README, the guide and the API reference in one site, every local
link checked; the built pages open in headless Chromium with no missing asset and no broken link."""

from __future__ import annotations

import functools
import http.server
import importlib.util
import re
import shutil
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytest.importorskip("pdoc", reason="pdoc (and its markdown2) is in the [test] extra")


def _builder():
    spec = importlib.util.spec_from_file_location("build_site", REPO / "docs" / "build_site.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    output = tmp_path_factory.mktemp("site") / "site"
    problems = _builder().build_site(output)
    assert problems == [], "\n".join(problems)
    return output


def test_site_holds_the_readme_the_guide_and_the_api(site: Path) -> None:
    builder = _builder()
    assert (site / "index.html").is_file() and (site / builder.API_INDEX).is_file()
    for page in builder.guide_pages():
        html = (site / f"{page.stem}.html").read_text()
        assert 'href="index.html"' in html and f'href="{builder.API_INDEX}"' in html  # the navigation
    index = (site / "index.html").read_text()
    assert re.search(r'href="coming-from-tf\.html"', index), "the README's links to docs/*.md lead to the pages"


def test_the_link_check_finds_a_broken_link_and_a_missing_anchor(tmp_path: Path) -> None:
    builder = _builder()
    (tmp_path / "a.html").write_text('<a href="b.html#nowhere">b</a> <img src="missing.png"> <a id="top"></a>'
                                     '<a href="#top">top</a> <a href="https://example.org/x">out</a>')
    (tmp_path / "b.html").write_text('<h1 id="here">b</h1>')
    problems = builder.check_links(tmp_path)
    assert problems == ["a.html: link 'b.html#nowhere': no id 'nowhere' in b.html",
                        "a.html: broken link 'missing.png'"]


def test_the_link_check_reads_a_relative_site_folder_as_make_docs_gives_it(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # `make docs` passes --output docs/site, a relative path: in-page anchors and links must still resolve.
    site = tmp_path / "site"
    (site / "api").mkdir(parents=True)
    (site / "a.html").write_text('<a id="top"></a><a href="#top">top</a> <a href="api/m.html#f">m</a> '
                                 '<a href="b.html#nowhere">b</a>')
    (site / "b.html").write_text('<h1 id="here">b</h1>')
    (site / "api" / "m.html").write_text('<a href="#f">f</a> <a href="../a.html">a</a> <a href="gone.html">x</a>')
    monkeypatch.chdir(tmp_path)
    assert _builder().check_links(Path("site")) == ["a.html: link 'b.html#nowhere': no id 'nowhere' in b.html",
                                                    "api/m.html: broken link 'gone.html'"]


class _Recorder(http.server.SimpleHTTPRequestHandler):
    """Serves the site and records every request with its status (what the browser asked for)."""

    requests: list[tuple[str, int]]

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        self.requests.append((self.path, int(code) if str(code).isdigit() else 0))

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[tuple[str, list[tuple[str, int]]]]:
    requests: list[tuple[str, int]] = []
    handler = type("Handler", (_Recorder,), {"requests": requests})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", requests
    finally:
        server.shutdown()
        server.server_close()


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("Chromium is not installed (make system-deps installs Debian's chromium)")


@pytest.mark.parametrize("page, heading", [
    ("index.html", "graphdist"),
    ("strategies.html", "Strategies and how distribution works"),
    ("api/graphdist.html", "graphdist"),
])
def test_page_renders_in_headless_chromium(served: tuple[str, list[tuple[str, int]]], page: str,
                                           heading: str) -> None:
    base, requests = served
    requests.clear()
    result = subprocess.run([_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000",
                             "--dump-dom", base + page], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    dom = result.stdout
    assert re.search(r"<h1[^>]*>.*?" + re.escape(heading), dom, flags=re.S), f"{page}: no <h1> {heading!r}"
    # Every asset the page asked for (stylesheets, pictures, scripts) was there; /favicon.ico is the
    # browser's own guess, not something the page references.
    failed = [(path, status) for path, status in requests if status >= 400 and path != "/favicon.ico"]
    assert requests and not failed, f"{page}: missing assets {failed}"
    # Every local link of the rendered page (its elements' href attributes) leads to a page of the site.
    parser = _builder()._Links()
    parser.feed(dom)
    links = {href.partition("#")[0] for href in parser.links
             if href.partition("#")[0] and not re.match(r"^[a-z][a-z0-9+.-]*:", href)}
    assert links
    broken = []
    for href in sorted(links):
        url = urllib.request.urljoin(base + page, href)
        try:
            with urllib.request.urlopen(url, timeout=30) as response:
                status = response.status
        except urllib.error.HTTPError as err:
            status = err.code
        if status != 200:
            broken.append((href, status))
    assert not broken, f"{page}: broken links {broken}"

"""Builds the documentation site: the README as its index, the user guide (``docs/*.md``) and the API
reference (pdoc, :mod:`build_api`) in one folder, cross-linked and link-checked. ``make docs`` runs it.

Markdown is rendered by ``markdown2`` (pdoc's own renderer, so no dependency is added). Links between
pages are rewritten from ``.md`` to ``.html``; a link to another file of the repository (a picture, an
example script) copies that file into the site under ``repo/`` and points there. Every local ``href`` and
``src`` of every page, the API reference's included, must then name a file of the site, and every
``#anchor`` of a guide page an ``id`` of its target: anything else fails the build, with the page and link.

Usage: ``python docs/build_site.py [--output docs/site]`` (exit status 1 on a broken link or a pdoc warning).
"""

from __future__ import annotations

import argparse
import html
import importlib.util
import os
import re
import shutil
import sys
from html.parser import HTMLParser
from pathlib import Path

__all__ = ["build_site", "check_links", "guide_pages", "main"]

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
#: The API reference's entry page, relative to the site.
API_INDEX = "api/graphdist.html"

_STYLE = """\
body { font-family: system-ui, sans-serif; margin: 0; display: flex; color: #1d1d1f; line-height: 1.5; }
nav { width: 15rem; flex: none; padding: 1rem; background: #f4f5f7; min-height: 100vh; box-sizing: border-box; }
nav a { display: block; padding: 0.15rem 0; color: #0b57d0; text-decoration: none; }
nav a.current { font-weight: 600; color: #1d1d1f; }
main { padding: 1rem 2rem; max-width: 60rem; min-width: 0; }
pre { background: #f6f8fa; padding: 0.75rem; overflow-x: auto; }
code { font-family: ui-monospace, monospace; font-size: 0.9em; }
table { border-collapse: collapse; } th, td { border: 1px solid #d0d7de; padding: 0.25rem 0.5rem; }
img { max-width: 100%; }
"""

_EXTRAS = {"fenced-code-blocks": None, "tables": None, "header-ids": {"reset-count": True}, "code-friendly": None,
           "cuddled-lists": None, "strike": None}


def guide_pages() -> list[Path]:
    """The guide's pages (``docs/*.md``), in the order of the navigation: ``index.md``'s list if the docs
    have one, else alphabetical.
    """
    return sorted(DOCS.glob("*.md"))


def _title(markdown: str, fallback: str) -> str:
    match = re.search(r"^# (.+)$", markdown, flags=re.M)
    return match.group(1).strip("` ") if match else fallback


def _page_name(source: Path) -> str:
    return "index.html" if source == REPO / "README.md" else f"{source.stem}.html"


class _LinkRewriter:
    """Rewrites a page's relative links: ``.md`` pages to their ``.html``, repository files into ``repo/``."""

    def __init__(self, source: Path, output: Path, pages: dict[Path, str]) -> None:
        self.source, self.output, self.pages = source, output, pages
        self.problems: list[str] = []

    def __call__(self, match: re.Match[str]) -> str:
        attribute, target = match.group(1), html.unescape(match.group(2))
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith(("#", "//")):
            return match.group(0)
        path_part, _, anchor = target.partition("#")
        resolved = (self.source.parent / path_part).resolve()
        if resolved in self.pages:
            new = self.pages[resolved]
        elif resolved.is_file() and REPO in resolved.parents:
            relative = resolved.relative_to(REPO)
            copy = self.output / "repo" / relative
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(resolved, copy)
            new = f"repo/{relative.as_posix()}"
        elif resolved.is_dir() and REPO in resolved.parents:
            new = f"repo/{resolved.relative_to(REPO).as_posix()}/index.html"
            self._directory_listing(resolved)
        else:
            self.problems.append(f"{self.source.relative_to(REPO)}: link to {target!r}: no such file")
            return match.group(0)
        new = new + (f"#{anchor}" if anchor else "")
        return f'{attribute}="{html.escape(new, quote=True)}"'

    def _directory_listing(self, folder: Path) -> None:
        """A page listing a linked folder's files (copied too), so a link to a folder leads somewhere."""
        relative = folder.relative_to(REPO)
        target = self.output / "repo" / relative
        target.mkdir(parents=True, exist_ok=True)
        entries = []
        for item in sorted(folder.iterdir()):
            if item.is_file() and not item.name.startswith(".") and item.suffix != ".pyc":
                shutil.copyfile(item, target / item.name)
                entries.append(f'<li><a href="{html.escape(item.name)}">{html.escape(item.name)}</a></li>')
        depth = "../" * (len(relative.parts) + 1)
        (target / "index.html").write_text(_layout(f"{relative}/", f"<h1>{html.escape(str(relative))}/</h1><ul>"
                                                   + "".join(entries) + "</ul>", [], "", depth))


def _layout(title: str, body: str, navigation: list[tuple[str, str]], current: str, root: str = "") -> str:
    links = "".join(f'<a href="{root}{href}"{" class=current" if href == current else ""}>{html.escape(label)}</a>'
                    for href, label in navigation)
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{html.escape(title)} - graphdist</title>"
            f"<link rel=\"stylesheet\" href=\"{root}style.css\"></head>\n"
            f"<body><nav><a href=\"{root}index.html\"><b>graphdist</b></a>{links}</nav>\n"
            f"<main>{body}</main></body></html>\n")


def _render(markdown_text: str) -> str:
    import markdown2

    return str(markdown2.markdown(markdown_text, extras=_EXTRAS))


def build_guide(output: Path) -> list[str]:
    """Renders the README (as ``index.html``) and every guide page into ``output``; returns link problems."""
    sources = [REPO / "README.md", *guide_pages()]
    pages = {source.resolve(): _page_name(source) for source in sources}
    texts = {source: source.read_text() for source in sources}
    navigation = [(_page_name(s), _title(texts[s], s.stem)) for s in sources[1:]]
    navigation.append((API_INDEX, "API reference"))
    output.mkdir(parents=True, exist_ok=True)
    (output / "style.css").write_text(_STYLE)
    problems: list[str] = []
    for source in sources:
        rewriter = _LinkRewriter(source, output, pages)
        body = re.sub(r'(href|src)="([^"]*)"', rewriter, _render(texts[source]))
        problems += rewriter.problems
        name = _page_name(source)
        (output / name).write_text(_layout(_title(texts[source], source.stem), body, navigation, name))
    return problems


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.links: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("href", "src") and value is not None:
                self.links.append(value)
            elif name in ("id", "name") and value:
                self.ids.add(value)


def _parse(page: Path) -> _Links:
    parser = _Links()
    parser.feed(page.read_text(errors="replace"))
    return parser


def check_links(site: Path) -> list[str]:
    """Every local link of every page of ``site`` that names no file (or, on a guide page, no ``id``)."""
    # Absolute paths throughout: with a relative ``site`` (the Makefile's docs/site), relative page paths are
    # never "under" the resolved site, and every link read as broken.
    site = site.resolve()
    problems = []
    parsed = {page: _parse(page) for page in sorted(site.rglob("*.html"))}
    guide = {page for page in parsed if page.parent == site}
    for page, found in parsed.items():
        for link in found.links:
            if re.match(r"^[a-z][a-z0-9+.-]*:", link) or link.startswith("//"):
                continue  # http(s), mailto, data: not checked here (no network in CI)
            path_part, _, anchor = link.partition("#")
            target = (page.parent / path_part).resolve() if path_part else page
            if not target.is_file() or site not in target.parents:
                problems.append(f"{page.relative_to(site)}: broken link {link!r}")
            elif anchor and target in guide and page in guide and anchor not in parsed[target].ids:
                problems.append(f"{page.relative_to(site)}: link {link!r}: no id {anchor!r} in {target.name}")
    return problems


def _build_api(output: Path) -> list[str]:
    spec = importlib.util.spec_from_file_location("build_api", DOCS / "build_api.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build(output)


def build_site(output: Path, api: bool = True) -> list[str]:
    """Builds the whole site into ``output`` (emptied first); returns every problem (empty when clean)."""
    if output.exists():
        shutil.rmtree(output)
    problems = _build_api(output / "api") if api else []
    problems += build_guide(output)
    if not api:
        (output / "api").mkdir(exist_ok=True)
        (output / API_INDEX).write_text("<!DOCTYPE html><title>API</title><p>API reference not built</p>")
    return problems + check_links(output)


def main(argv: list[str] | None = None) -> int:
    """Builds the site (``--output``, default ``docs/site``); prints each problem; 1 when there is one."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=DOCS / "site", help="the site's folder (default docs/site)")
    args = parser.parse_args(argv)
    problems = build_site(args.output)
    for problem in problems:
        print(f"docs: {problem}", file=sys.stderr)
    if problems:
        return 1
    print(f"built the site in {os.path.relpath(args.output)} (open {os.path.relpath(args.output / 'index.html')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Fails on a broken link in the built book or in README.md (Python 3.11 standard library).

    mdbook build docs && python3 scripts/check-links.py [docs/book]

- Every HTML file of the built book (default `docs/book`): each relative `href` or `src` must
  name a file inside the book, and each `#anchor` an `id` (or `name`) in the page it points
  to. Links with a scheme (`https:`, `mailto:`, …) are not fetched: this checks the book, not
  the internet.
- README.md: each relative Markdown link must name a file or folder of the repository, and an
  `#anchor` into a Markdown file one of its headings (as GitHub makes ids of them).
- The preset catalog (src/source/catalog.rs): each preset has its page, `sources/<name>.html`
  in the book (tests/it/presets.rs checks the page's content).

Prints every broken link with the file it is in, and exits 1 if there is one.
"""
import html.parser
import pathlib
import re
import sys
import urllib.parse

sys.dont_write_bytecode = True  # no __pycache__ in the work tree
from preset_catalog import ROOT, presets


class Page(html.parser.HTMLParser):
    """The ids and the links (tag, attribute, value) of one HTML page."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.ids = set()
        self.links = []
        self.base = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for key in ("id", "name") if tag == "a" else ("id",):
            if attrs.get(key):
                self.ids.add(attrs[key])
        if tag == "base" and attrs.get("href"):
            self.base = attrs["href"]
        for key in ("href", "src"):
            value = attrs.get(key)
            if value is not None:
                self.links.append(value)


def external(link):
    parts = urllib.parse.urlsplit(link)
    return bool(parts.scheme) or link.startswith("//")


def check_book(book):
    pages = {}
    for path in sorted(book.rglob("*.html")):
        page = Page()
        page.feed(path.read_text(encoding="utf-8"))
        pages[path.resolve()] = page
    if not pages:
        return [f"{book}: no HTML files (run `mdbook build docs` first)"]
    broken = []
    for path, page in pages.items():
        here = path.relative_to(book.resolve())
        for link in page.links:
            if external(link) or link.startswith("javascript:"):
                continue
            parts = urllib.parse.urlsplit(link)
            target_path = urllib.parse.unquote(parts.path)
            if not target_path:
                # `#anchor` alone: this page's own heading (also on mdbook's 404 page).
                target = path
            elif target_path.startswith("/") or (page.base and page.base.startswith("/")):
                # mdbook's 404 page sets <base href="/">: its links are from the book's root
                # (where the site is served), so resolve them there.
                target = (book / target_path.lstrip("/")).resolve()
            else:
                target = (path.parent / target_path).resolve()
            if target.is_dir():
                target = target / "index.html"
            if not target.is_relative_to(book.resolve()):
                broken.append(f"{here}: {link}: outside the book")
                continue
            if not target.exists():
                broken.append(f"{here}: {link}: no such file")
                continue
            if parts.fragment and target.suffix == ".html":
                fragment = urllib.parse.unquote(parts.fragment)
                if fragment not in pages[target].ids:
                    broken.append(f"{here}: {link}: no #{fragment} in {target.relative_to(book.resolve())}")
    return broken


def github_anchors(markdown):
    """The ids GitHub gives the headings of a Markdown file."""
    ids, seen, fenced = set(), {}, False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if fenced or not line.startswith("#"):
            continue
        text = line.lstrip("#").strip().lower()
        text = re.sub(r"[^\w\- ]", "", text).replace(" ", "-")
        n = seen.get(text, 0)
        seen[text] = n + 1
        ids.add(text if n == 0 else f"{text}-{n}")
    return ids


def markdown_links(markdown):
    """The targets of inline links and images, outside code blocks and code spans."""
    links, fenced = [], False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        line = re.sub(r"`[^`]*`", "", line)
        links += re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", line)
    return links


def check_readme(readme):
    broken = []
    text = readme.read_text(encoding="utf-8")
    for link in markdown_links(text):
        if external(link):
            continue
        parts = urllib.parse.urlsplit(link)
        target = (readme.parent / urllib.parse.unquote(parts.path)).resolve() if parts.path else readme
        if not target.exists():
            broken.append(f"README.md: {link}: no such file")
        elif parts.fragment and target.suffix == ".md":
            if parts.fragment not in github_anchors(target.read_text(encoding="utf-8")):
                broken.append(f"README.md: {link}: no heading #{parts.fragment}")
    return broken


def check_presets(book):
    return [
        f"preset `{p['name']}`: no page sources/{p['name']}.html in the book "
        f"(run scripts/preset-pages.py, edit the page, list it in docs/src/SUMMARY.md)"
        for p in presets()
        if not (book / "sources" / f"{p['name']}.html").exists()
    ]


def main():
    book = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "book"
    broken = check_book(book) + check_readme(ROOT / "README.md") + check_presets(book)
    for line in broken:
        print(line)
    checked = len(list(book.rglob("*.html")))
    if broken:
        print(f"{len(broken)} broken link(s)", file=sys.stderr)
        sys.exit(1)
    print(f"links: {checked} HTML files and README.md, none broken; every preset has its page")


if __name__ == "__main__":
    main()

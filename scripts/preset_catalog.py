"""The preset catalog of src/source/catalog.rs, read as data (stdlib only).

Shared by scripts/preset-pages.py (skeleton pages) and scripts/check-links.py (every preset
has its page). The catalog is Rust source: each `Preset { … }` literal is read field by field.
"""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
CATALOG = ROOT / "src" / "source" / "catalog.rs"

_STR = r'"((?:[^"\\]|\\.)*)"'
_FIELD = {
    "name": re.compile(r"\bname:\s*" + _STR),
    "docs": re.compile(r"\bdocs:\s*" + _STR),
    "verifies": re.compile(r"\bverifies:\s*" + _STR),
    "replay": re.compile(r"\breplay:\s*" + _STR),
    "handshake": re.compile(r"\bhandshake:\s*" + _STR),
    "batch": re.compile(r"\bbatch:\s*" + _STR),
}
_KEYS = re.compile(r'\bkeys:\s*r#"(.*?)"#', re.S)
_FIXTURE = re.compile(r"\bfixture:\s*\(\s*" + _STR + r"\s*,\s*" + _STR + r"\s*\)")


def _unescape(s):
    return s.replace('\\"', '"').replace("\\\\", "\\")


def presets():
    """The catalog's presets, in its order: dicts of name, docs, keys, verifies, replay,
    handshake, batch, fixture, fixture_type."""
    text = CATALOG.read_text()
    start = text.index("pub(crate) const PRESETS")
    body = text[start:text.index("\n];", start)]
    out = []
    for chunk in re.split(r"\n    Preset \{", body)[1:]:
        p = {k: _unescape(r.search(chunk).group(1)) for k, r in _FIELD.items()}
        p["keys"] = _KEYS.search(chunk).group(1)
        fixture = _FIXTURE.search(chunk)
        p["fixture"], p["fixture_type"] = fixture.group(1), fixture.group(2)
        out.append(p)
    if not out:
        raise SystemExit(f"no presets read from {CATALOG}")
    return out

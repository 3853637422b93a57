"""The documentation: the README stays a front door and no link leaves the repository except to public URLs.
(The README's device example runs as printed, with the light device SDK: tests/test_device_sdk_install.py.)"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_README_LINES = 200


def documents() -> list[Path]:
    """The markdown files whose links are checked: the README, docs/ and deploy/."""
    return [README, *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "deploy").rglob("*.md"))]


# ---------------------------------------------------------------------------- markdown helpers
_FENCE = re.compile(r"^\s*(```|~~~)")
_INLINE_CODE = re.compile(r"`+[^`]*`+")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
_HTML = re.compile(r"""<(?:a|img)\b[^>]*?\b(?:href|src)\s*=\s*["']([^"']+)["']""", re.I)


def _prose(text: str, *, inline_code: bool = False) -> list[tuple[int, str]]:
    """(line number, line) of the lines outside fenced code blocks, inline code removed unless ``inline_code``."""
    out, fenced = [], False
    for no, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append((no, line if inline_code else _INLINE_CODE.sub("", line)))
    return out


def links(text: str) -> list[tuple[int, str]]:
    """(line number, target) of every link, image, reference definition and HTML href/src outside code."""
    out = []
    for no, line in _prose(text):
        out += [(no, m.group(1)) for m in _LINK.finditer(line)]
        out += [(no, m.group(1)) for m in _HTML.finditer(line)]
        m = _REF_DEF.match(line)
        if m:
            out.append((no, m.group(1)))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    return re.sub(r"[^\w\- ]", "", text.replace("`", "").strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading anchor of a markdown text (repeated headings get -1, -2, ... as on GitHub)."""
    seen: dict[str, int] = {}
    out = set()
    for _, line in _prose(text, inline_code=True):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def bad_links(doc: Path, root: Path = ROOT) -> list[str]:
    """The links of ``doc`` that are neither an http(s) URL nor a file or anchor inside ``root``."""
    text = doc.read_text(encoding="utf-8")
    out = []
    for no, target in links(text):
        where = f"{doc.relative_to(root)}:{no}: {target}"
        if re.match(r"https?://", target):
            continue
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):
            out.append(f"{where} (not an http(s) URL)")
            continue
        path, _, anchor = target.partition("#")
        if path.startswith("/"):
            out.append(f"{where} (absolute path)")
            continue
        dest = (doc.parent / path).resolve() if path else doc.resolve()
        if not dest.is_relative_to(root.resolve()):
            out.append(f"{where} (outside the repository)")
        elif not dest.exists():
            out.append(f"{where} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text(encoding="utf-8")):
            out.append(f"{where} (no heading #{anchor} in {dest.name})")
    return out


# ---------------------------------------------------------------------------- the README and the links
def test_readme_is_at_most_200_lines():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines (at most {MAX_README_LINES})"


def test_readme_lists_the_documents():
    """The README's table of documents names every document of docs/ and deploy/README.md."""
    text = README.read_text(encoding="utf-8")
    for doc in (*sorted((ROOT / "docs").glob("*.md")), ROOT / "deploy" / "README.md"):
        name = doc.relative_to(ROOT).as_posix()
        assert f"]({name})" in text, f"README.md does not link {name}"


def test_every_link_stays_in_the_repository_or_is_a_public_url():
    problems = [p for doc in documents() for p in bad_links(doc)]
    assert not problems, "\n".join(problems)


def test_the_link_checker_finds_bad_links(tmp_path):
    """The checker itself can fail: links out of the tree, absolute paths, missing files and anchors."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n\n## Some `code` & more\n", encoding="utf-8")
    doc = tmp_path / "README.md"
    doc.write_text("\n".join([
        "[design](../shared/DESIGN.md) and [seeds](../shared/seeds/)",
        "![img](/etc/passwd) [mail](mailto:x@example.org) [gone](docs/b.md)",
        "[bad anchor](docs/a.md#nope) [good anchor](docs/a.md#some-code--more) [self](#a-title)",
        "[ok](docs/a.md) [url](https://example.org/x) `[in code](../shared/x.md)`",
        "```", "[in a block](../shared/y.md)", "```",
        '<img src="../outside.png">', "[ref]: ../shared/z.md", "# A title"]), encoding="utf-8")
    found = bad_links(doc, tmp_path)
    assert [f.split(": ", 1)[1] for f in found] == [
        "../shared/DESIGN.md (outside the repository)", "../shared/seeds/ (outside the repository)",
        "/etc/passwd (absolute path)", "mailto:x@example.org (not an http(s) URL)", "docs/b.md (no such file)",
        "docs/a.md#nope (no heading #nope in a.md)", "../outside.png (outside the repository)",
        "../shared/z.md (outside the repository)"], found

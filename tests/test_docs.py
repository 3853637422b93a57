"""The documentation: the README stays a front door, no link leaves the repository except to public URLs,
and the README's device example runs as printed against a real ingest on the local stack."""
from __future__ import annotations

import asyncio
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from ldpstream_dev.processes import port_is_free, stop_child, wait_http_ok
from wire.envelope import parse
from wire.topics import Topics

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_README_LINES = 200
MAX_EXAMPLE_LINES = 15
INGEST_URL = "http://127.0.0.1:8080"  # the default of `ldp ingest` (--host, --port), what the example prints


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


# ---------------------------------------------------------------------------- the device example
def section(text: str, heading: str) -> str:
    """The text of the ``## heading`` section, up to the next heading of level 2."""
    m = re.search(rf"^## {re.escape(heading)}\s*$(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert m, f"README.md has no section '## {heading}'"
    return m.group(1)


def code_blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, re.M | re.S)


def example() -> tuple[list[str], str]:
    """The device example of the README: its shell lines and its python code (the first block of each)."""
    sec = section(README.read_text(encoding="utf-8"), "Device example")
    bash, python = code_blocks(sec, "bash"), code_blocks(sec, "python")
    assert bash and python, "the README's device example needs a ```bash and a ```python block"
    return bash[0].strip().splitlines(), python[0]


def test_device_example_is_short():
    shell, code = example()
    lines = [ln for ln in [*shell, *code.splitlines()] if ln.strip()]
    assert len(lines) <= MAX_EXAMPLE_LINES, f"the device example has {len(lines)} lines of code"


def _command(line: str) -> str:
    """A shell line without its comment and trailing ``&``."""
    return line.split("  #", 1)[0].strip().removesuffix("&").strip()


async def _batches(bootstrap: str, topic: str, timeout: float = 30.0) -> list:
    """Every envelope on ``topic`` (waits until there is one)."""
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False)
    await consumer.start()
    out: list = []
    try:
        deadline = time.monotonic() + timeout
        while not out and time.monotonic() < deadline:
            for recs in (await consumer.getmany(timeout_ms=500)).values():
                out += [parse(r.value) for r in recs]
    finally:
        await consumer.stop()
    return out


@pytest.mark.timeout(600)  # a cold numba cache compiles the randomizer first (minutes on a loaded 2-core machine)
def test_device_example_runs_as_printed(local_stack, tmp_path):
    """The README's shell lines (the session's local stack standing in for `ldp stack up`) and then its python
    block, both as printed, in a directory that holds the campaign file at the printed path: the ingest
    answers ``{'accepted': 1}`` and the broker holds the one report."""
    shell, code = example()
    commands = [_command(ln) for ln in shell]
    assert commands[0] == "ldp stack up", commands
    ingest_line = next(c for c in commands if c.startswith("ldp ingest"))
    setup = [c for c in commands[1:] if c != ingest_line]

    work = tmp_path / "device"
    (work / "deploy" / "campaigns").mkdir(parents=True)
    shutil.copy(ROOT / "deploy" / "campaigns" / "demo.toml", work / "deploy" / "campaigns" / "demo.toml")
    (work / ".run").mkdir()
    (work / ".run" / "stack").symlink_to(local_stack.run_dir, target_is_directory=True)  # `ldp stack up`'s

    env = {k: v for k, v in os.environ.items() if not k.startswith("LDP_")}
    env.update(local_stack.client_env(), PATH=os.pathsep.join((str(Path(sys.executable).parent), env["PATH"])))
    # the token lines as printed (they export the secret for the ingest)
    script = "set -e\n" + "\n".join(setup) + '\nprintf %s "$LDP_DEVICE_SECRET_FILE"'
    run = subprocess.run(["bash", "-c", script], cwd=work, env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert (work / "device.token").read_text().startswith("ldp1."), "`ldp tokens issue` wrote no token"
    prefix = f"docs-{uuid.uuid4().hex[:8]}."  # this test's own topics on the shared broker
    ingest_env = dict(env, LDP_DEVICE_SECRET_FILE=run.stdout, LDP_TOPIC_PREFIX=prefix)

    deadline = time.monotonic() + 60
    while not port_is_free(8080):  # the example's URL: the ingest's default port
        assert time.monotonic() < deadline, "port 8080 stays taken by another process"
        time.sleep(1)
    log = open(tmp_path / "ingest.log", "wb")
    ingest = subprocess.Popen(shlex.split(ingest_line), cwd=work, env=ingest_env, stdout=log,
                              stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_http_ok(f"{INGEST_URL}/health", ingest, 60, "the README's ingest",
                     lambda: (tmp_path / "ingest.log").read_text(), poll=0.2)
        device = subprocess.run([sys.executable, "-c", code], cwd=work, env=env, capture_output=True, text=True,
                                timeout=420)
        assert device.returncode == 0, device.stderr
        assert "{'accepted': 1}" in device.stdout, device.stdout
        assert (work / "device-state").is_dir()
        batches = asyncio.run(_batches(local_stack.info.kafka_bootstrap, Topics.with_prefix(prefix).reports))
        assert [(b.campaign, b.attribute, b.count) for b in batches] == [("fleet-health", "app_version", 1)]
    finally:
        stop_child(ingest)
        log.close()

"""The README and the pages under docs/: short landing page, links that lead somewhere."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import clean_environ

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DEMO = REPO / "examples" / "vllm_failures.py"
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]

# A landing page: what cgguard is, the set-up commands, switching it on, the smallest API.
README_MAX_LINES = 160

# [text](target) outside code: the target up to whitespace or the closing parenthesis.
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
_CODE_SPAN = re.compile(r"`[^`\n]*`")


def links(page: Path) -> list[str]:
    """The link targets of ``page``, code blocks and code spans left out."""
    text = _CODE_SPAN.sub("", _FENCE.sub("", page.read_text()))
    return _LINK.findall(text)


def is_relative(target: str) -> bool:
    return not re.match(r"[a-z][a-z0-9+.-]*:", target, re.IGNORECASE)


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the headings of ``page``."""
    text = _FENCE.sub("", page.read_text())
    headings = re.findall(r"^#+\s+(.+?)\s*$", text, re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def repo_path(page: Path, target: str) -> str:
    """``target``, a link of ``page`` without its anchor, as a path from the repository root."""
    return (page.parent / target.partition("#")[0]).resolve().relative_to(REPO).as_posix()


def test_anchor_of_a_heading_is_githubs() -> None:
    """Headings become GitHub's anchors: lower case, punctuation dropped, spaces as hyphens."""
    page = REPO / "docs" / "integrations.md"
    assert "following-vllms-flag-and-other-frameworks" in anchors(page)
    assert "torchrun-and-multiprocessing" in anchors(page)


def test_links_found_outside_code_only(tmp_path: Path) -> None:
    """A link in a code span or a code block is text; one in prose is a link."""
    page = tmp_path / "page.md"
    page.write_text("[a](a.md) `[b](b.md)`\n```md\n[c](c.md)\n```\n[d](https://x.org/d)\n")
    assert links(page) == ["a.md", "https://x.org/d"]
    assert [t for t in links(page) if is_relative(t)] == ["a.md"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_relative_links_lead_to_files_and_headings(page: Path) -> None:
    """Every relative link names a file of the repository, and its anchor a heading there."""
    broken = []
    for target in filter(is_relative, links(page)):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.is_file():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading with that anchor")
    assert broken == []


def test_readme_links_every_page_of_docs() -> None:
    """Each page under docs/ is reachable from the README."""
    linked = {repo_path(README, t) for t in links(README) if is_relative(t) and t[0] != "#"}
    pages = {p.relative_to(REPO).as_posix() for p in PAGES[1:]}
    assert pages - linked == set()


def test_readme_is_a_landing_page() -> None:
    """The README stays short: the reference lives under docs/."""
    assert len(README.read_text().splitlines()) <= README_MAX_LINES


def test_readme_demo_output_quotes_the_demos_lines() -> None:
    """Each frame in the README's demo output shows the demo's own line at that number."""
    block = README.read_text().split("```text\n", 1)[1].split("```", 1)[0]
    source = DEMO.read_text().splitlines()
    frames = re.findall(r'File "[^"]*/examples/vllm_failures\.py", line (\d+), in \w+\n(.*)', block)
    assert len(frames) == 3
    assert [code.strip() for _, code in frames] == [
        source[int(line) - 1].strip() for line, _ in frames
    ]
    assert block.splitlines()[-1] == "serving: refused (CaptureDisabledError)"


# How a process started with these interpreter flags was activated, without importing torch.
_ACTIVATION = "import sys; s = sys.modules.get('cgguard._boot'); print(s and s.activated_by)"


@pytest.mark.subprocess
@pytest.mark.parametrize(
    ("flags", "activated_by"),
    [((), "pth"), (("-I",), "pth"), (("-S",), "None")],
    ids=["plain", "-I", "-S"],
)
def test_interpreter_flags_that_activation_reaches(
    flags: tuple[str, ...], activated_by: str
) -> None:
    """As docs/configuration.md says: ``-I`` still runs the .pth; only ``-S`` escapes it."""
    done = subprocess.run(
        [sys.executable, *flags, "-c", _ACTIVATION],
        env=clean_environ(CGGUARD_ENABLED="1"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, f"{activated_by}\n", "")

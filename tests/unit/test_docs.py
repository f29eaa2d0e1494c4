"""The pages a user and a maintainer read: links that resolve, a README that stays short, and
the two set-up commands it promises."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted(
    p
    for p in ROOT.glob("**/*.md")
    if not any(part.startswith(".") for part in p.relative_to(ROOT).parts)
)
# Pages linked before they exist, written beside this split; checked as soon as they exist.
NOT_YET: set[str] = set()
LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.DOTALL)
FENCED = re.compile(r"```.*?```", re.DOTALL)


def _slug(heading: str) -> str:
    """The anchor a Markdown renderer gives a heading, as GitHub makes it."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = FENCED.sub("", page.read_text())  # inline code in a heading stays in its anchor
    return {_slug(m) for m in re.findall(r"^#+ (.+)$", text, re.MULTILINE)}


def _links(page: Path) -> list[str]:
    return LINK.findall(CODE.sub("", page.read_text()))


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_resolves(page):
    broken = []
    for link in _links(page):
        if re.match(r"[a-z]+:", link):  # https:, mailto:
            continue
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if str(target.relative_to(ROOT)) in NOT_YET and not target.exists():
            continue
        if not target.exists():
            broken.append(link)
        elif anchor and target.suffix == ".md" and anchor not in _anchors(target):
            broken.append(f"{link} (no such heading)")
    assert broken == [], f"{page.relative_to(ROOT)}: {broken}"


def test_the_readme_stays_a_users_page():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


def test_the_readme_keeps_its_two_set_up_commands():
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Set-up on a fresh machine", 1)[1].split("```bash\n", 1)[1]
    commands = [line.split("#")[0].strip() for line in block.split("```", 1)[0].splitlines()]
    assert commands == ["bash scripts/demo.sh", "bash scripts/test.sh"]
    assert (ROOT / "scripts" / "demo.sh").exists()
    assert "exec bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()  # what CI runs


def test_the_torch_wheel_command_names_the_pinned_torch():
    pins = (ROOT / "tests" / "requirements" / "torch-cpu.txt").read_text()
    pinned = re.search(r"^torch==([\d.]+)", pins, re.MULTILINE)
    assert pinned
    development = (ROOT / "docs" / "development.md").read_text()
    assert f"pip download torch=={pinned[1]} " in development

"""Every relative link of the README and docs/ leads somewhere: the file exists and, for a link with an
anchor into a page, a heading of that page makes that anchor (GitHub's rule: lower case, punctuation
dropped, spaces to hyphens)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Pages other changes write alongside this manual; a link to one is checked like any other once it exists.
WRITTEN_ELSEWHERE = {"docs/dashboard.md", "docs/durable-execution.md", "docs/replicas-and-failover.md",
                     "docs/design/claim.md"}  # fmt: skip


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
    heads = [line.lstrip("#").strip().lower() for line in text.splitlines() if line.startswith("#")]
    return {re.sub(r"[^\w\- ]", "", h).replace(" ", "-") for h in heads}


def test_every_relative_link_resolves() -> None:
    broken = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
        for link in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", link):
                continue
            path, _, anchor = link.partition("#")
            target = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(REPO)}: {link}"
            if not target.exists():
                if str(target.relative_to(REPO)) not in WRITTEN_ELSEWHERE:
                    broken.append(f"{where} (no such file)")
            elif anchor and target.suffix == ".md" and anchor not in _anchors(target):
                broken.append(f"{where} (no heading makes #{anchor})")
    assert not broken, "\n".join(broken)


def test_the_anchor_rule_matches_github() -> None:
    page = REPO / "docs" / "operations.md"
    assert {"pgbouncer-transaction-pooling", "roles", "maintenance"} <= _anchors(page)

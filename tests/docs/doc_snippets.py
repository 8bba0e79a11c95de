"""The fenced code blocks of the docs pages (and the README), and the marker above each.

The convention the docs tests enforce: a ``bash``/``sh``/``shell``/``console`` or
``python``/``py`` block is either run by tests/docs as it stands, or the line right above
it is an HTML comment saying why not:

- ``<!-- needs: WHAT -->``: what it needs that the test machine lacks (a GPU, an E2B key,
  several machines, ...);
- ``<!-- tested-by: PATH[::TEST][, PATH...] -->``: the test file (or CI script) that
  exercises it; each path must exist, and a named test must be defined in its file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SHELL = {"bash", "sh", "shell", "console"}
PYTHON = {"python", "py", "python3"}
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})(?P<lang>[\w+-]*)")
MARKER = re.compile(r"^\s*<!--\s*(?P<kind>needs|tested-by):(?P<what>.*?)-->\s*$")


@dataclass(frozen=True)
class Block:
    page: str  # path relative to the repository root
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    marker: str | None  # "needs" / "tested-by" / None
    what: str  # the marker's text

    @property
    def kind(self) -> str | None:
        """``shell`` or ``python`` for a snippet the convention covers, else None (data, output)."""
        return "shell" if self.lang in SHELL else "python" if self.lang in PYTHON else None

    def where(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    """Every page of the site, and the README (the front page that links into it)."""
    return sorted(DOCS.rglob("*.md")) + [ROOT / "README.md"]


def blocks(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence = m.group("indent"), m.group("fence")
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            j += 1
        code = "\n".join(ln[len(indent):] if ln.startswith(indent) else ln for ln in lines[i + 1:j]) + "\n"
        k = i - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        mk = MARKER.match(lines[k]) if k >= 0 else None
        out.append(Block(page=str(path.relative_to(ROOT)), line=i + 1, lang=m.group("lang").lower(), code=code,
                         marker=mk.group("kind") if mk else None, what=mk.group("what").strip() if mk else ""))  # fmt: skip
        i = j + 1
    return out


def all_blocks() -> list[Block]:
    return [b for p in pages() for b in blocks(p)]


def marker_problem(block: Block) -> str | None:
    """Why a block's marker does not hold, or None."""
    if block.marker == "needs":
        return None if block.what else "an empty `needs:` marker: say what it needs"
    if block.marker == "tested-by":
        if not block.what:
            return "an empty `tested-by:` marker"
        for ref in (r.strip() for r in block.what.split(",")):
            path, _, test = ref.partition("::")
            if not (ROOT / path).is_file():
                return f"tested-by names {path!r}, which does not exist"
            if test and not re.search(rf"^(async )?def {re.escape(test)}\(", (ROOT / path).read_text(), re.M):
                return f"tested-by names {ref!r}: no test {test!r} in {path}"
    return None

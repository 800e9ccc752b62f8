#!/usr/bin/env python3
"""Checks that the documentation stays true (run by `make lint`).

1. Links: every relative link and image in README.md, CHANGELOG.md and
   docs/*.md points at a file or directory that exists, and every `#anchor`
   at a heading (or an explicit `id`/`name`) of its target page, with
   GitHub's anchor rules: the heading's text, lowercased, every character
   that is not a letter, a digit, `-`, `_` or a space dropped, spaces to
   `-`; a repeated anchor gets `-1`, `-2`, ... in order.
2. The module map: every module of filter/src (a `.rs` file or a directory
   with `mod.rs`; the test-only `tests.rs`, `tests/` and `*_tests.rs` files aside) is
   named, as a code span (`` `bucket` `` or `` `local::bucket` ``), in
   filter/src/lib.rs's crate documentation and in docs/architecture.md.
3. User pages (README.md and docs/*.md, not CHANGELOG.md) do not speak of
   how the project was built: a small deny list of words.

Usage: check_docs.py [--root DIR]. Exit status 0 when all holds, 1 with one
line per problem (`file:line: message`) otherwise. Standard library only.
"""

from __future__ import annotations

import argparse
import re
import sys
import unicodedata
from dataclasses import dataclass
from pathlib import Path

# Case-insensitive, whole words. The changelog is the one place for history.
DENIED = [
    (re.compile(r"\bissues?\s+#?\d", re.I), "speaks of an issue number"),
    (re.compile(r"\bholes?\s+#?\d", re.I), "speaks of a hole number"),
    (re.compile(r"\bseed\b", re.I), 'says "seed"'),
    (re.compile(r"\bsessions?\b", re.I), 'says "session"'),
    (re.compile(r"\bdesign article\b", re.I), 'says "design article"'),
    (re.compile(r"\bwhat was asked\b", re.I), 'says "what was asked"'),
]

FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
ATX = re.compile(r"^\s{0,3}(#{1,6})(?:\s+(.*?))?\s*$")
SETEXT = re.compile(r"^\s{0,3}(=+|-+)\s*$")
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+[\"'(][^)]*)?\)")
REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
HTML_ID = re.compile(r"<a\s[^>]*\b(?:id|name)\s*=\s*[\"']([^\"']+)[\"']", re.I)
HTML_HREF = re.compile(r"<(?:a|img)\s[^>]*\b(?:href|src)\s*=\s*[\"']([^\"']+)[\"']", re.I)
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
LINE_ANCHOR = re.compile(r"^L\d+(?:C\d+)?(?:-L\d+(?:C\d+)?)?$")


@dataclass(frozen=True)
class Problem:
    path: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}" if self.line else f"{self.path}: {self.message}"


def prose_lines(text: str) -> list[tuple[int, str]]:
    """The lines outside fenced code blocks, numbered from 1."""
    out, fence = [], None
    for n, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if fence is None:
            if m:
                fence = m.group(1)[0] * len(m.group(1))
                continue
            out.append((n, line))
        elif m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) \
                and not line.strip()[len(m.group(1)):].strip():
            fence = None
    return out


def strip_code_spans(line: str) -> str:
    return CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)


def heading_text(raw: str) -> str:
    """A heading's rendered text: links to their text, markup removed."""
    text = re.sub(r"\s+#+\s*$", "", raw)  # closing hashes
    text = re.sub(r"!\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"\[([^\]]*)\]\[[^\]]*\]", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text)
    text = CODE_SPAN.sub(lambda m: m.group(2).strip(), text)
    text = re.sub(r"(\*{1,3})(\S(?:.*?\S)?)\1", r"\2", text)
    text = re.sub(r"(?<![\w])(_{1,3})(\S(?:.*?\S)?)\1(?![\w])", r"\2", text)
    return text.strip()


def slug(text: str) -> str:
    """GitHub's anchor for a heading's rendered text (before de-duplication)."""
    kept = []
    for ch in text.lower():
        cat = unicodedata.category(ch)
        if ch in " -" or cat[0] in "LMN" or cat == "Pc":
            kept.append(ch)
    return "".join(kept).replace(" ", "-")


def headings(text: str) -> list[tuple[int, str]]:
    """(line, rendered text) of every ATX and setext heading."""
    out, prev = [], None
    for n, line in prose_lines(text):
        m = ATX.match(line)
        if m:
            out.append((n, heading_text(m.group(2) or "")))
            prev = None
            continue
        s = SETEXT.match(line)
        if s and prev is not None and prev[0] == n - 1 and prev[1].strip() \
                and not re.match(r"^\s{0,3}([-*+]\s|\d+[.)]\s|>|\|)", prev[1]) \
                and "|" not in prev[1]:
            out.append((prev[0], heading_text(prev[1].strip())))
            prev = None
            continue
        prev = (n, line)
    return out


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for _, h in headings(text):
        base = slug(h)
        count = seen.get(base, 0)
        found.add(base if count == 0 else f"{base}-{count}")
        seen[base] = count + 1
    for _, line in prose_lines(text):
        found.update(HTML_ID.findall(line))
    return found


def link_targets(text: str) -> list[tuple[int, str]]:
    out = []
    for n, line in prose_lines(text):
        bare = strip_code_spans(line)
        out += [(n, m.group(1)) for m in INLINE_LINK.finditer(bare)]
        out += [(n, t) for t in HTML_HREF.findall(bare)]
        m = REF_DEF.match(bare)
        if m:
            out.append((n, m.group(1)))
    return out


def doc_pages(root: Path) -> list[Path]:
    pages = [root / "README.md", root / "CHANGELOG.md"]
    pages += sorted((root / "docs").glob("*.md"))
    return [p for p in pages if p.is_file()]


def user_pages(root: Path) -> list[Path]:
    return [p for p in doc_pages(root) if p.name != "CHANGELOG.md"]


def rel(root: Path, p: Path) -> str:
    try:
        return str(p.relative_to(root))
    except ValueError:
        return str(p)


def check_links(root: Path) -> list[Problem]:
    problems: list[Problem] = []
    cache: dict[Path, set[str]] = {}
    for page in doc_pages(root):
        text = page.read_text(encoding="utf-8")
        for line, target in link_targets(text):
            if not target or SCHEME.match(target) or target.startswith("//"):
                continue
            path_part, _, anchor = target.partition("#")
            path_part = path_part.split("?", 1)[0]
            if path_part:
                base = root if path_part.startswith("/") else page.parent
                dest = (base / path_part.lstrip("/")).resolve()
            else:
                dest = page.resolve()
            where = rel(root, page)
            if not dest.exists():
                problems.append(Problem(where, line, f"link to {target}: {rel(root, dest)} does not exist"))
                continue
            if not anchor:
                continue
            if dest.is_file() and dest.suffix.lower() in (".md", ".markdown"):
                if dest not in cache:
                    cache[dest] = anchors(dest.read_text(encoding="utf-8"))
                if anchor not in cache[dest]:
                    problems.append(Problem(where, line, f"link to {target}: no heading of "
                                            f"{rel(root, dest)} has the anchor #{anchor}"))
            elif not LINE_ANCHOR.match(anchor):
                problems.append(Problem(where, line, f"link to {target}: an anchor into "
                                        f"{rel(root, dest)}, which has no headings"))
    return problems


def filter_modules(src: Path) -> list[str]:
    """Module paths of filter/src, e.g. `flow`, `local`, `local::bucket`."""
    mods = set()
    for f in src.rglob("*.rs"):
        parts = list(f.relative_to(src).with_suffix("").parts)
        if parts == ["lib"] or "tests" in parts or parts[-1].endswith("_tests"):
            continue
        if parts[-1] == "mod":
            parts = parts[:-1]
        if parts:
            mods.add("::".join(parts))
    return sorted(mods)


def crate_doc(lib_rs: str) -> str:
    """The `//!` lines at the top of lib.rs, as markdown."""
    out = []
    for line in lib_rs.splitlines():
        s = line.strip()
        if s.startswith("//!"):
            out.append(s[3:].removeprefix(" "))
        elif s.startswith("#![") or not s:
            continue
        else:
            break
    return "\n".join(out)


def named_in(doc: str) -> set[str]:
    """The code spans of a text, normalised to module paths."""
    names = set()
    for m in CODE_SPAN.finditer(doc):
        c = m.group(2).strip()
        c = re.sub(r"^(crate|self|super)::", "", c)
        c = re.sub(r"^(filter/)?(src/)?", "", c)
        c = re.sub(r"(/mod)?\.rs$", "", c).replace("/", "::")
        names.add(c)
    return names


def check_module_map(root: Path) -> list[Problem]:
    src = root / "filter" / "src"
    lib = src / "lib.rs"
    arch = root / "docs" / "architecture.md"
    if not lib.is_file():
        return [Problem(rel(root, lib), 0, "missing: the module map starts there")]
    modules = filter_modules(src)
    problems = []
    for where, doc in (
        (rel(root, lib) + " (crate doc)", crate_doc(lib.read_text(encoding="utf-8"))),
        (rel(root, arch), arch.read_text(encoding="utf-8") if arch.is_file() else None),
    ):
        if doc is None:
            problems.append(Problem(where, 0, "missing: the architecture page must name every "
                                    "module of filter/src"))
            continue
        names = named_in(doc)
        missing = [m for m in modules
                   if m not in names and m.rsplit("::", 1)[-1] not in names
                   and not any(n.endswith("::" + m) for n in names)]
        if missing:
            problems.append(Problem(where, 0, "does not name these modules of filter/src "
                                    "(as `name` or `parent::name`): " + ", ".join(missing)))
    return problems


def check_words(root: Path) -> list[Problem]:
    problems = []
    for page in user_pages(root):
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            for pattern, why in DENIED:
                m = pattern.search(line)
                if m:
                    problems.append(Problem(rel(root, page), n, f"{why} ({m.group(0)!r}): user pages "
                                            "speak of the product; history goes to CHANGELOG.md"))
    return problems


def check(root: Path) -> list[Problem]:
    root = root.resolve()
    return check_links(root) + check_module_map(root) + check_words(root)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent,
                    help="the repository (default: this file's)")
    args = ap.parse_args(argv)
    problems = check(args.root)
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        print(f"check_docs: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    pages = doc_pages(args.root.resolve())
    print(f"check_docs: {len(pages)} pages, links, anchors, module map and wording ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())

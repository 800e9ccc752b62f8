"""tools/check_docs.py on small trees: it passes a sound one, and fails on a
broken link, a broken anchor, a module the module map leaves out, a missing
architecture page and a history word on a user page.

Run by `make lint`: .deps/venv/bin/python -m pytest tools/test_check_docs.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import check_docs  # noqa: E402

LIB_RS = """\
//! The filter. Start with `flow`, over `host`; `local` (with
//! `local::bucket` and `slot`) keeps the state.

pub mod flow;
pub mod host;
pub mod local;
"""

ARCHITECTURE = """\
# Architecture

| module | what |
|---|---|
| `flow` | the flow |
| `host` | the host |
| `local` | the local layer |
| `local::bucket` | buckets |
| `local::slot` | slots |

## Modes: design notes

Text.
"""

README = """\
# tenant-ratelimit

See [the configuration](docs/configuration.md), its
[keys](docs/configuration.md#the-filters-configuration), the
[second example](docs/configuration.md#example-1), the
[history](CHANGELOG.md) and [a tour](#a-five-minute-tour).
External links are not checked: [Envoy](https://www.envoyproxy.io/).

## A five-minute tour

```sh
echo "[not a link](nowhere.md) in a code block"
```
And `[not a link](nowhere.md)` in a code span.
"""

CONFIGURATION = """\
# Configuration

## The filter's configuration

## Example

## Example

Back to the [README](../README.md#a-five-minute-tour), and
[design notes](architecture.md#modes-design-notes).
"""

CHANGELOG = """\
# Changelog

- 2026-11-30: the fix of issue 5 and hole 3, found in a session.
"""


def make_tree(root: Path) -> Path:
    files = {
        "README.md": README,
        "CHANGELOG.md": CHANGELOG,
        "docs/configuration.md": CONFIGURATION,
        "docs/architecture.md": ARCHITECTURE,
        "filter/src/lib.rs": LIB_RS,
        "filter/src/flow.rs": "//! flow\n",
        "filter/src/flow/tests.rs": "// test-only module: not in the map\n",
        "filter/src/host.rs": "//! host\n",
        "filter/src/local/mod.rs": "//! local\n",
        "filter/src/local/bucket.rs": "//! bucket\n",
        "filter/src/local/slot.rs": "//! slot\n",
    }
    for name, text in files.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


def edit(root: Path, name: str, old: str, new: str) -> None:
    p = root / name
    text = p.read_text()
    assert old in text, (name, old)
    p.write_text(text.replace(old, new))


def messages(root: Path) -> list[str]:
    return [str(p) for p in check_docs.check(root)]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return make_tree(tmp_path)


def test_a_sound_tree_passes(tree):
    assert messages(tree) == []
    assert check_docs.main(["--root", str(tree)]) == 0


def test_a_link_to_a_missing_page_fails(tree):
    edit(tree, "README.md", "docs/configuration.md),", "docs/configure.md),")
    assert messages(tree) == [
        "README.md:3: link to docs/configure.md: docs/configure.md does not exist"]
    assert check_docs.main(["--root", str(tree)]) == 1


def test_a_link_to_a_missing_anchor_fails(tree):
    edit(tree, "README.md", "#the-filters-configuration", "#the-filter-configuration")
    assert messages(tree) == [
        "README.md:4: link to docs/configuration.md#the-filter-configuration: "
        "no heading of docs/configuration.md has the anchor #the-filter-configuration"]


def test_an_anchor_in_the_same_page_is_checked(tree):
    edit(tree, "README.md", "(#a-five-minute-tour)", "(#a-ten-minute-tour)")
    [m] = messages(tree)
    assert m.startswith("README.md:6: link to #a-ten-minute-tour: no heading of README.md")


def test_a_repeated_heading_gets_a_numbered_anchor(tree):
    edit(tree, "README.md", "#example-1", "#example-2")
    [m] = messages(tree)
    assert "#example-2" in m


def test_a_module_the_architecture_page_leaves_out_fails(tree):
    edit(tree, "docs/architecture.md", "| `local::bucket` | buckets |\n", "")
    assert messages(tree) == [
        "docs/architecture.md: does not name these modules of filter/src "
        "(as `name` or `parent::name`): local::bucket"]


def test_a_new_module_must_be_named_in_both_places(tree):
    (tree / "filter/src/cost.rs").write_text("//! cost\n")
    assert messages(tree) == [
        "filter/src/lib.rs (crate doc): does not name these modules of filter/src "
        "(as `name` or `parent::name`): cost",
        "docs/architecture.md: does not name these modules of filter/src "
        "(as `name` or `parent::name`): cost"]


def test_a_module_named_only_in_prose_is_not_named(tree):
    # "flow" as a plain word does not name the module; only a code span does.
    edit(tree, "filter/src/lib.rs", "Start with `flow`, over", "Start with the flow, over")
    [m] = messages(tree)
    assert m.endswith("): flow")


def test_a_missing_architecture_page_fails(tree):
    (tree / "docs/architecture.md").unlink()
    edit(tree, "docs/configuration.md", "\n[design notes](architecture.md#modes-design-notes).", "")
    assert messages(tree) == [
        "docs/architecture.md: missing: the architecture page must name every module of filter/src"]


@pytest.mark.parametrize("words", ["as issue 12 asked", "hole 5's probe", "the Seed test",
                                   "in one session", "the design article"])
def test_history_words_fail_on_user_pages(tree, words):
    edit(tree, "docs/configuration.md", "# Configuration\n", f"# Configuration\n\nFixed {words}.\n")
    [m] = messages(tree)
    assert m.startswith("docs/configuration.md:3: ")


def test_history_words_are_fine_in_the_changelog_and_similar_words_elsewhere(tree):
    edit(tree, "docs/configuration.md", "# Configuration\n",
         "# Configuration\n\nfuzz/seeds.py writes the inputs; issues are tracked elsewhere.\n")
    assert messages(tree) == []


@pytest.mark.parametrize("heading, anchor", [
    ("The filter's configuration", "the-filters-configuration"),
    ("Performance (`make bench`)", "performance-make-bench"),
    ("Failure behaviour, measured", "failure-behaviour-measured"),
    ("Modes: design notes", "modes-design-notes"),
    ("Choosing timeout_ms", "choosing-timeout_ms"),
    ("Containers: the compose demo (`make compose-demo`)", "containers-the-compose-demo-make-compose-demo"),
    ("A **bold** [link](x.md) and `code`", "a-bold-link-and-code"),
    ("Ünïcode héading", "ünïcode-héading"),
])
def test_anchors_follow_githubs_rules(heading, anchor):
    assert check_docs.anchors(f"# {heading}\n") == {anchor}


def test_setext_headings_and_html_anchors_count():
    text = "Title\n=====\n\nSub title\n---------\n\n<a id=\"custom\"></a>\n\n| a | b |\n|---|---|\n"
    assert check_docs.anchors(text) == {"title", "sub-title", "custom"}

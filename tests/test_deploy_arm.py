"""One mechanism for x86 and ARM: the aarch64 Envoy of the same PyPI wheel
version, under Debian's qemu-user, loads the same .wasm and limits
(e2e/arm_attempt.py, `make arm-attempt`)."""

from __future__ import annotations

import sys

import harness

sys.path.insert(0, str(harness.REPO / "e2e"))
import arm_attempt  # noqa: E402


def test_the_aarch64_envoy_under_qemu_runs_the_same_wasm_and_answers_200_then_429():
    lines: list[str] = []
    report = arm_attempt.attempt(say=lines.append)
    assert "/1.40.0/" in report["version"], "\n".join(lines)
    assert report["statuses"] == [200, 429], "\n".join(lines)

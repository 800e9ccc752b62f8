"""pytest wiring for tests/harness/: one Stack per test, always closed, and
the tail of every process log attached to a failing test's report."""

from __future__ import annotations

import re
import subprocess

import pytest

import harness


def pytest_addoption(parser):
    parser.addoption(
        "--service", choices=harness.SERVICES, default=harness.SERVICE,
        help="the rate-limit service the stacks start: envoyproxy/ratelimit "
             "(envoy-ratelimit, the default; or $TRL_SERVICE) or ratelimit-counter (counter)")


def pytest_configure(config):
    harness.SERVICE = config.getoption("service")
    missing = harness.missing_binaries()
    if missing:
        # An error, not a skip: a run that tests nothing must not look green.
        raise pytest.UsageError(
            "integration tests need these files (run `make deps build`):\n  "
            + "\n  ".join(missing))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    stack = getattr(item, "_trl_stack", None)
    if report.failed and stack is not None:
        report.sections.append(
            ("process logs", f"work dir: {stack.workdir}\n\n{stack.log_tails(60)}"))


def _envoy_version() -> str:
    """The version `$TRL_ENVOY --version` prints (1.40.0), or why there is none."""
    try:
        out = subprocess.run([str(harness.ENVOY_BIN), "--version"], capture_output=True,
                             text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unknown ({e})"
    m = re.search(r"version: [0-9a-f]+/([0-9][^/]*)/", out)
    return m.group(1) if m else "unknown"


def pytest_report_header(config):
    # Which Envoy runs the stacks: .deps/bin/envoy (1.40), or an older one
    # of `make envoy-matrix` (TRL_ENVOY=.deps/bin/envoy-1.36 ...).
    return [f"rate-limit service: {harness.SERVICE}",
            f"envoy: {harness.ENVOY_BIN} ({_envoy_version()})"]


@pytest.fixture
def stack(request, tmp_path):
    """A Stack whose processes live only as long as the test."""
    s = harness.Stack(tmp_path)
    request.node._trl_stack = s
    try:
        yield s
    finally:
        s.close()

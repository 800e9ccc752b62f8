"""e2e/docker-compose.yml in real containers (e2e/compose_demo.py, the same
run as `make compose-demo`): the seed through both Envoys, and nothing left
behind afterwards."""

from __future__ import annotations

import shutil
import sys
from collections import Counter


import harness

sys.path.insert(0, str(harness.REPO / "e2e"))
import compose_demo  # noqa: E402


def test_compose_demo_admits_exactly_100_of_1000_then_none_and_leaves_nothing_behind():
    # An error, not a skip, when the tools are missing: `make deps-ship` installs them.
    assert shutil.which("dockerd") and shutil.which("docker-compose"), "run `make deps-ship`"
    lines: list[str] = []
    report = compose_demo.run_demo(say=lines.append)
    output = "\n".join(lines)
    assert report["runs"] == [Counter({200: 100, 429: 900}), Counter({429: 1000})], output
    assert report["redis_persistence"]["appendonly"] == "yes", output
    assert report["redis_persistence"]["appendfsync"] == "everysec", output
    # Every image the compose file names was built here, none pulled.
    assert set(report["images"]) == {"envoyproxy/envoy:v1.40.0", "envoyproxy/ratelimit:3fb70258",
                                     "redis:7-alpine"}
    assert report["containers_after_down"] == [], output
    assert set(report["networks_after_down"]) <= {"host", "none"}, output
    assert report["leftovers"] == [], output
    assert report["ok"], output

"""e2e/docker-compose.yml in real containers with ratelimit-counter in
place of envoyproxy/ratelimit (e2e/compose_demo.py --service counter, the
same run as `make compose-demo-counter`): the counter's image as `make
counter-image` builds it, loaded into dockerd; the seed through both
Envoys, counted by the counter in Redis; nothing left behind."""

from __future__ import annotations

import shutil
import sys
from collections import Counter

import harness

sys.path.insert(0, str(harness.REPO / "e2e"))
import compose_demo  # noqa: E402


def test_compose_demo_with_the_counter_admits_exactly_100_of_1000_then_none():
    assert shutil.which("dockerd") and shutil.which("docker-compose"), "run `make deps-ship`"
    lines: list[str] = []
    report = compose_demo.run_demo(say=lines.append, service="counter")
    output = "\n".join(lines)
    assert report["runs"] == [Counter({200: 100, 429: 900}), Counter({429: 1000})], output
    # Built here, none pulled: the counter's image from oci-counter, no
    # envoyproxy/ratelimit image at all.
    assert set(report["images"]) == {"envoyproxy/envoy:v1.40.0", "redis:7-alpine",
                                     f"tenant-ratelimit-counter:{harness_version()}"}, output
    # The counter counted, in its own keys (trl:{<domain>...}), one per window
    # of the tenant's group (perhour 100); beside them, the Envoys that
    # called for the domain (the fleet's size its answers carry): both
    # Envoys' one set.
    counts = [k for k in report["redis_keys"] if not k.startswith("{trl_fleet}")]
    fleets = [k for k in report["redis_keys"] if k.startswith("{trl_fleet}")]
    assert counts and all(k.startswith("trl:{12:internal-api:tenant-a}:")
                          for k in counts), output
    assert fleets == ["{trl_fleet}_internal-api"], output
    assert report["containers_after_down"] == [], output
    assert set(report["networks_after_down"]) <= {"host", "none"}, output
    assert report["leftovers"] == [], output
    assert report["ok"], output


def harness_version() -> str:
    import tomllib
    return tomllib.loads((harness.REPO / "Cargo.toml").read_text())["workspace"]["package"]["version"]

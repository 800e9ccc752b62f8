"""A rule `name` in the service's YAML is the service's text, and the filter
writes it into X-RateLimit-Limit (`;name="..."`, as Envoy's own filter
does). A name with CR LF once became a header of its own over HTTP/1, and a
`"` broke the quoting. Here the service really loads such a name, and no
response, admitted, refused by the service or refused from the cache, has
an extra header.

The responses are read as raw HTTP/1.1 bytes: a client library would
already have split an injected line into a header of its own.
"""

from __future__ import annotations

import pytest

import harness
from harness import ensure_window_room, raw_get, unique

LIMITS = {"x-tenant-id": {"default": {"perminute": 2}}}
# YAML double-quoted escapes: a real CR LF, quotes and a backslash.
HOSTILE_YAML = r'"evil\r\nX-Injected: yes\r\n\"quoted\" back\\slash"'
# What the filter may write of it: the characters an RFC 9651 String can
# hold, `"` and `\` escaped.
EXPECTED_NAME = r'name="evilX-Injected: yes\"quoted\" back\\slash"'


def service_yaml(domain: str) -> str:
    return f"""domain: {domain}
descriptors:
  - key: generic_key
    value: per_minute
    descriptors:
      - key: tenant
        rate_limit:
          unit: minute
          requests_per_unit: 2
          name: {HOSTILE_YAML}
"""


def test_a_hostile_rule_name_never_makes_a_header_of_its_own(stack):
    if stack.service == "counter":
        pytest.skip("a rule name written in envoyproxy/ratelimit's YAML: the counter reads "
                    "no YAML, it names a limit after its team-file group, whose name is "
                    "letters, digits, '_' and '-' (validate refuses any other)")
    gen = stack.generate(LIMITS)
    yaml_path = stack.workdir / "hostile.yaml"
    yaml_path.write_text(service_yaml(gen.domain))
    redis = stack.redis()
    rls = stack.ratelimit(redis, yaml_path)
    # The service loaded the rule (and its limit is the one that refuses below).
    assert f"{gen.domain}.generic_key_per_minute.tenant:" in rls.rlconfig()
    upstream = stack.upstream()
    envoy = stack.envoy(gen.plugin_config(timeout_ms=harness.COUNTING_TIMEOUT_MS), rls, upstream)

    ensure_window_room(60, 15)
    tenant = unique("tenant")
    answers = [raw_get(envoy.url, [tenant]) for _ in range(4)]
    assert [status for status, _ in answers] == [200, 200, 429, 429], answers
    c = envoy.filter_counters()
    assert (c.get("allowed"), c.get("over_limit"), c.get("cached_over_limit")) == (2, 1, 1), c

    for status, lines in answers:
        names = [line.split(":", 1)[0].strip().lower() for line in lines]
        assert "x-injected" not in names, lines
        # Every line is a header (name: value), none a stray continuation.
        assert all(":" in line and not line[:1].isspace() for line in lines), lines
        limit = [line for line in lines if line.lower().startswith("x-ratelimit-limit:")]
        assert len(limit) == 1, lines
        # The name is there, escaped, on the service's answers and on the cache's.
        assert limit[0].endswith(EXPECTED_NAME), limit[0]

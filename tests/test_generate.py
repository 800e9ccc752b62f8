"""ratelimit-config generate/check/explain against the real components: the
service YAML it writes is what envoyproxy/ratelimit loads, the rate_limits
block it writes is what Envoy accepts (and enforces, with Envoy's own
filter), `check` catches a service YAML edited by one character, and the
Redis keys `explain` prints are the ones the service counts under."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path

import pytest

import harness
from harness import run_cli, run_sequential, tally, unique

# The seed example of the design.
SEED = {"x-tenant-id": {
    "default": {"persecond": 5, "perminute": 20, "perhour": 30},
    "group_1": {"persecond": 50, "perminute": 70, "perhour": 100,
                "header_value": ["tenant-b", "tenant-c"]}}}

# Units a group leaves out, a unit only one group sets, and tenant values
# that YAML would read as something else unless quoted (null, a bool, a number).
AWKWARD = {"x-tenant-id": {
    "default": {"perminute": 20, "perhour": 30},
    "gold": {"persecond": 50, "perday": 1000, "header_value": ["null", "yes", "007", "a b"]}}}

UNIT_NAMES = {"persecond": ("second", "SECOND"), "perminute": ("minute", "MINUTE"),
              "perhour": ("hour", "HOUR"), "perday": ("day", "DAY")}


def expected_rules(limits: dict, domain: str, key: str = "tenant") -> dict[str, tuple[str, int]]:
    """The rules the service must hold, worked out here from the team JSON
    alone: per unit any group sets, the default rule and one per listed
    tenant (unlimited where its group leaves the unit out)."""
    (groups,) = limits.values()
    units = [u for u in UNIT_NAMES if any(u in g for g in groups.values())]
    out = {}
    for u in units:
        name, upper = UNIT_NAMES[u]
        prefix = f"{domain}.generic_key_per_{name}.{key}"
        for gname, g in groups.items():
            if gname == "default":
                if u in g:
                    out[prefix] = (upper, g[u])
            else:
                for t in g["header_value"]:
                    out[f"{prefix}_{t}"] = (upper, g[u]) if u in g else ("UNKNOWN", 0)
    return out


@pytest.mark.parametrize("limits", [SEED, AWKWARD], ids=["seed", "awkward"])
def test_the_service_loads_every_generated_rule(stack, limits):
    gen = stack.generate(limits)
    rls = stack.ratelimit(stack.redis(), gen)
    loaded = harness.rlconfig_rules(rls.rlconfig(), gen.domain)
    assert loaded == expected_rules(limits, gen.domain), rls.rlconfig()


def test_generate_is_deterministic(tmp_path):
    (tmp_path / "a").mkdir()
    limits = tmp_path / "a" / "limits.json"
    limits.write_text(json.dumps(SEED, indent=2))
    run_cli("generate", limits, "--domain", "internal-api", "--out", tmp_path / "one")
    # Again, from another directory, with a relative path.
    subprocess.run([str(harness.CLI), "generate", "a/limits.json", "--domain", "internal-api",
                    "--out", "two"], cwd=tmp_path, check=True, capture_output=True,
                   stdin=subprocess.DEVNULL, timeout=60)
    names = ["ratelimit.yaml", "envoy-rate-limits.yaml", "plugin-config.json"]
    for name in names:
        one = (tmp_path / "one" / name).read_bytes()
        assert one == (tmp_path / "two" / name).read_bytes(), name
    for name in names[:2]:
        first = (tmp_path / "one" / name).read_text().splitlines()[0]
        assert first == "# generated from limits.json by ratelimit-config; do not edit"
    # The generated files and the manifest of what was written, nothing else.
    assert sorted(p.name for p in (tmp_path / "one").iterdir()) == sorted(
        names + [".ratelimit-config-written"])


def _validate(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(harness.envoy_argv(path, 1, ["--mode", "validate"]),
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def test_envoy_accepts_the_generated_rate_limits(stack):
    gen = stack.generate(SEED)
    block = harness.native_rate_limits(gen).read_text()
    text = harness.render_native_envoy_config(block, gen.domain, listen_port=10000,
                                              admin_port=10001, rls_port=10002,
                                              upstream_port=10003)
    assert text.count("generic_key: { descriptor_value: per_") == 3
    good = stack.workdir / "native.yaml"
    good.write_text(text)
    proc = _validate(good)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]

    # The same run refuses a block with a wrong field: validate mode really
    # reads rate_limits.
    bad = stack.workdir / "native-bad.yaml"
    bad.write_text(text.replace("descriptor_value:", "descriptor_valu:", 1))
    proc = _validate(bad)
    assert proc.returncode != 0
    assert "descriptor_valu" in proc.stdout + proc.stderr


def test_envoys_own_filter_enforces_the_generated_limits(stack):
    """Envoy's native filter sends every unit for every tenant: with the
    generated files, tenant-b gets group_1's 50 per second and a default
    tenant 5 (the unlimited rules keep the default from catching tenant-b)."""
    limits = {"x-tenant-id": {
        "default": {"persecond": 5, "perhour": 1000},
        "group_1": {"persecond": 50, "header_value": ["tenant-b"]}}}
    gen = stack.generate(limits)
    redis = stack.redis()
    rls = stack.ratelimit(redis, gen)
    upstream = stack.upstream()
    listen, admin = harness.free_port(), harness.free_port()
    text = harness.render_native_envoy_config(
        harness.native_rate_limits(gen).read_text(), gen.domain, listen_port=listen,
        admin_port=admin, rls_port=rls.grpc_port, upstream_port=upstream.listen_port)
    envoy = harness.Envoy(stack, "envoy-native", text, listen, admin)

    # 5 per second: the 8 requests must meet one per-second window.
    results = harness.in_one_second(
        lambda: run_sequential([envoy.url], 8, tenant=unique("tenant")))
    assert tally(results) == Counter({200: 5, 429: 3}), harness.summary(results)

    harness.ensure_window_room(1, 0.8)
    results = run_sequential([envoy.url], 8, tenant="tenant-b")
    assert tally(results) == Counter({200: 8}), harness.summary(results)
    # tenant-b's per-hour descriptor matched its unlimited rule, not the default's 1000.
    assert not redis.keys(f"{gen.domain}_generic_key_per_hour_tenant_tenant-b_*")


def _check(gen: harness.Generated, service_yaml: Path) -> subprocess.CompletedProcess:
    return run_cli("check", "--plugin-config", gen.plugin_config_path,
                   "--service-config", service_yaml, check=False)


# (one-character edit of the generated service YAML, what check must say)
EDITS = {
    "limit": (("requests_per_unit: 70", "requests_per_unit: 71"),
              'group_1 tenant "tenant-b", per_minute: matches {d}.generic_key_per_minute.'
              'tenant_tenant-b, which allows 71 per minute, but the group sets perminute 70'),
    "unit-descriptor": (("value: per_hour", "value: per_hous"),
                        "default any other tenant, per_hour: no rule matches the descriptor "
                        "[generic_key=per_hour, tenant=<any other tenant>]; the service answers "
                        "OK, so perhour 30 is not enforced"),
    "tenant-value": (("value: tenant-c", "value: tenant-x"),
                     'group_1 tenant "tenant-c", per_second: matches {d}.generic_key_per_second.'
                     'tenant, which allows 5 per second, but the group sets persecond 50'),
    "descriptor-key": (("      - key: tenant  # default", "      - key: tenan  # default"),
                       "default any other tenant, per_second: no rule matches the descriptor"),
    "unit": (("unit: minute, requests_per_unit: 20", "unit: minuet, requests_per_unit: 20"),
             'invalid rate limit unit "minuet": the service refuses this file'),
    "domain": (("domain: {d}", "domain: {d}x"),
               'domain "{d}x" is not the filter\'s domain "{d}"'),
}


@pytest.mark.parametrize("case", sorted(EDITS))
def test_check_names_a_one_character_edit(tmp_path, case):
    domain = "internal-api"
    gen = harness.generate(SEED, tmp_path / "gen", domain)
    proc = _check(gen, gen.ratelimit_yaml)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        f'ok: 9 descriptors of 2 groups match the rules of domain "{domain}"',
        "tenant from: header x-tenant-id",
    ]

    (old, new), message = EDITS[case]
    old, new, message = (s.format(d=domain) for s in (old, new, message))
    text = gen.ratelimit_yaml.read_text()
    assert text.count(old) >= 1, (old, text)
    edited = tmp_path / "edited.yaml"
    edited.write_text(text.replace(old, new, 1))
    proc = _check(gen, edited)
    assert proc.returncode == 1, proc
    assert message in proc.stderr, proc.stderr
    # Every line names the file, line and column.
    for line in proc.stderr.splitlines()[:-1]:
        assert line.startswith(f"{edited}:"), line


def test_explain_prints_the_keys_the_service_counts(stack):
    fleet = stack.fleet(SEED, envoys=1, timeout_ms=harness.COUNTING_TIMEOUT_MS)
    harness.ensure_window_room(1, 0.8)
    results = run_sequential(fleet.urls, 1, tenant="tenant-c")
    assert tally(results) == Counter({200: 1}), harness.summary(results)
    # The service read its clock somewhere while the request was under way:
    # in the second it was sent, or (past a boundary) the one it was answered
    # in. The per-second key exists for exactly one of them.
    counted = []
    for at in sorted({int(results[0].started), int(harness.answered_at(results[0]))}):
        proc = run_cli("explain", "--plugin-config", fleet.generated.plugin_config_path,
                       "--tenant", "tenant-c", "--at", at)
        keys = [line.split(":", 1)[1].strip() for line in proc.stdout.splitlines()
                if line.strip().startswith("redis key:")]
        assert len(keys) == 3, proc.stdout
        assert "group:   group_1 (listed in its header_value)" in proc.stdout
        if all(fleet.redis.get_int(key) == 1 for key in keys):
            counted.append((at, proc))
    assert len(counted) == 1, (counted, keys, fleet.redis.keys(f"{fleet.domain}_*"))
    at, proc = counted[0]
    # The same through the team file and --domain, but for the group's mode
    # and how calls go and what a request gets when the service cannot decide,
    # which only the plugin configuration holds.
    team = run_cli("explain", fleet.generated.out_dir / "limits.json", "--domain", fleet.domain,
                   "--tenant", "tenant-c", "--at", at, "--service", stack.service)
    plugin_only = ("mode:    exact (local.mode): the service decides every request\n",
                   "calls:   batched per worker (rate_limit_service.batch): while a call is under "
                   "way, requests queue and go together in the next one, at most 100 descriptors "
                   "per call\n",
                   "failure: allow: let through, unlimited (fail open)\n",
                   "breaker: after 5 failed calls in a row, no calls: one probe every 1000 ms "
                   "until the service answers\n")
    stripped = proc.stdout
    for line in plugin_only:
        assert line in proc.stdout and line not in team.stdout, line
        stripped = stripped.replace(line, "")
    # Where the service was read: the plugin configuration, or --service.
    if stack.service == "counter":
        said = "service: counter ({}): ratelimit-counter's rules and keys\n"
        from_file = said.format("the plugin configuration's rate_limit_service.service")
        assert from_file in stripped and said.format("--service") in team.stdout, proc.stdout
        stripped = stripped.replace(from_file, said.format("--service"))
    assert team.stdout == stripped


def test_validate_reports_every_problem_with_its_place(tmp_path):
    path = tmp_path / "limits.json"
    path.write_text('{\n  "x-tenant-id": {\n'
                    '    "default": { "persecond": 5, "perminute": 20, "perhour": 30 },\n'
                    '    "group_1": { "persecond": 50, "perminute": -5, "perhour": 100,\n'
                    '                 "header_value": ["tenant-b", "tenant-b"] }\n  }\n}\n')
    proc = run_cli("validate", path, check=False)
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        f"{path}:4:48: x-tenant-id.group_1.perminute: must be a positive integer, got -5",
        f'{path}:5:47: x-tenant-id.group_1.header_value[1]: "tenant-b" is listed twice in this group',
    ]


def test_schema_is_json_schema_2020_12():
    proc = run_cli("schema")
    schema = json.loads(proc.stdout)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["additionalProperties"] == {"$ref": "#/$defs/groups"}

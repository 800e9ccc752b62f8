#!/usr/bin/env python3
"""Writes the seed inputs of the fuzz targets into seeds/<target>/.

`make fuzz` starts each target from corpus/<target>/ (the committed,
minimised corpus) plus these seeds; this script only needs to run again
when the input formats change. Seeds: the team files of the CLI's fixtures
and the demo, plugin configurations built around them, RateLimitResponse
messages encoded by hand (field numbers of envoyproxy/data-plane-api
rls.proto), and slot values in the layout of filter/src/local/slot.rs.
"""
import json
import pathlib
import struct

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = HERE / "seeds"


def write(target, name, data):
    d = OUT / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data if isinstance(data, bytes) else data.encode())


# ---------------------------------------------------------------- team files
team_files = sorted((ROOT / "ratelimit-config/tests/fixtures").glob("*/*.json"))
team_files.append(ROOT / "e2e/limits.json")
for p in team_files:
    write("team_file", f"{p.parent.name}-{p.stem}", p.read_bytes())

# ---------------------------------------------------------------- plugin configs
SEED_LIMITS = {
    "x-tenant-id": {
        "default": {"persecond": 5, "perminute": 20, "perhour": 30},
        "group_1": {"persecond": 50, "perminute": 70, "perhour": 100,
                    "header_value": ["tenant-b", "tenant-c"]},
    }
}
full = {
    "domain": "internal-api",
    "limits": SEED_LIMITS,
    "rate_limit_service": {"cluster": "ratelimit", "timeout_ms": 20},
    "failure_mode_deny": False,
    "status_on_error": 500,
    "missing_tenant": "allow",
    "descriptor_key": "tenant",
    "headers": "draft_version_03",
    "local": {"enabled": True, "slots": 4096,
              "groups": {"group_1": {"tokens_per_second": 2, "burst": 10}}},
}
write("plugin_config", "full", json.dumps(full, indent=2))
write("plugin_config", "minimal", json.dumps(
    {"domain": "d", "rate_limit_service": {"cluster": "c"},
     "limits": {"x-t": {"default": {"perday": 1}}}}))
write("plugin_config", "bad-many", json.dumps(
    {"domain": "", "limits": {"x-t": {"default": {"perhour": -5}}},
     "rate_limit_service": {"cluster": "rl", "timeout_ms": 0, "x": 1},
     "missing_tenant": "block", "status_on_error": 42, "headers": "off",
     "local": {"slots": 0, "enabled": "yes", "groups": {"g": {"burst": 1.5}}}}))
write("plugin_config", "not-object", "[1, 2]")
for p in team_files:
    try:
        limits = json.loads(p.read_text())
    except ValueError:
        continue
    write("plugin_config", f"limits-{p.parent.name}-{p.stem}", json.dumps(
        {"domain": "d", "rate_limit_service": {"cluster": "c"}, "limits": limits,
         "headers": "off", "missing_tenant": "deny", "failure_mode_deny": True}))


# ---------------------------------------------------------------- service answers
def varint(n):
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field_varint(tag, n):
    return varint(tag << 3) + varint(n)


def field_bytes(tag, b):
    return varint(tag << 3 | 2) + varint(len(b)) + b


def status(code, limit=None, unit=0, remaining=0, reset=None, name=""):
    b = field_varint(1, code)
    if limit is not None:
        rl = field_varint(1, limit) + field_varint(2, unit)
        if name:
            rl += field_bytes(3, name.encode())
        b += field_bytes(2, rl)
    b += field_varint(3, remaining)
    if reset is not None:
        secs, nanos = reset
        b += field_bytes(4, field_varint(1, secs) + field_varint(2, nanos))
    return b


def response(code, statuses):
    return field_varint(1, code) + b"".join(field_bytes(2, s) for s in statuses)


OK, OVER = 1, 2
answers = {
    "ok-two": response(OK, [status(OK, 5, 1, 4, (0, 500_000_000)),
                            status(OK, 30, 3, 29, (1800, 0))]),
    "over-hour": response(OVER, [status(OK, 5, 1, 4, (0, 1)),
                                 status(OVER, 30, 3, 0, (1799, 999_000_000))]),
    "over-named": response(OVER, [status(OVER, 100, 2, 0, (59, 0), name="gold")]),
    "over-four": response(OVER, [status(OVER, n, u, 0, (n, 0)) for n, u in
                                 [(1, 1), (2, 2), (3, 3), (4, 4)]] +
                          [status(OVER, 9, 7, 0, (-1, -1))]),
    "ok-nolimit": response(OK, [status(OK)]),
    "unknown": response(0, []),
    "empty": b"",
    "negative": response(OVER, [status(OVER, 2**32 - 1, -1 & 0xFFFFFFFF, 2**32 - 1,
                                       (-(2**63), -(2**31)))]),
}
for name, body in answers.items():
    for head, suffix in [(0, ""), (1, "-off")]:
        write("verdict", name + suffix, bytes([head]) + body)
write("verdict", "no-body", bytes([2]))
write("verdict", "grpc-14", bytes([4 | (13 << 3)]))

# ---------------------------------------------------------------- slots
# Version 3: header (36 bytes, the mode tag at 35), four statuses, the mode
# block (a lease, 48 bytes, or a sync state, 64).
SLOT_VERSION = 3
MODE_AT = 36 + 4 * 20
SLOT_BYTES = MODE_AT + 64


def slot(fp, bucket=None, over=None, lease=None, sync=None):
    b = bytearray(SLOT_BYTES)
    flags = 0
    b[2:10] = struct.pack("<Q", fp)
    if bucket:
        flags |= 1
        b[10:26] = struct.pack("<QQ", *bucket)
    if over:
        flags |= 2
        until, statuses = over
        b[26:34] = struct.pack("<Q", until)
        b[34] = len(statuses)
        for i, (rpu, unit, over_limit, remaining, reset) in enumerate(statuses):
            at = 36 + i * 20
            b[at:at + 20] = struct.pack("<IBBxxIQ", rpu, unit, over_limit, remaining, reset)
    if lease:
        # tokens, until, refill_at, remaining, remaining_until, rate second,
        # rate count, rate of the second before.
        b[35] = 1
        b[MODE_AT:MODE_AT + 48] = struct.pack("<IQQIQQII", *lease)
    elif sync:
        # views (4), their windows' ends (4), unsynced, in flight, push_at.
        b[35] = 2
        views, untils, unsynced, in_flight, push_at = sync
        b[MODE_AT:MODE_AT + 64] = struct.pack("<4I4QIIQ", *views, *untils, unsynced,
                                              in_flight, push_at)
    b[0] = SLOT_VERSION
    b[1] = flags
    return bytes(b)


NOW = 1_796_061_600_123


def head(now, rate, burst, flags):
    return struct.pack("<Q", now)[:6] + struct.pack("<IIB", rate, burst, flags)


slots = {
    "bucket": slot(42, bucket=(3000, NOW - 10)),
    "bucket-empty": slot(42, bucket=(0, NOW)),
    "over": slot(42, over=(NOW + 5000, [(30, 3, 1, 0, NOW + 5000), (5, 1, 0, 4, NOW + 100)])),
    "both": slot(42, bucket=(1000, NOW - 3000),
                 over=(NOW - 1, [(100, 2, 1, 0, NOW - 1)])),
    "lease": slot(42, bucket=(1000, NOW - 3000),
                  lease=(7, NOW + 20_000, 0, 40, NOW + 20_000, NOW // 1000, 3, 9)),
    "sync": slot(42, sync=([3, 9, 0, 0], [NOW + 20_000, NOW + 2_000_000, 0, 0], 5, 2, NOW - 10)),
    "bad-mode": slot(42, lease=(1, 2, 3, 4, 5, 6, 7, 8))[:35] + bytes([3])
                + slot(42, lease=(1, 2, 3, 4, 5, 6, 7, 8))[36:],
    "zero": bytes(SLOT_BYTES),
    "short": slot(42)[:40],
}
for name, stored in slots.items():
    write("slot", name, head(NOW, 5, 10, 0) + stored)
    write("slot", name + "-other", head(NOW, 5, 10, 8) + stored)
    write("slot", name + "-nobucket-off", head(NOW + 10_000, 1, 1, 3) + stored)


# ---------------------------------------------------------------- the counter's calls
# RateLimitRequest (rls.proto): domain 1, descriptors 2 (entries 1: key 1,
# value 2; hits_addend 3: UInt64Value), hits_addend 3.
def rls_entry(key, value):
    return field_bytes(1, field_bytes(1, key.encode()) + field_bytes(2, value.encode()))


def rls_descriptor(entries, hits=None):
    b = b"".join(rls_entry(k, v) for k, v in entries)
    if hits is not None:
        b += field_bytes(3, field_varint(1, hits))
    return b


def rls_request(domain, descriptors, hits=0):
    b = field_bytes(1, domain.encode()) + b"".join(field_bytes(2, d) for d in descriptors)
    return b + (field_varint(3, hits) if hits else b"")


MARK = [("trl.request", "")]
PUSH = [("trl.request", "push")]


def unit(u, tenant, route=None):
    e = [("generic_key", u), ("tenant", tenant)]
    return e + ([("route", route)] if route else [])


calls = {
    "one-tenant": rls_request("d", [rls_descriptor(unit(u, "x")) for u in
                                    ("per_second", "per_minute", "per_hour")]),
    "gold-sliding-route": rls_request("d", [rls_descriptor(unit("per_minute", "a")),
                                            rls_descriptor(unit("per_month", "a")),
                                            rls_descriptor(unit("per_minute", "a", "export"))]),
    "marked-two": rls_request("d", [rls_descriptor(MARK), rls_descriptor(unit("per_minute", "a")),
                                    rls_descriptor(MARK), rls_descriptor(unit("per_week", "c")),
                                    rls_descriptor(unit("per_year", "c"))]),
    "marked-push": rls_request("d", [rls_descriptor(PUSH), rls_descriptor(unit("per_minute", "x"), hits=25),
                                     rls_descriptor(unit("per_hour", "x"), hits=25),
                                     rls_descriptor(MARK), rls_descriptor(unit("per_minute", "x"))]),
    "hits-max": rls_request("d", [rls_descriptor(unit("per_minute", "b"), hits=(1 << 64) - 1),
                                  rls_descriptor(unit("per_hour", "b"), hits=0)], hits=(1 << 32) - 1),
    "check-only": rls_request("d", [rls_descriptor(unit("per_second", "z"), hits=0)]),
    "unknown-domain": rls_request("other", [rls_descriptor(unit("per_minute", "a"))]),
    "no-rule": rls_request("d", [rls_descriptor([("generic_key", "per_fortnight"), ("tenant", "a")]),
                                 rls_descriptor([("tenant", "a")]),
                                 rls_descriptor(unit("per_day", "a"))]),
    "too-many-entries": rls_request("d", [rls_descriptor([("k", str(i)) for i in range(9)])]),
    "empty": b"",
    "twice-one-counter": rls_request("d", [rls_descriptor(unit("per_minute", "a"), hits=2),
                                           rls_descriptor(unit("per_minute", "a"), hits=2)]),
    "bad-utf8": field_bytes(1, b"\xff\xfe"),
    "truncated": rls_request("d", [rls_descriptor(unit("per_minute", "a"))])[:-3],
}
for name, data in calls.items():
    write("rls_request", name, data)


# decision: 4 bytes of instant, call hits_addend, repeats, then per
# descriptor (kind | unit << 3, tenant, hits); see fuzz/src/decision.rs.
def spec(kind, unit_i=1, tenant=0, hits=0):
    return bytes([kind | unit_i << 3, tenant, hits])


decisions = {
    "mark-then-gold": bytes([0, 0, 0, 0, 0, 3]) + spec(0) + spec(1, 1, 0) + spec(1, 5, 0),
    "two-requests": bytes([1, 2, 3, 4, 1, 3]) + spec(0) + spec(1, 1, 0, 3) + spec(0) + spec(1, 1, 1, 4),
    "route": bytes([9, 0, 0, 0, 0, 3]) + spec(0) + spec(4, 1, 0) + spec(1, 1, 0),
    "calendar": bytes([0, 0, 0, 0, 2, 2]) + spec(0) + spec(1, 4, 2) + spec(1, 6, 2),
    "default": bytes([0, 0, 0, 0, 0, 3]) + spec(1, 0, 3) + spec(1, 1, 3) + spec(1, 2, 3),
    "hits-huge": bytes([0, 0, 0, 0, 0, 1]) + spec(1, 1, 0, 255) + spec(1, 1, 0, 254),
    "check-only": bytes([0, 0, 0, 0, 0, 3]) + spec(1, 1, 0, 1) + spec(1, 1, 0, 1),
    "malformed": bytes([5, 5, 5, 5, 5, 5]) + spec(6) + spec(7) + spec(5, 1, 0) + spec(1, 7, 0),
    "tag-tenant": bytes([0, 0, 0, 0, 0, 3]) + spec(1, 1, 4) + spec(1, 2, 4),
    "empty": b"",
    "one-counter-twice": bytes([0, 0, 0, 0, 0, 3]) + spec(0) + spec(1, 1, 0, 2) + spec(1, 1, 0, 3),
    "year-end": bytes([255, 255, 255, 255, 1, 3]) + spec(0) + spec(1, 6, 2) + spec(1, 4, 2),
}
for name, data in decisions.items():
    write("decision", name, data)

"""The x-ratelimit-* response headers (DRAFT_VERSION_03), parsed."""

from __future__ import annotations

import re
from dataclasses import dataclass, field


@dataclass
class RateLimitHeaders:
    limit: int  # the limit of the tightest descriptor
    windows: list[tuple[int, int]]  # (limit, window seconds), one per descriptor
    remaining: int
    reset: int
    retry_after: int | None
    # Each window's `name="..."` (the service's name for the rule), or None.
    names: list[str | None] = field(default_factory=list)

    @property
    def tightest_window(self) -> int | None:
        """The window of the descriptor the first number belongs to, when unambiguous."""
        matching = [w for (lim, w) in self.windows if lim == self.limit]
        return matching[0] if len(matching) == 1 else None


_QUOTA = re.compile(r'^\s*(\d+)\s*;\s*w\s*=\s*(\d+)\s*(?:;\s*name\s*=\s*"([^"]*)"\s*)?$')


def parse_ratelimit_headers(headers: dict[str, str]) -> RateLimitHeaders:
    """Parse DRAFT_VERSION_03 headers; raise ValueError with the header text if malformed."""
    raw = headers.get("x-ratelimit-limit")
    if raw is None:
        raise ValueError(f"no x-ratelimit-limit in {headers}")
    parts = [p.strip() for p in raw.split(",")]
    if not parts or not parts[0].isdigit():
        raise ValueError(f"x-ratelimit-limit {raw!r}: first item is not the limit")
    windows, names = [], []
    for p in parts[1:]:
        m = _QUOTA.match(p)
        if not m:
            raise ValueError(
                f'x-ratelimit-limit {raw!r}: {p!r} is not <limit>;w=<secs>[;name="<name>"]')
        windows.append((int(m.group(1)), int(m.group(2))))
        names.append(m.group(3))
    if not windows:
        raise ValueError(f"x-ratelimit-limit {raw!r}: no <limit>;w=<secs> item")

    def integer(name: str) -> int:
        v = headers.get(name)
        if v is None or not re.fullmatch(r"\d+", v.strip()):
            raise ValueError(f"{name} {v!r} is not a non-negative integer")
        return int(v)

    retry = headers.get("retry-after")
    return RateLimitHeaders(
        limit=int(parts[0]),
        windows=windows,
        remaining=integer("x-ratelimit-remaining"),
        reset=integer("x-ratelimit-reset"),
        retry_after=integer("retry-after") if retry is not None else None,
        names=names,
    )

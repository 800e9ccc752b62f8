//! The options whose value is one of a few names, and those names.

/// An option whose value is one of a few names.
pub(super) trait Named: Copy + 'static {
    const ALL: &'static [Self];
    fn name(self) -> &'static str;
}

/// What to do with a request that carries no tenant header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(
    feature = "cli",
    derive(serde::Serialize),
    serde(into = "&'static str")
)]
pub enum MissingTenant {
    /// Not limited (the behaviour of Envoy's own `request_headers` action).
    Allow,
    /// Answered 429.
    Deny,
}

impl Named for MissingTenant {
    const ALL: &'static [Self] = &[MissingTenant::Allow, MissingTenant::Deny];
    fn name(self) -> &'static str {
        match self {
            MissingTenant::Allow => "allow",
            MissingTenant::Deny => "deny",
        }
    }
}

/// Which rate-limit headers the filter adds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(
    feature = "cli",
    derive(serde::Serialize),
    serde(into = "&'static str")
)]
pub enum HeaderMode {
    /// `X-RateLimit-*` as Envoy's `DRAFT_VERSION_03`, plus `Retry-After` on 429.
    DraftVersion03,
    /// Only `Retry-After` on 429.
    Off,
    /// `RateLimit-Policy` and `RateLimit` of
    /// draft-ietf-httpapi-ratelimit-headers-10, plus `Retry-After` on 429.
    IetfDraft10,
}

impl Named for HeaderMode {
    const ALL: &'static [Self] = &[
        HeaderMode::DraftVersion03,
        HeaderMode::Off,
        HeaderMode::IetfDraft10,
    ];
    fn name(self) -> &'static str {
        match self {
            HeaderMode::DraftVersion03 => "draft_version_03",
            HeaderMode::Off => "off",
            HeaderMode::IetfDraft10 => "ietf_draft_10",
        }
    }
}

/// How a group's limits are enforced across the fleet (`local.mode`, and
/// per group `local.groups.<group>.mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(
    feature = "cli",
    derive(serde::Serialize),
    serde(into = "&'static str")
)]
pub enum Mode {
    /// One call to the rate-limit service per admitted request: exact.
    Exact,
    /// Tokens reserved from the service in batches and spent locally: never
    /// over the limit, may strand tokens (undershoot).
    Lease,
    /// Counted locally and pushed to the service every sync interval: may
    /// overshoot by what the fleet admits in one interval.
    Sync,
}

impl Named for Mode {
    const ALL: &'static [Self] = &[Mode::Exact, Mode::Lease, Mode::Sync];
    fn name(self) -> &'static str {
        match self {
            Mode::Exact => "exact",
            Mode::Lease => "lease",
            Mode::Sync => "sync",
        }
    }
}

impl Mode {
    /// The name in the configuration (`"exact"`, `"lease"`, `"sync"`).
    pub fn as_str(self) -> &'static str {
        self.name()
    }
}

/// What a request gets when the rate-limit service cannot decide: its call
/// failed, or the breaker is open (`on_failure`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(
    feature = "cli",
    derive(serde::Serialize),
    serde(into = "&'static str")
)]
pub enum OnFailure {
    /// Let it through, unlimited (fail open).
    Allow,
    /// Refuse it with `status_on_error` (`failure_mode_deny`).
    Deny,
    /// Each Envoy enforces the group's limits at its share of the fleet,
    /// alone (`fallback`).
    Local,
}

impl Named for OnFailure {
    const ALL: &'static [Self] = &[OnFailure::Allow, OnFailure::Deny, OnFailure::Local];
    fn name(self) -> &'static str {
        match self {
            OnFailure::Allow => "allow",
            OnFailure::Deny => "deny",
            OnFailure::Local => "local",
        }
    }
}

/// Which share of a limit an Envoy enforces alone (`fallback.share`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Share {
    /// `1 / fallback.envoys` for every tenant.
    Configured,
    /// Each busy tenant's share of the fleet's count that this Envoy sent,
    /// learned from the service's answers; the configured share until then.
    Learned,
}

impl Named for Share {
    const ALL: &'static [Self] = &[Share::Configured, Share::Learned];
    fn name(self) -> &'static str {
        match self {
            Share::Configured => "configured",
            Share::Learned => "learned",
        }
    }
}

impl OnFailure {
    /// The name in the configuration.
    pub fn as_str(self) -> &'static str {
        self.name()
    }
}

impl From<OnFailure> for &'static str {
    fn from(o: OnFailure) -> &'static str {
        o.name()
    }
}

impl From<Mode> for &'static str {
    fn from(m: Mode) -> &'static str {
        m.name()
    }
}

impl From<MissingTenant> for &'static str {
    fn from(m: MissingTenant) -> &'static str {
        m.name()
    }
}

impl From<HeaderMode> for &'static str {
    fn from(h: HeaderMode) -> &'static str {
        h.name()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn distinct<T: Named>() -> bool {
        let names: Vec<&str> = T::ALL.iter().map(|t| t.name()).collect();
        names
            .iter()
            .enumerate()
            .all(|(i, n)| !names.iter().skip(i + 1).any(|m| m == n))
    }

    #[test]
    fn every_option_has_distinct_names() {
        assert!(distinct::<MissingTenant>());
        assert!(distinct::<HeaderMode>());
        assert!(distinct::<Mode>());
        assert!(distinct::<OnFailure>());
        assert!(distinct::<Share>());
        assert_eq!(Mode::Sync.as_str(), "sync");
        assert_eq!(<&str>::from(HeaderMode::IetfDraft10), "ietf_draft_10");
    }
}

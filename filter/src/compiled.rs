//! The configuration compiled once per VM in `on_configure` (`Compiled`),
//! and what it knows of each group, by `GroupId`: the group itself, its
//! local-layer scope, its mode with its settings, its local fallback, how
//! many descriptors a call about one of its tenants sends.

use ratelimit_config::{Group, Mode, PluginConfig, TenantSource};

use crate::fallback;
use crate::group::GroupId;
use crate::lease::LeaseParams;
use crate::local::{Scope, ScopeBuilder};
use crate::proto::grpc_upstream;
use crate::sync::SyncParams;
use crate::tenant::Location;

/// The configuration compiled once per VM in `on_configure`.
pub struct Compiled {
    pub config: PluginConfig,
    /// What `dispatch_grpc_call` is given as its upstream.
    pub upstream: String,
    /// `config.max_tenant_length`, as a length.
    pub max_tenant_length: usize,
    /// Where the tenant is read (`tenant_source`).
    pub tenant_location: Location,
    /// The path of every value of `cost_header` (`request\0headers\0<name>`),
    /// when there is one: a cost header sent twice reads as one value
    /// holding a `,`, never a cost.
    pub cost_values: Option<String>,
    /// What is compiled of each group, by `GroupId`.
    groups: Vec<CompiledGroup>,
}

/// What is compiled of one group.
struct CompiledGroup {
    /// Its scope in the local layer.
    scope: Scope,
    /// Its mode and the mode's settings.
    mode: ModeParams,
    /// Its local fallback (`on_failure: "local"` only).
    fallback: Option<fallback::Params>,
}

/// A group's mode, with its settings (compiled once with the
/// configuration: `Compiled::mode_params`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModeParams {
    Exact,
    Lease(LeaseParams),
    Sync(SyncParams),
}

impl ModeParams {
    fn of(config: &PluginConfig, group: &Group) -> ModeParams {
        if let Some(p) = LeaseParams::for_group(config, group) {
            ModeParams::Lease(p)
        } else if let Some(p) = SyncParams::for_group(config, group) {
            ModeParams::Sync(p)
        } else {
            ModeParams::Exact
        }
    }

    pub fn mode(&self) -> Mode {
        match self {
            ModeParams::Exact => Mode::Exact,
            ModeParams::Lease(_) => Mode::Lease,
            ModeParams::Sync(_) => Mode::Sync,
        }
    }

    /// The lease settings, in lease mode.
    pub fn lease(self) -> Option<LeaseParams> {
        match self {
            ModeParams::Lease(p) => Some(p),
            _ => None,
        }
    }

    /// The sync settings, in sync mode.
    pub fn sync(self) -> Option<SyncParams> {
        match self {
            ModeParams::Sync(p) => Some(p),
            _ => None,
        }
    }
}

impl Compiled {
    pub fn new(config: PluginConfig) -> Compiled {
        let upstream = grpc_upstream(&config.cluster);
        let max_tenant_length = usize::try_from(config.max_tenant_length).unwrap_or(usize::MAX);
        let tenant_location = Location::new(&config.tenant_source, &config.limits);
        let cost_values = (config.cost.as_ref()).map(|c| format!("request\0headers\0{}", c.header));
        let groups = config
            .limits
            .all_groups()
            .map(|g| CompiledGroup {
                scope: group_scope(&config, g),
                mode: ModeParams::of(&config, g),
                fallback: fallback::Params::for_group(&config, g),
            })
            .collect();
        Compiled {
            config,
            upstream,
            max_tenant_length,
            tenant_location,
            cost_values,
            groups,
        }
    }

    /// The group `id` names (None for an id no group has).
    pub fn group(&self, id: GroupId) -> Option<&Group> {
        let limits = &self.config.limits;
        match (&limits.default, id.index()) {
            (Some(default), 0) => Some(default),
            (Some(_), i) => limits.groups.get(i - 1),
            (None, i) => limits.groups.get(i),
        }
    }

    /// The group's name (None for an id no group has).
    pub fn group_name(&self, id: GroupId) -> Option<&str> {
        self.group(id).map(|g| g.name.as_str())
    }

    /// The mode of group `id`, with its settings (exact for an id no group
    /// has).
    pub fn mode_params(&self, id: GroupId) -> ModeParams {
        self.groups
            .get(id.index())
            .map_or(ModeParams::Exact, |g| g.mode)
    }

    /// Every group's mode, with its settings.
    pub fn group_modes(&self) -> impl Iterator<Item = ModeParams> + '_ {
        self.groups.iter().map(|g| g.mode)
    }

    /// The local fallback of group `id` (None unless `on_failure` is
    /// `local`, or for an id no group has).
    pub fn fallback(&self, id: GroupId) -> Option<&fallback::Params> {
        self.groups.get(id.index())?.fallback.as_ref()
    }

    /// The local-layer scope of group `id` (`local::placement::Scope`).
    pub fn scope(&self, id: GroupId) -> Scope {
        self.groups.get(id.index()).map_or(Scope::NONE, |g| g.scope)
    }

    /// How many descriptors a call about a tenant of group `id` (on
    /// `route`) sends: one per unit the group limits (its own statuses in
    /// the answer, first), then one per unit the route limits. 0 if the
    /// configuration has no such group; the group's own if it has no such
    /// route.
    pub fn descriptor_count(&self, id: GroupId, route: Option<&str>) -> usize {
        let Some(g) = self.group(id) else {
            return 0;
        };
        let on_route = route
            .and_then(|name| g.route(name.as_bytes()))
            .map_or(0, |r| r.limits.len());
        g.limits.len() + on_route
    }
}

/// What a group's tenants' local state belongs to: the instance (the
/// service's cluster, the domain, the descriptor key, where the tenant is
/// read) and the group (its name, limits and local bucket: an instance with
/// a tighter bucket never drains another's). The mode is left out: a live
/// change of mode keeps the tenant's slot, and `modes` settles what the old
/// mode's block held.
fn group_scope(c: &PluginConfig, g: &Group) -> Scope {
    let mut b = ScopeBuilder::new()
        .part(c.cluster.as_bytes())
        .part(c.domain.as_bytes())
        .part(c.descriptor_key.as_bytes());
    b = match &c.tenant_source {
        TenantSource::Header => b.part(b"header").part(c.limits.header.as_bytes()),
        TenantSource::Property(path) => path
            .iter()
            .fold(b.part(b"property"), |b, p| b.part(p.as_bytes())),
    };
    b = b.part(b"group").part(g.name.as_bytes());
    for (unit, n) in g.limits.iter() {
        b = b
            .part(unit.descriptor_value().as_bytes())
            .part(&n.to_le_bytes());
    }
    if let Some(p) = c.local.bucket_for(g) {
        b = b
            .part(b"bucket")
            .part(&p.tokens_per_second.to_le_bytes())
            .part(&p.burst.to_le_bytes());
    }
    b.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::compiled_json;
    use serde_json::{json, Value};
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    const DEFAULT: GroupId = GroupId::new(0);
    const GOLD: GroupId = GroupId::new(1);

    /// An instance's configuration: its domain, cluster, descriptor key,
    /// tenant header and default hourly limit, plus `extra` keys.
    fn instance(
        domain: &str,
        cluster: &str,
        key: &str,
        header: &str,
        limit: u32,
        extra: Value,
    ) -> Compiled {
        let base = json!({"domain": domain, "rate_limit_service": {"cluster": cluster},
            "descriptor_key": key,
            "limits": {header: {"default": {"persecond": 5, "perhour": limit},
                "gold": {"perminute": 70, "header_value": ["tenant-b"]}}}});
        compiled_json(base, extra)
    }

    fn base(extra: Value) -> Compiled {
        instance(
            "internal-api",
            "ratelimit",
            "tenant",
            "x-tenant-id",
            30,
            extra,
        )
    }

    #[test]
    fn each_group_of_each_instance_has_a_scope_of_its_own() {
        let base_scope = base(json!({}));
        let (default, gold) = (base_scope.scope(DEFAULT), base_scope.scope(GOLD));
        assert_ne!(default, gold);
        // The same configuration: the same scopes (instances share).
        assert_eq!(base(json!({})).scope(DEFAULT), default);
        // A mode is not part of it: a live mode change keeps the slots.
        let lease = base(json!({"local": {"mode": "lease"}}));
        assert_eq!(lease.scope(DEFAULT), default);
        let apart = |c: Compiled| assert_ne!(c.scope(DEFAULT), default, "{:?}", c.config);
        // Each part of the instance on its own: another instance.
        for (domain, cluster, key, header, limit) in [
            ("other", "ratelimit", "tenant", "x-tenant-id", 30),
            ("internal-api", "other", "tenant", "x-tenant-id", 30),
            ("internal-api", "ratelimit", "org", "x-tenant-id", 30),
            ("internal-api", "ratelimit", "tenant", "x-org-id", 30),
            ("internal-api", "ratelimit", "tenant", "x-tenant-id", 31),
        ] {
            apart(instance(domain, cluster, key, header, limit, json!({})));
        }
        apart(base(
            json!({"tenant_source": {"property": ["metadata", "x"]}}),
        ));
        apart(base(
            json!({"local": {"groups": {"default": {"tokens_per_second": 1, "burst": 1}}}}),
        ));
    }

    #[test]
    fn a_group_is_found_by_its_id_and_counts_its_descriptors() {
        let c = base(json!({}));
        assert_eq!(c.group_name(DEFAULT), Some("default"));
        assert_eq!(c.group_name(GOLD), Some("gold"));
        assert_eq!(c.group(GroupId::new(2)), None);
        assert_eq!(c.descriptor_count(DEFAULT, None), 2);
        assert_eq!(c.descriptor_count(GOLD, Some("no-such-route")), 1);
        assert_eq!(c.descriptor_count(GroupId::new(2), None), 0);
        assert_eq!(c.mode_params(GroupId::new(2)), ModeParams::Exact);
        // Without a default group, the named ones come first.
        let named = compiled_json(
            json!({"domain": "d", "rate_limit_service": {"cluster": "c"},
                "limits": {"x-tenant-id": {"gold": {"perminute": 70, "header_value": ["tenant-b"]}}}}),
            json!({}),
        );
        assert_eq!(named.group_name(DEFAULT), Some("gold"));
        assert_eq!(named.group(GOLD), None);
    }
}

//! The team limits model: one header, a default group and named groups of tenants.

use std::borrow::Cow;
use std::collections::HashMap;

/// A window a group can be limited over. Windows align to the clock:
/// the fixed ones (the named units and [`Unit::Custom`] lengths) to the
/// Unix epoch, the calendar ones (`Week`, `Month`, `Year`) to UTC calendar
/// boundaries (see [`crate::window`]).
///
/// `Custom` holds a length in seconds that no named unit has (a length of
/// a second, a minute, an hour or a day is that unit: [`Unit::of_seconds`]):
/// `per5minutes` is `Custom(300)`. Only the counter counts these.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unit {
    Second,
    Minute,
    Hour,
    Day,
    Week,
    Month,
    Year,
    /// A fixed window of this many seconds, from multiples of it since the
    /// epoch (`per<N><unit>` in the team file).
    Custom(u32),
}

/// The named units' keys in the team file, in [`Unit::ALL`]'s order.
const JSON_KEYS: [&str; 7] = [
    "persecond",
    "perminute",
    "perhour",
    "perday",
    "perweek",
    "permonth",
    "peryear",
];
/// Their descriptor values, in the same order.
const DESCRIPTOR_VALUES: [&str; 7] = [
    "per_second",
    "per_minute",
    "per_hour",
    "per_day",
    "per_week",
    "per_month",
    "per_year",
];

/// The longest custom window: 3,660 days (ten years and more).
pub const MAX_CUSTOM_SECONDS: u32 = 3_660 * 86_400;

/// The units a custom window can be written in, longest first: a custom
/// window is spelled in the longest that divides it.
const CUSTOM_UNITS: [(&str, u32); 4] = [
    ("day", 86_400),
    ("hour", 3_600),
    ("minute", 60),
    ("second", 1),
];

/// Shortest first: by length, then a named unit before a custom window of
/// its length (a calendar week before a custom 7 days).
impl Ord for Unit {
    fn cmp(&self, other: &Unit) -> std::cmp::Ordering {
        (self.seconds(), self.rank()).cmp(&(other.seconds(), other.rank()))
    }
}

impl PartialOrd for Unit {
    fn partial_cmp(&self, other: &Unit) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Unit {
    /// The named units.
    pub const ALL: [Unit; 7] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
        Unit::Year,
    ];

    /// The fixed window of `seconds`: the named unit of that length, else
    /// a custom one; None for 0 or over [`MAX_CUSTOM_SECONDS`].
    pub fn of_seconds(seconds: u64) -> Option<Unit> {
        Some(match seconds {
            0 => return None,
            1 => Unit::Second,
            60 => Unit::Minute,
            3_600 => Unit::Hour,
            86_400 => Unit::Day,
            s if s <= u64::from(MAX_CUSTOM_SECONDS) => Unit::Custom(u32::try_from(s).ok()?),
            _ => return None,
        })
    }

    fn rank(self) -> u8 {
        match self {
            Unit::Custom(_) => 1,
            _ => 0,
        }
    }

    /// A custom window's count and unit in the longest unit dividing it
    /// (`(5, "minute")` for 300 s).
    fn custom_parts(seconds: u32) -> (u32, &'static str) {
        let (name, len) = CUSTOM_UNITS
            .into_iter()
            .find(|(_, len)| seconds % len == 0)
            .unwrap_or(("second", 1));
        (seconds / len.max(1), name)
    }

    /// A custom window's spelling: `<prefix><N><sep><unit>s` in the
    /// longest unit dividing it. One copy of the code for its three uses.
    #[inline(never)]
    fn custom_spelling(seconds: u32, prefix: &str, sep: &str) -> Cow<'static, str> {
        let (n, name) = Unit::custom_parts(seconds);
        Cow::Owned(format!("{prefix}{n}{sep}{name}s"))
    }

    /// The named unit's index in [`Unit::ALL`] (None for a custom window).
    fn named(self) -> Option<usize> {
        Some(match self {
            Unit::Second => 0,
            Unit::Minute => 1,
            Unit::Hour => 2,
            Unit::Day => 3,
            Unit::Week => 4,
            Unit::Month => 5,
            Unit::Year => 6,
            Unit::Custom(_) => return None,
        })
    }

    /// The key a team writes in its JSON (`persecond`, …; `per5minutes`).
    pub fn json_key(self) -> Cow<'static, str> {
        match (self, self.named()) {
            (Unit::Custom(s), _) => Unit::custom_spelling(s, "per", ""),
            (_, i) => Cow::Borrowed(
                i.and_then(|i| JSON_KEYS.get(i))
                    .copied()
                    .unwrap_or_default(),
            ),
        }
    }

    /// The value of the `generic_key` entry that tags a descriptor with
    /// its unit: `per_<unit>`, for a custom window `per_<N>_<unit>s` in
    /// the longest unit dividing it (`per_5_minutes`, `per_90_seconds`):
    /// one spelling per length, which the counter reads back.
    pub fn descriptor_value(self) -> Cow<'static, str> {
        match (self, self.named()) {
            (Unit::Custom(s), _) => Unit::custom_spelling(s, "per_", "_"),
            (_, i) => Cow::Borrowed(
                i.and_then(|i| DESCRIPTOR_VALUES.get(i))
                    .copied()
                    .unwrap_or_default(),
            ),
        }
    }

    /// The unit's name in the envoyproxy/ratelimit YAML (which never
    /// receives a calendar unit nor a custom window: its weeks, months and
    /// years are not the calendar's, and its protocol has no other length).
    pub fn service_unit(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
            Unit::Custom(_) => "custom",
        }
    }

    /// The window in words, as messages say "per <noun>": `minute`,
    /// `month`; `5 minutes` for a custom window.
    pub fn noun(self) -> Cow<'static, str> {
        match self {
            Unit::Custom(s) => Unit::custom_spelling(s, "", " "),
            named => Cow::Borrowed(named.service_unit()),
        }
    }

    /// The window's length; for a calendar unit, the longest it can be
    /// (a month of 31 days, a leap year).
    pub fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 604_800,
            Unit::Month => 31 * 86_400,
            Unit::Year => 366 * 86_400,
            Unit::Custom(s) => u64::from(s),
        }
    }

    /// A week, month or year on UTC calendar boundaries: only the counter
    /// counts these, and a sliding group leaves them calendar windows.
    pub fn is_calendar(self) -> bool {
        matches!(self, Unit::Week | Unit::Month | Unit::Year)
    }

    /// A window of a length no named unit has: only the counter counts it.
    pub fn is_custom(self) -> bool {
        matches!(self, Unit::Custom(_))
    }

    /// A team file key: a named unit's (`perminute`), or `per<N><unit>`
    /// with N a positive integer without leading zeros and the unit
    /// `second`, `minute`, `hour` or `day`, singular or plural.
    pub fn from_json_key(key: &str) -> Option<Unit> {
        if let Some(i) = JSON_KEYS.iter().position(|k| *k == key) {
            return Unit::ALL.get(i).copied();
        }
        let rest = key.strip_prefix("per")?;
        Unit::parse_length(rest, "")
    }

    /// `<N><sep><unit>[s]`: the custom spelling, in a key or a descriptor.
    fn parse_length(text: &str, sep: &str) -> Option<Unit> {
        let digits = text.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 || digits > 10 || text.as_bytes().first() == Some(&b'0') {
            return None;
        }
        // At most 10 digits: no overflow in a u64.
        let n = text
            .bytes()
            .take(digits)
            .fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
        let name = text.get(digits..)?.strip_prefix(sep)?;
        let singular = name.strip_suffix('s').unwrap_or(name);
        // The units a custom window is written in (one table for both ways).
        let (_, len) = CUSTOM_UNITS.into_iter().find(|(n, _)| *n == singular)?;
        let len = u64::from(len);
        Unit::of_seconds(n * len)
    }

    pub fn from_descriptor_value(value: &str) -> Option<Unit> {
        if let Some(i) = DESCRIPTOR_VALUES.iter().position(|v| *v == value) {
            return Unit::ALL.get(i).copied();
        }
        let u = Unit::parse_length(value.strip_prefix("per_")?, "_")?;
        // One spelling per window: the one `descriptor_value` writes.
        (u.descriptor_value() == value).then_some(u)
    }
}

/// How a group's windows count (`"window"` in the team file).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Window {
    /// Clock-aligned windows, each counted on its own (the default).
    #[default]
    Fixed,
    /// The current window's count plus the previous one's, weighted by how
    /// much of it the sliding window still covers: only the counter counts
    /// these.
    Sliding,
}

impl Window {
    pub fn json_value(self) -> &'static str {
        match self {
            Window::Fixed => "fixed",
            Window::Sliding => "sliding",
        }
    }
}

/// Which rate-limit service counts (`rate_limit_service.service` in the
/// plugin configuration, `--service` on the command line).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Service {
    /// envoyproxy/ratelimit: fixed windows of seconds to days.
    #[default]
    EnvoyRatelimit,
    /// `ratelimit-counter`: also sliding windows and calendar units.
    Counter,
}

impl Service {
    pub fn name(self) -> &'static str {
        match self {
            Service::EnvoyRatelimit => "envoy-ratelimit",
            Service::Counter => "counter",
        }
    }

    pub fn from_name(name: &str) -> Option<Service> {
        Service::ALL.into_iter().find(|s| s.name() == name)
    }

    const ALL: [Service; 2] = [Service::EnvoyRatelimit, Service::Counter];
}

/// `--service` takes a service by its [`Service::name`]. Written by hand,
/// not derived, so that `--help` lists the names without the variants'
/// docs; the filter (built without the `cli` feature) never links clap.
#[cfg(feature = "cli")]
impl clap::ValueEnum for Service {
    fn value_variants<'a>() -> &'a [Self] {
        &Service::ALL
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(clap::builder::PossibleValue::new(self.name()))
    }
}

/// The limits of one group, per unit, shortest first; a unit left out is
/// "not limited over that unit". Each limit keeps its unit's descriptor
/// value, which the descriptors borrow.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UnitLimits {
    limits: Vec<(Unit, u32, Cow<'static, str>)>,
}

impl UnitLimits {
    #[inline(never)]
    pub fn get(&self, unit: Unit) -> Option<u32> {
        self.limits
            .iter()
            .find(|(u, _, _)| *u == unit)
            .map(|(_, l, _)| *l)
    }

    #[inline(never)]
    pub fn set(&mut self, unit: Unit, limit: u32) {
        if let Some(slot) = self.limits.iter_mut().find(|(u, _, _)| *u == unit) {
            slot.1 = limit;
            return;
        }
        // Kept shortest first: the new one moves down past the longer.
        self.limits.push((unit, limit, unit.descriptor_value()));
        let mut at = self.limits.len() - 1;
        while at > 0 && self.limits.get(at - 1).is_some_and(|(u, _, _)| *u > unit) {
            self.limits.swap(at - 1, at);
            at -= 1;
        }
    }

    /// The units that are limited, shortest first, with their limits.
    pub fn iter(&self) -> impl Iterator<Item = (Unit, u32)> + Clone + '_ {
        self.limits.iter().map(|(u, l, _)| (*u, *l))
    }

    /// Like `iter`, with each unit's descriptor value.
    pub fn with_values(&self) -> impl Iterator<Item = (Unit, u32, &str)> + '_ {
        self.limits.iter().map(|(u, l, v)| (*u, *l, v.as_ref()))
    }

    pub fn is_empty(&self) -> bool {
        self.limits.is_empty()
    }

    /// How many units are limited (the descriptors they give).
    pub fn len(&self) -> usize {
        self.limits.len()
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    pub name: String,
    pub limits: UnitLimits,
    /// Tenant values listed in `header_value`; empty for the default group.
    pub tenants: Vec<String>,
    /// `"shadow": true`: the group's refusals are counted, never enforced
    /// (the filter lets them through; the service still answers OVER_LIMIT).
    pub shadow: bool,
    /// `"window"`: fixed (the default) or sliding; the group's routes count
    /// the same way.
    pub window: Window,
    /// `routes`: limits of each of the group's tenants on an Envoy route, on
    /// top of the group's own (file order; empty when the group sets none).
    pub routes: Vec<Route>,
    /// `"regions": "global"`: the group's limits (its routes' too) hold
    /// across regions; each region's counter admits against its
    /// allocation (`ratelimit-counter --region`). Counter only.
    pub global: bool,
}

impl Group {
    /// Whether the counter slides this group's window of `unit`: a sliding
    /// group slides its windows of a fixed length (named or custom); its
    /// weeks, months and years stay on the calendar (a month resets on the
    /// 1st).
    pub fn slides(&self, unit: Unit) -> bool {
        self.window == Window::Sliding && !unit.is_calendar()
    }

    /// The group's limits on the route named `name` (Envoy's
    /// `xds.route_name`), if it sets any.
    pub fn route(&self, name: &[u8]) -> Option<&Route> {
        self.routes.iter().find(|r| r.name.as_bytes() == name)
    }
}

/// A route's limits, per tenant: a request the route matched counts in
/// these as well as in the group's own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    /// The name of the Envoy route (`name` in its route configuration).
    pub name: String,
    pub limits: UnitLimits,
}

/// The key of the route's entry in a route's descriptors.
pub const ROUTE_DESCRIPTOR_KEY: &str = "route";

pub const DEFAULT_GROUP: &str = "default";

/// A validated team limits file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TeamLimits {
    /// The request header that carries the tenant, lowercase.
    pub header: String,
    /// Applies to every tenant not listed in a named group; absent means
    /// such tenants are not limited.
    pub default: Option<Group>,
    /// Named groups, in file order.
    pub groups: Vec<Group>,
    by_tenant: HashMap<String, usize>,
}

impl TeamLimits {
    pub fn new(header: String, default: Option<Group>, groups: Vec<Group>) -> TeamLimits {
        let mut by_tenant = HashMap::new();
        for (i, g) in groups.iter().enumerate() {
            for t in &g.tenants {
                by_tenant.entry(t.clone()).or_insert(i);
            }
        }
        TeamLimits {
            header,
            default,
            groups,
            by_tenant,
        }
    }

    /// The group whose limits apply to `tenant`, if any.
    pub fn group_for(&self, tenant: &str) -> Option<&Group> {
        match self.by_tenant.get(tenant) {
            Some(&i) => self.groups.get(i),
            None => self.default.as_ref(),
        }
    }

    /// Every unit that some group limits, itself or on a route, shortest
    /// first.
    pub fn units_in_use(&self) -> Vec<Unit> {
        let mut units: Vec<Unit> = self
            .all_groups()
            .flat_map(|g| {
                g.limits
                    .iter()
                    .chain(g.routes.iter().flat_map(|r| r.limits.iter()))
            })
            .map(|(u, _)| u)
            .collect();
        units.sort_unstable();
        units.dedup();
        units
    }

    /// The default group first (when there is one), then the named groups.
    /// A group's position here is its index (`group_index_for`): the
    /// filter's per-group counters are kept by it.
    pub fn all_groups(&self) -> impl Iterator<Item = &Group> {
        self.default.iter().chain(self.groups.iter())
    }

    /// Like `group_for`, with the group's index in `all_groups()`.
    pub fn group_index_for(&self, tenant: &str) -> Option<(usize, &Group)> {
        let offset = usize::from(self.default.is_some());
        match self.by_tenant.get(tenant) {
            Some(&i) => self.groups.get(i).map(|g| (i + offset, g)),
            None => self.default.as_ref().map(|g| (0, g)),
        }
    }

    /// How many groups there are, `default` included.
    pub fn group_count(&self) -> usize {
        self.groups.len() + usize::from(self.default.is_some())
    }
}

/// The descriptor entries the filter sends for `tenant` under `group`, one
/// descriptor per limited unit: `[("generic_key", "per_<unit>"), (key, tenant)]`.
pub fn descriptors<'a>(
    group: &'a Group,
    descriptor_key: &'a str,
    tenant: &'a str,
) -> impl Iterator<Item = (Unit, [(&'a str, &'a str); 2])> + 'a {
    group
        .limits
        .with_values()
        .map(move |(unit, _, value)| (unit, [("generic_key", value), (descriptor_key, tenant)]))
}

/// One descriptor's entries: the unit's and the tenant's, and on a route
/// the route's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Entries<'a> {
    entries: [(&'a str, &'a str); 3],
    len: usize,
}

impl<'a> AsRef<[(&'a str, &'a str)]> for Entries<'a> {
    fn as_ref(&self) -> &[(&'a str, &'a str)] {
        self.entries.get(..self.len).unwrap_or_default()
    }
}

/// The most descriptors a request sends: one per unit of its group, and
/// one per unit of its route.
pub const MAX_DESCRIPTORS: usize = 2 * MAX_UNITS_PER_GROUP;

/// The most windows one group (or one route of it) limits: the filter
/// keeps this many per group. `validate` refuses a group of more.
pub const MAX_UNITS_PER_GROUP: usize = 6;

/// The descriptors of one request of `tenant` under `group`, in the order
/// they are sent and answered: the group's (`descriptors`), then, on a
/// route the group limits, one per unit of the route:
/// `[("generic_key", "per_<unit>"), (key, tenant), ("route", <name>)]`.
/// The service answers one status per descriptor, in this order: the
/// first `group.limits.len()` are the tenant's, the rest the route's.
#[derive(Clone, Copy, Debug)]
pub struct RequestDescriptors<'a> {
    all: [(Unit, Entries<'a>); MAX_DESCRIPTORS],
    len: usize,
}

impl<'a> RequestDescriptors<'a> {
    pub fn new(
        group: &'a Group,
        route: Option<&'a Route>,
        descriptor_key: &'a str,
        tenant: &'a str,
    ) -> RequestDescriptors<'a> {
        let mut d = RequestDescriptors {
            all: [(Unit::Second, Entries::default()); MAX_DESCRIPTORS],
            len: 0,
        };
        let own = Some((&group.limits, ("", "")));
        let on_route = route.map(|r| (&r.limits, (ROUTE_DESCRIPTOR_KEY, r.name.as_str())));
        for (limits, third) in own.into_iter().chain(on_route) {
            for (unit, _, value) in limits.with_values() {
                let Some(slot) = d.all.get_mut(d.len) else {
                    continue;
                };
                let entries = [("generic_key", value), (descriptor_key, tenant), third];
                let len = if third.0.is_empty() { 2 } else { 3 };
                *slot = (unit, Entries { entries, len });
                d.len += 1;
            }
        }
        d
    }

    /// Each descriptor's unit and entries.
    pub fn as_slice(&self) -> &[(Unit, Entries<'a>)] {
        self.all.get(..self.len).unwrap_or_default()
    }
}

/// The tenant value the filter sends for a raw value (a header's bytes, or
/// a property's): the raw value with each byte that is not part of valid
/// UTF-8, and each `%`, written as `%XX` (uppercase hex). Injective, so two
/// distinct raw values never share a counter, and always valid UTF-8, as a
/// protobuf string must be. Borrowed when there is nothing to write (valid
/// UTF-8 without `%`: nearly every tenant); at most three times as long.
pub fn tenant_value(raw: &[u8]) -> Cow<'_, str> {
    if !raw.contains(&b'%') {
        if let Ok(s) = std::str::from_utf8(raw) {
            return Cow::Borrowed(s);
        }
    }
    let mut out = String::with_capacity(raw.len() + 8);
    for chunk in raw.utf8_chunks() {
        let mut valid = chunk.valid();
        while let Some(at) = valid.bytes().position(|b| b == b'%') {
            out.push_str(valid.get(..at).unwrap_or_default());
            push_escaped(&mut out, b'%');
            valid = valid.get(at + 1..).unwrap_or_default();
        }
        out.push_str(valid);
        for &b in chunk.invalid() {
            push_escaped(&mut out, b);
        }
    }
    Cow::Owned(out)
}

/// `%XX`, uppercase.
fn push_escaped(out: &mut String, b: u8) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let hex = |n: u8| char::from(HEX.get(usize::from(n)).copied().unwrap_or(b'0'));
    out.push('%');
    out.push(hex(b >> 4));
    out.push(hex(b & 15));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(name: &str, s: Option<u32>, h: Option<u32>, tenants: &[&str]) -> Group {
        let mut limits = UnitLimits::default();
        if let Some(s) = s {
            limits.set(Unit::Second, s);
        }
        if let Some(h) = h {
            limits.set(Unit::Hour, h);
        }
        Group {
            name: name.into(),
            limits,
            tenants: tenants.iter().map(|t| t.to_string()).collect(),
            shadow: false,
            window: Window::Fixed,
            routes: Vec::new(),
            global: false,
        }
    }

    #[test]
    fn listed_tenant_gets_its_group_and_others_the_default() {
        let t = TeamLimits::new(
            "x-tenant-id".into(),
            Some(group("default", Some(5), Some(30), &[])),
            vec![group("gold", Some(50), None, &["tenant-b"])],
        );
        assert_eq!(t.group_for("tenant-b").unwrap().name, "gold");
        assert_eq!(t.group_for("tenant-a").unwrap().name, "default");
        assert_eq!(t.group_index_for("tenant-b").map(|(i, _)| i), Some(1));
        assert_eq!(t.group_index_for("tenant-a").map(|(i, _)| i), Some(0));
        assert_eq!(t.group_count(), 2);
        assert_eq!(t.units_in_use(), vec![Unit::Second, Unit::Hour]);
    }

    #[test]
    fn without_default_unlisted_tenants_have_no_group() {
        let t = TeamLimits::new(
            "x-tenant-id".into(),
            None,
            vec![group("gold", Some(50), None, &["tenant-b"])],
        );
        assert!(t.group_for("tenant-a").is_none());
        assert_eq!(t.group_index_for("tenant-b").map(|(i, _)| i), Some(0));
        assert_eq!(t.group_count(), 1);
    }

    #[test]
    fn tenant_values_escape_what_is_not_utf8_and_the_escape_itself() {
        assert!(matches!(
            tenant_value(b"tenant-a"),
            Cow::Borrowed("tenant-a")
        ));
        assert_eq!(tenant_value("caf\u{e9}".as_bytes()), "caf\u{e9}");
        assert_eq!(tenant_value(b"vic\xfftim"), "vic%FFtim");
        assert_eq!(tenant_value(b"vic\xfetim"), "vic%FEtim");
        assert_eq!(tenant_value("vic\u{FFFD}tim".as_bytes()), "vic\u{FFFD}tim");
        assert_eq!(tenant_value(b"vic%FFtim"), "vic%25FFtim");
        assert_eq!(tenant_value(b"50%"), "50%25");
        assert_eq!(tenant_value(b"%\xc3"), "%25%C3");
        assert_eq!(tenant_value(b""), "");
    }

    /// What the escape means: `%XX` back to its byte gives the raw value.
    fn unescape(s: &str) -> Vec<u8> {
        let b = s.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'%' {
                out.push(u8::from_str_radix(&s[i + 1..i + 3], 16).unwrap());
                i += 3;
            } else {
                out.push(b[i]);
                i += 1;
            }
        }
        out
    }

    proptest::proptest! {
        #[test]
        fn every_raw_value_is_its_own_tenant(raw in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40)) {
            let v = tenant_value(&raw);
            // Decodes back to the raw bytes: no two raw values give one.
            proptest::prop_assert_eq!(unescape(&v), raw.clone());
            proptest::prop_assert!(v.len() <= 3 * raw.len());
        }
    }

    #[test]
    fn one_descriptor_per_limited_unit() {
        let g = group("default", Some(5), Some(30), &[]);
        let d: Vec<_> = descriptors(&g, "tenant", "acme").collect();
        assert_eq!(
            d,
            vec![
                (
                    Unit::Second,
                    [("generic_key", "per_second"), ("tenant", "acme")]
                ),
                (
                    Unit::Hour,
                    [("generic_key", "per_hour"), ("tenant", "acme")]
                ),
            ]
        );
    }

    #[test]
    fn a_request_on_a_route_sends_the_groups_descriptors_then_the_routes() {
        let mut g = group("default", Some(5), Some(30), &[]);
        let mut limits = UnitLimits::default();
        limits.set(Unit::Minute, 2);
        g.routes.push(Route {
            name: "reports".into(),
            limits,
        });
        let route = g.route(b"reports");
        assert!(route.is_some() && g.route(b"report").is_none());
        let d = RequestDescriptors::new(&g, route, "tenant", "acme");
        let got: Vec<(Unit, Vec<(&str, &str)>)> = d
            .as_slice()
            .iter()
            .map(|(u, e)| (*u, e.as_ref().to_vec()))
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    Unit::Second,
                    vec![("generic_key", "per_second"), ("tenant", "acme")]
                ),
                (
                    Unit::Hour,
                    vec![("generic_key", "per_hour"), ("tenant", "acme")]
                ),
                (
                    Unit::Minute,
                    vec![
                        ("generic_key", "per_minute"),
                        ("tenant", "acme"),
                        ("route", "reports")
                    ]
                ),
            ]
        );
        // Off the route: the group's only, as `descriptors` gives them.
        let d = RequestDescriptors::new(&g, None, "tenant", "acme");
        let own: Vec<_> = descriptors(&g, "tenant", "acme")
            .map(|(_, e)| e.to_vec())
            .collect();
        let got: Vec<_> = d
            .as_slice()
            .iter()
            .map(|(_, e)| e.as_ref().to_vec())
            .collect();
        assert_eq!(got, own);
        assert_eq!(g.limits.len(), 2);
    }

    #[test]
    fn custom_windows_parse_from_their_keys() {
        assert_eq!(Unit::from_json_key("per5minutes"), Some(Unit::Custom(300)));
        assert_eq!(Unit::from_json_key("per5minute"), Some(Unit::Custom(300)));
        assert_eq!(Unit::from_json_key("per30seconds"), Some(Unit::Custom(30)));
        assert_eq!(
            Unit::from_json_key("per12hours"),
            Some(Unit::Custom(43_200))
        );
        assert_eq!(
            Unit::from_json_key("per90days"),
            Some(Unit::Custom(7_776_000))
        );
        // A named unit's length is that unit.
        assert_eq!(Unit::from_json_key("per60seconds"), Some(Unit::Minute));
        assert_eq!(Unit::from_json_key("per1day"), Some(Unit::Day));
        assert_eq!(Unit::from_json_key("per24hours"), Some(Unit::Day));
        assert_eq!(Unit::from_json_key("per7days"), Some(Unit::Custom(604_800)));
        for bad in [
            "per0minutes",
            "per05minutes",
            "perminutes",
            "per5",
            "per5weeks",
            "per5 minutes",
            "per-5minutes",
            "per5minutess",
            "per99999999999days",
            "per3661days",
            "Per5minutes",
        ] {
            assert_eq!(Unit::from_json_key(bad), None, "{bad}");
        }
        assert_eq!(
            Unit::from_json_key("per3660days"),
            Some(Unit::Custom(MAX_CUSTOM_SECONDS))
        );
    }

    #[test]
    fn a_custom_window_has_one_spelling_read_back_by_the_counter() {
        for (unit, key, value) in [
            (Unit::Custom(300), "per5minutes", "per_5_minutes"),
            (Unit::Custom(90), "per90seconds", "per_90_seconds"),
            (Unit::Custom(7_776_000), "per90days", "per_90_days"),
            (Unit::Custom(43_200), "per12hours", "per_12_hours"),
        ] {
            assert_eq!(unit.json_key(), key);
            assert_eq!(unit.descriptor_value(), value);
            assert_eq!(Unit::from_descriptor_value(value), Some(unit));
            assert!(unit.is_custom() && !unit.is_calendar());
        }
        // Another spelling of the same window is not read: one key per window.
        assert_eq!(Unit::from_descriptor_value("per_300_seconds"), None);
        assert_eq!(Unit::from_descriptor_value("per_60_seconds"), None);
        assert_eq!(
            Unit::from_descriptor_value("per_minute"),
            Some(Unit::Minute)
        );
        for u in Unit::ALL {
            assert_eq!(Unit::from_descriptor_value(&u.descriptor_value()), Some(u));
            assert_eq!(Unit::from_json_key(&u.json_key()), Some(u));
        }
    }

    #[test]
    fn windows_sort_by_length_and_limits_keep_that_order() {
        let mut limits = UnitLimits::default();
        limits.set(Unit::Month, 5);
        limits.set(Unit::Custom(31 * 86_400), 4);
        limits.set(Unit::Custom(300), 2);
        limits.set(Unit::Second, 1);
        limits.set(Unit::Minute, 3);
        let order: Vec<Unit> = limits.iter().map(|(u, _)| u).collect();
        assert_eq!(
            order,
            vec![
                Unit::Second,
                Unit::Minute,
                Unit::Custom(300),
                Unit::Month,
                Unit::Custom(31 * 86_400)
            ]
        );
        let values: Vec<&str> = limits.with_values().map(|(_, _, v)| v).collect();
        assert_eq!(
            values,
            [
                "per_second",
                "per_minute",
                "per_5_minutes",
                "per_month",
                "per_31_days"
            ]
        );
        assert_eq!(limits.get(Unit::Custom(300)), Some(2));
        assert_eq!(limits.get(Unit::Custom(301)), None);
    }
}

//! `ratelimit-counter rebalance`: every period, for each global tenant
//! limit the regions' counters registered ([`super::REGISTRY`]), reads
//! each reachable region's allocation, what it admitted in the current
//! window and its demand, and moves the allocations toward the shares of
//! the demand ([`super::plan`]): the lowerings first, each applied by a
//! script in the region's Redis (never below the count it finds there),
//! then, once every lowering is confirmed, the raises within what they
//! freed. It keeps nothing of its own: what it needs from one period to
//! the next (the demand it last saw) is written in each region's Redis.
//! Run one rebalancer per set of regions.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use ratelimit_config::window::window_at;

use super::plan::{self, DemandSeen, Seen};
use super::{floor_of, parse, Parsed, REGISTRY};

/// A lowering, atomically with the region's counts. KEYS[1]: the regions
/// hash; KEYS[2..]: the counters of the windows around now. ARGV: the
/// target, the floor, the limit. Returns the allocation written.
const LOWER: &str = r"
local held = tonumber(redis.call('HGET', KEYS[1], 'alloc'))
if not held then held = tonumber(ARGV[2]) end
local limit = tonumber(ARGV[3])
if held > limit then held = limit end
local used = 0
for i = 2, #KEYS do
  local n = tonumber(redis.call('GET', KEYS[i]))
  if n and n > used then used = n end
end
local target = tonumber(ARGV[1])
local new = math.min(held, math.max(target, used))
redis.call('HSET', KEYS[1], 'alloc', new)
return new
";

/// One region: its name and Redis.
pub struct Region {
    pub name: String,
    pub url: String,
}

pub struct Options {
    pub regions: Vec<Region>,
    pub period: Duration,
    /// The demand's time constant (its smoothing), ms.
    pub demand_ms: u64,
    /// A registered limit unused this long is no longer rebalanced.
    pub idle_ms: u64,
    /// Each Redis call's deadline.
    pub timeout: Duration,
    /// How far the counters' clocks may be from this one's: within this of
    /// a window's turn, both windows' counts are taken.
    pub clock_margin_ms: u64,
}

/// What the rebalancer shows on /metrics.
#[derive(Default)]
pub struct Metrics {
    inner: Mutex<Shown>,
}

#[derive(Default, Clone)]
struct Shown {
    /// Per region and group: the allocations held, the demand (hits/s).
    allocation: BTreeMap<(String, String), u64>,
    demand: BTreeMap<(String, String), f64>,
    /// Per region: allocations written (lowered or raised), periods it
    /// was unreachable, whether it is now.
    rebalances: BTreeMap<String, u64>,
    unreachable_periods: BTreeMap<String, u64>,
    unreachable: BTreeMap<String, bool>,
    periods: u64,
}

impl Metrics {
    fn lock(&self) -> std::sync::MutexGuard<'_, Shown> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The page, in the Prometheus text format.
    pub fn render(&self) -> String {
        let s = self.lock().clone();
        let mut registry = Registry::default();
        let labels = |r: &str, g: &str| [("region", r.to_string()), ("group", g.to_string())];
        let allocation = Family::<[(&'static str, String); 2], Gauge>::default();
        for ((r, g), v) in &s.allocation {
            allocation
                .get_or_create(&labels(r, g))
                .set(i64::try_from(*v).unwrap_or(i64::MAX));
        }
        registry.register(
            "trl_region_allocation",
            "Allocations a region holds, summed over the group's tenants and limits",
            allocation,
        );
        let demand = Family::<[(&'static str, String); 2], Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        for ((r, g), v) in &s.demand {
            demand.get_or_create(&labels(r, g)).set(*v);
        }
        registry.register(
            "trl_region_demand",
            "A region's demand (hits admitted and refused per second, smoothed), summed over the group's tenants and limits",
            demand,
        );
        let rebalances = Family::<
            [(&'static str, String); 1],
            prometheus_client::metrics::counter::Counter,
        >::default();
        for (r, n) in &s.rebalances {
            rebalances
                .get_or_create(&[("region", r.clone())])
                .inc_by(*n);
        }
        registry.register(
            "trl_region_rebalances",
            "Allocations the rebalancer wrote in a region (lowered or raised)",
            rebalances,
        );
        let unreachable = Family::<[(&'static str, String); 1], Gauge>::default();
        for (r, down) in &s.unreachable {
            unreachable
                .get_or_create(&[("region", r.clone())])
                .set(i64::from(*down));
        }
        registry.register(
            "trl_region_unreachable",
            "1 while the rebalancer cannot reach the region's Redis (it keeps its allocations)",
            unreachable,
        );
        let periods = Family::<
            [(&'static str, String); 1],
            prometheus_client::metrics::counter::Counter,
        >::default();
        for (r, n) in &s.unreachable_periods {
            periods.get_or_create(&[("region", r.clone())]).inc_by(*n);
        }
        registry.register(
            "trl_region_unreachable_periods",
            "Periods the rebalancer could not reach the region's Redis",
            periods,
        );
        registry.register(
            "trl_rebalance_periods",
            "Periods the rebalancer ran",
            ConstCounter::new(s.periods),
        );
        crate::store::metrics_text(&registry)
    }
}

/// The domain and tenant of a hash tag `{<len>:<domain>:<tenant>}`.
pub fn tag_parts(key: &str) -> Option<(String, String)> {
    let rest = key.strip_prefix("trl:{")?;
    let tag = rest.get(..rest.find('}')?)?;
    let (len, rest) = tag.split_once(':')?;
    let len: usize = len.parse().ok()?;
    let domain = rest.get(..len)?;
    let tenant = rest.get(len..)?.strip_prefix(':')?;
    Some((
        domain.to_string(),
        tenant.replace("%7D", "}").replace("%25", "%"),
    ))
}

type Con = redis::aio::MultiplexedConnection;

/// A region's Redis, connected when it answers.
struct Link {
    region: Region,
    client: Option<redis::Client>,
    con: Option<Con>,
}

impl Link {
    async fn get(&mut self, timeout: Duration) -> Option<Con> {
        if let Some(c) = &self.con {
            return Some(c.clone());
        }
        let client = match &self.client {
            Some(c) => c.clone(),
            None => {
                let c = redis::Client::open(self.region.url.as_str()).ok()?;
                self.client = Some(c.clone());
                c
            }
        };
        let con = tokio::time::timeout(timeout, client.get_multiplexed_async_connection())
            .await
            .ok()?
            .ok()?;
        self.con = Some(con.clone());
        Some(con)
    }
}

async fn within<T>(
    timeout: Duration,
    f: impl std::future::Future<Output = redis::RedisResult<T>>,
) -> Option<T> {
    tokio::time::timeout(timeout, f).await.ok()?.ok()
}

/// What one region's hash and counts hold for one tenant limit.
struct Read {
    alloc: Option<u64>,
    total: u64,
    limit: Option<u64>,
    last: Option<DemandSeen>,
    used: u64,
}

/// The counter keys of the windows around `now_ms` (the previous one
/// within the margin of its turn, the next one likewise).
fn window_keys(p: &Parsed, now_ms: u64, margin_ms: u64) -> Vec<String> {
    let (start, end) = window_at(p.unit, now_ms);
    let mut keys = vec![p.counter_key(start)];
    if now_ms.saturating_sub(start) < margin_ms && start > 0 {
        keys.push(p.counter_key(window_at(p.unit, start - 1).0));
    }
    if end.saturating_sub(now_ms) <= margin_ms {
        keys.push(p.counter_key(end));
    }
    keys
}

async fn read(con: &mut Con, key: &str, windows: &[String], timeout: Duration) -> Option<Read> {
    let mut pipe = redis::pipe();
    pipe.cmd("HMGET").arg(key).arg(&[
        "alloc", "admitted", "refused", "limit", "d_total", "d_ms", "d_rate",
    ]);
    for w in windows {
        pipe.cmd("GET").arg(w);
    }
    #[allow(clippy::type_complexity)]
    let (fields, counts): (Vec<Option<String>>, Vec<Option<u64>>) = {
        let got: Vec<redis::Value> = within(timeout, pipe.query_async(con)).await?;
        let mut it = got.into_iter();
        let fields: Vec<Option<String>> = redis::from_redis_value(&it.next()?).ok()?;
        let counts = it
            .map(|v| redis::from_redis_value::<Option<u64>>(&v).ok().flatten())
            .collect();
        (fields, counts)
    };
    let num = |i: usize| -> Option<f64> { fields.get(i)?.as_deref()?.parse::<f64>().ok() };
    let int = |i: usize| num(i).filter(|n| *n >= 0.0).map(|n| n as u64);
    let last = match (int(4), int(5), num(6)) {
        (Some(total), Some(at_ms), Some(rate)) => Some(DemandSeen { total, at_ms, rate }),
        _ => None,
    };
    Some(Read {
        alloc: int(0),
        total: int(1).unwrap_or(0).saturating_add(int(2).unwrap_or(0)),
        limit: int(3),
        last,
        used: counts.into_iter().flatten().max().unwrap_or(0),
    })
}

/// Runs the rebalancer until the process ends. `now_ms`: the counters'
/// clock; `group_of`: a tenant's group in a domain (for the metrics).
pub async fn run(
    opts: Options,
    metrics: Arc<Metrics>,
    now_ms: impl Fn() -> u64,
    group_of: impl Fn(&str, &str) -> Option<String>,
) {
    let n = opts.regions.len() as u64;
    let lower = redis::Script::new(LOWER);
    let mut links: Vec<Link> = opts
        .regions
        .into_iter()
        .map(|region| Link {
            region,
            client: None,
            con: None,
        })
        .collect();
    let mut tick = tokio::time::interval(opts.period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now = now_ms();
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        // The registered limits, from every region reachable.
        let mut cons: Vec<Option<Con>> = Vec::with_capacity(links.len());
        let mut keys: BTreeSet<String> = BTreeSet::new();
        for link in &mut links {
            let mut con = link.get(opts.timeout).await;
            if let Some(c) = con.as_mut() {
                let idle_before = wall.saturating_sub(opts.idle_ms);
                let got: Option<Vec<String>> = within(
                    opts.timeout,
                    redis::pipe()
                        .cmd("ZREMRANGEBYSCORE")
                        .arg(REGISTRY)
                        .arg("-inf")
                        .arg(format!("({idle_before}"))
                        .ignore()
                        .cmd("ZRANGE")
                        .arg(REGISTRY)
                        .arg(0)
                        .arg(-1)
                        .query_async::<(Vec<String>,)>(c),
                )
                .await
                .map(|(k,)| k);
                match got {
                    Some(k) => keys.extend(k),
                    None => con = None,
                }
            }
            if con.is_none() {
                link.con = None;
            }
            cons.push(con);
        }
        let mut shown = Shown::default();
        for key in &keys {
            let Some(p) = parse(key) else { continue };
            let windows = window_keys(&p, now, opts.clock_margin_ms);
            let mut reads: Vec<Option<Read>> = Vec::with_capacity(cons.len());
            for con in cons.iter_mut() {
                let got = match con.as_mut() {
                    Some(c) => read(c, key, &windows, opts.timeout).await,
                    None => None,
                };
                if got.is_none() {
                    *con = None;
                }
                reads.push(got);
            }
            let Some(limit) = reads.iter().flatten().filter_map(|r| r.limit).min() else {
                continue;
            };
            let floor = floor_of(limit, n);
            let seen: Vec<Option<Seen>> = reads
                .iter()
                .map(|r| {
                    r.as_ref().map(|r| Seen {
                        alloc: r.alloc.unwrap_or(floor).min(limit),
                        used: r.used,
                        demand: plan::demand_rate(r.last, r.total, now, opts.demand_ms),
                    })
                })
                .collect();
            // The demand seen, kept in each region's Redis for the next period.
            for ((con, r), s) in cons.iter_mut().zip(&reads).zip(&seen) {
                if let (Some(c), Some(r), Some(s)) = (con.as_mut(), r, s) {
                    let ok = within(
                        opts.timeout,
                        redis::cmd("HSET")
                            .arg(key)
                            .arg("d_total")
                            .arg(r.total)
                            .arg("d_ms")
                            .arg(now)
                            .arg("d_rate")
                            .arg(s.demand)
                            .query_async::<i64>(c),
                    )
                    .await;
                    if ok.is_none() {
                        *con = None;
                    }
                }
            }
            let mut held: Vec<Option<u64>> = seen.iter().map(|s| s.map(|s| s.alloc)).collect();
            let before = held.clone();
            if let Some(targets) = plan::targets(limit, &seen) {
                // The lowerings, each confirmed by the script's answer.
                for (i, t) in targets.iter().enumerate() {
                    let (Some(t), Some(Some(b))) = (t, before.get(i)) else {
                        continue;
                    };
                    if t >= b {
                        continue;
                    }
                    let answer = match cons.get_mut(i).and_then(Option::as_mut) {
                        Some(c) => {
                            let mut script = lower.prepare_invoke();
                            script.key(key);
                            for w in &windows {
                                script.key(w);
                            }
                            script.arg(*t).arg(floor).arg(limit);
                            within(opts.timeout, script.invoke_async::<u64>(c)).await
                        }
                        None => None,
                    };
                    if let Some(h) = held.get_mut(i) {
                        *h = answer;
                    }
                    if answer.is_some() {
                        if let Some(l) = links.get(i) {
                            *shown.rebalances.entry(l.region.name.clone()).or_default() += 1;
                        }
                    }
                }
                // Then the raises, within what the lowerings freed.
                for (i, up) in plan::raises(limit, &before, &held, &targets)
                    .into_iter()
                    .enumerate()
                {
                    let Some(up) = up else { continue };
                    let Some(c) = cons.get_mut(i).and_then(Option::as_mut) else {
                        continue;
                    };
                    let ok = within(
                        opts.timeout,
                        redis::cmd("HSET")
                            .arg(key)
                            .arg("alloc")
                            .arg(up)
                            .query_async::<i64>(c),
                    )
                    .await;
                    if ok.is_some() {
                        if let Some(h) = held.get_mut(i) {
                            *h = Some(up);
                        }
                        if let Some(l) = links.get(i) {
                            *shown.rebalances.entry(l.region.name.clone()).or_default() += 1;
                        }
                    }
                }
            }
            let group = tag_parts(key)
                .and_then(|(d, t)| group_of(&d, &t))
                .unwrap_or_default();
            for ((link, h), s) in links.iter().zip(&held).zip(&seen) {
                if let (Some(h), Some(s)) = (h, s) {
                    let k = (link.region.name.clone(), group.clone());
                    *shown.allocation.entry(k.clone()).or_default() += h;
                    *shown.demand.entry(k).or_default() += s.demand;
                }
            }
        }
        let mut m = metrics.lock();
        m.periods += 1;
        m.allocation = shown.allocation;
        m.demand = shown.demand;
        for (r, n) in shown.rebalances {
            *m.rebalances.entry(r).or_default() += n;
        }
        for (link, con) in links.iter_mut().zip(&cons) {
            let name = link.region.name.clone();
            let down = con.is_none();
            if down {
                link.con = None;
                *m.unreachable_periods.entry(name.clone()).or_default() += 1;
            }
            m.unreachable.insert(name, down);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tag_names_its_domain_and_tenant() {
        assert_eq!(
            tag_parts("trl:{3:a:b:t%7Dx}:per_minute:regions"),
            Some(("a:b".into(), "t}x".into()))
        );
        assert_eq!(tag_parts("nope"), None);
    }

    #[test]
    fn the_windows_around_now_near_a_turn() {
        let p = parse("trl:{1:d:t}:per_minute:regions").unwrap();
        assert_eq!(
            window_keys(&p, 90_000, 1_000),
            ["trl:{1:d:t}:per_minute:60000"]
        );
        assert_eq!(
            window_keys(&p, 60_500, 1_000),
            ["trl:{1:d:t}:per_minute:60000", "trl:{1:d:t}:per_minute:0"]
        );
        assert_eq!(
            window_keys(&p, 119_500, 1_000),
            [
                "trl:{1:d:t}:per_minute:60000",
                "trl:{1:d:t}:per_minute:120000"
            ]
        );
    }
}

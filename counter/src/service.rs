//! The glue: the gRPC method, and the HTTP endpoints.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract;
use tonic::codegen::http;

use crate::bounds::{Bounds, OutOfBounds};
use crate::decide::{answer, plan};
use crate::fleet::{Fleet, ENVOY_ID_HEADER};
use crate::metrics::{GroupCounts, Metrics};
use crate::proto::{RateLimitRequest, RateLimitResponse};
use crate::store::Store;
use crate::teams::Teams;

/// The largest message read: a call of MAX_DESCRIPTORS descriptors fits.
const MAX_MESSAGE_BYTES: usize = 1 << 20;

pub struct State {
    pub teams: Arc<Teams>,
    pub store: Arc<Store>,
    pub metrics: Arc<Metrics>,
    pub clock_file: Option<PathBuf>,
    pub bounds: Bounds,
    /// The Envoys that called, per domain (`fleet`).
    pub fleet: Fleet,
}

impl State {
    pub fn now(&self) -> u64 {
        crate::now_ms(self.clock_file.as_deref())
    }

    /// Decides a call; `envoy`: the id of the Envoy that sent it (its
    /// `ENVOY_ID_HEADER`), answered with the fleet's size.
    pub async fn should_rate_limit(
        &self,
        req: RateLimitRequest,
        envoy: Option<&str>,
    ) -> Result<RateLimitResponse, tonic::Status> {
        self.metrics.calls.fetch_add(1, Ordering::Relaxed);
        let now = self.now();
        // Before any store work: hits the store must never be asked to
        // add, tenants longer than the filter sends.
        self.bounds.check(&req).map_err(|e| {
            self.metrics.bad_calls.fetch_add(1, Ordering::Relaxed);
            let refused = match e {
                OutOfBounds::TenantLength { .. } => &self.metrics.limits.tenant_too_long,
                OutOfBounds::Hits { .. } | OutOfBounds::CallHits(_) => {
                    &self.metrics.limits.hits_refused
                }
            };
            refused.fetch_add(1, Ordering::Relaxed);
            tonic::Status::invalid_argument(e.to_string())
        })?;
        let domain = self.teams.get(&req.domain);
        let planned = plan(domain.as_deref().map(|d| &d.domain), &req, now).map_err(|e| {
            self.metrics.bad_calls.fetch_add(1, Ordering::Relaxed);
            tonic::Status::invalid_argument(e.to_string())
        })?;
        let started = std::time::Instant::now();
        let decided = self.store.decide(&planned.requests, now).await;
        let us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        // A call the over-limit cache answered whole did no store work, nor
        // did one failed at once (the store known down).
        if !matches!(&decided, Ok(d) if d.from_cache > 0 && d.from_cache == planned.requests.len())
            && !matches!(&decided, Err(crate::store::StoreError::Down(_)))
        {
            self.metrics.latency(us);
        }
        let decided = decided.map_err(|e| {
            self.metrics.store_errors.fetch_add(1, Ordering::Relaxed);
            if matches!(e, crate::store::StoreError::Down(_)) {
                self.metrics
                    .limits
                    .store_fast_failed
                    .fetch_add(1, Ordering::Relaxed);
            }
            tonic::Status::unavailable(e.to_string())
        })?;
        // Requests whose keys hold something else than a count failed
        // alone; a call of which every request failed fails.
        let failed = decided.requests.iter().filter(|d| d.failed).count();
        if failed > 0 {
            self.metrics
                .store_bad_values
                .fetch_add(failed as u64, Ordering::Relaxed);
            if failed == planned.requests.len() {
                self.metrics.store_errors.fetch_add(1, Ordering::Relaxed);
                return Err(tonic::Status::unavailable(
                    crate::store::StoreError::BadValue.to_string(),
                ));
            }
        }
        if decided.from_cache > 0 {
            self.metrics
                .cache_refused
                .fetch_add(decided.from_cache as u64, Ordering::Relaxed);
        }
        let (mut response, outcomes) = answer(&planned, &decided.requests, now);
        if let (Some(id), Some(_)) = (envoy, &domain) {
            response.fleet_envoys = self.fleet.called(&req.domain, id, now);
        }
        if let Some(d) = &domain {
            // Per group first (a call's requests are mostly of a few
            // groups), then each group's name once.
            let mut per_group: Vec<(usize, GroupCounts)> = Vec::new();
            for o in outcomes.iter().filter(|o| !o.failed) {
                match per_group.iter_mut().find(|(g, _)| *g == o.group) {
                    Some((_, c)) => c.add(o),
                    None => {
                        let mut c = GroupCounts::default();
                        c.add(o);
                        per_group.push((o.group, c));
                    }
                }
            }
            let named = per_group.into_iter().map(|(g, c)| (d.group_name(g), c));
            self.metrics.requests(&req.domain, named);
        }
        Ok(response)
    }
}

/// The server side tonic generates (`build.rs`) for the rate-limit
/// service: routing, decoding and the `RateLimitService` trait.
#[allow(clippy::all, clippy::pedantic, missing_docs, unused_qualifications)]
mod generated {
    include!(concat!(
        env!("OUT_DIR"),
        "/envoy.service.ratelimit.v3.RateLimitService.rs"
    ));
}

pub use generated::rate_limit_service_server::RateLimitService;
use generated::rate_limit_service_server::RateLimitServiceServer;

/// The rate-limit service: each call decided by [`State::should_rate_limit`].
pub struct Rls(pub Arc<State>);

#[tonic::async_trait]
impl RateLimitService for Rls {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        let envoy = request
            .metadata()
            .get(ENVOY_ID_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        self.0
            .should_rate_limit(request.into_inner(), envoy.as_deref())
            .await
            .map(tonic::Response::new)
    }
}

/// The gRPC service to add to the server, its message size bounded and
/// its message bytes counted against its connection's most.
pub fn rate_limit_server(
    state: Arc<State>,
) -> crate::limits::Budgeted<RateLimitServiceServer<Rls>> {
    crate::limits::Budgeted {
        metrics: state.metrics.clone(),
        inner: RateLimitServiceServer::new(Rls(state)).max_decoding_message_size(MAX_MESSAGE_BYTES),
    }
}

impl State {
    /// Every `fleet::SYNC_MS`, for as long as it runs: what this replica
    /// heard of the fleet written to the store, each domain's size read
    /// back (a Redis store; nothing to do with the memory store).
    pub async fn sync_fleet(&self) {
        let mut tick =
            tokio::time::interval(std::time::Duration::from_millis(crate::fleet::SYNC_MS));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let now = self.now();
            let syncs = self.fleet.to_sync(now);
            if syncs.is_empty() {
                continue;
            }
            match self.store.fleet(&syncs).await {
                Ok(Some(sizes)) => {
                    let named: Vec<(String, u32)> =
                        syncs.iter().map(|s| s.domain.clone()).zip(sizes).collect();
                    self.fleet.synced(&named, self.now());
                }
                Ok(None) => {}
                Err(_) => {
                    self.metrics
                        .fleet_sync_failed
                        .fetch_add(1, Ordering::Relaxed);
                    self.fleet.unsynced(&syncs);
                }
            }
        }
    }
}

/// What `/readyz` and the gRPC health both answer from: ready only with a
/// team file loaded and a store that answers, and otherwise what is missing.
pub struct Readiness {
    pub teams: Result<String, String>,
    pub store: Result<(), String>,
}

impl Readiness {
    pub fn ready(&self) -> bool {
        self.teams.is_ok() && self.store.is_ok()
    }

    /// The body of `/readyz`: one line each, with what is missing.
    pub fn body(&self) -> String {
        let teams = match &self.teams {
            Ok(shown) => format!("team file loaded: true ({shown})\n"),
            Err(why) => format!("team file loaded: false ({why})\n"),
        };
        let store = match &self.store {
            Ok(()) => "store answers: true\n".to_string(),
            Err(why) => format!("store answers: false ({why})\n"),
        };
        teams + &store
    }
}

impl State {
    pub async fn readiness(&self) -> Readiness {
        Readiness {
            teams: self.teams.status(),
            store: self.store.ping().await.map_err(|e| e.to_string()),
        }
    }
}

async fn metrics(extract::State(state): extract::State<Arc<State>>) -> String {
    state
        .metrics
        .limits
        .store_down
        .store(u64::from(state.store.down()), Ordering::Relaxed);
    let fleet = state.fleet.sizes(state.now());
    state.metrics.render(state.store.name(), &fleet) + &state.store.metrics()
}

async fn ready(extract::State(state): extract::State<Arc<State>>) -> (http::StatusCode, String) {
    let r = state.readiness().await;
    let code = if r.ready() {
        http::StatusCode::OK
    } else {
        http::StatusCode::SERVICE_UNAVAILABLE
    };
    (code, r.body())
}

/// /metrics, /healthz (the process runs), /readyz (a team file is loaded
/// and the store answers).
pub fn http_app(state: Arc<State>) -> axum::Router {
    use axum::routing::get;
    axum::Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .with_state(state)
}

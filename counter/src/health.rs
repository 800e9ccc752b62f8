//! The gRPC health (`grpc.health.v1.Health`), in step with `/readyz`: a
//! name is SERVING only while the counter is ready (a team file served and
//! a store that answers), NOT_SERVING otherwise, and on SIGTERM.

use std::sync::Arc;
use std::time::Duration;

use tonic_health::pb::health_check_response::ServingStatus as Status;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};
use tonic_health::server::{HealthReporter, HealthService};
use tonic_health::ServingStatus;

use crate::proto;
use crate::service::State;

/// The names the gRPC health answers for: the server as a whole, and the
/// rate-limit service.
pub const NAMES: [&str; 2] = ["", proto::SERVICE];

/// tonic-health's service, with `Check` answered from the readiness
/// itself, so that it never says SERVING while `/readyz` is not 200.
pub struct ReadyHealth {
    reported: HealthService,
    state: Arc<State>,
}

#[tonic::async_trait]
impl Health for ReadyHealth {
    async fn check(
        &self,
        request: tonic::Request<HealthCheckRequest>,
    ) -> Result<tonic::Response<HealthCheckResponse>, tonic::Status> {
        let reported = self.reported.check(request).await?;
        if reported.get_ref().status == Status::Serving as i32
            && !self.state.readiness().await.ready()
        {
            return Ok(tonic::Response::new(HealthCheckResponse {
                status: Status::NotServing as i32,
            }));
        }
        Ok(reported)
    }

    type WatchStream = <HealthService as Health>::WatchStream;

    async fn watch(
        &self,
        request: tonic::Request<HealthCheckRequest>,
    ) -> Result<tonic::Response<Self::WatchStream>, tonic::Status> {
        self.reported.watch(request).await
    }
}

fn serving(ready: bool) -> ServingStatus {
    if ready {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    }
}

/// The reporter (for [`follow_readiness`] and [`stopping`]) and the
/// service to add to the gRPC server, each name set from the readiness now.
pub async fn server(state: Arc<State>) -> (HealthReporter, HealthServer<ReadyHealth>) {
    let reporter = HealthReporter::new();
    let status = serving(state.readiness().await.ready());
    for name in NAMES {
        reporter.set_service_status(name, status).await;
    }
    let reported = HealthService::from_health_reporter(reporter.clone());
    (reporter, HealthServer::new(ReadyHealth { reported, state }))
}

/// Keeps what `Watch` streams in step with the readiness, checked every
/// `every`: a watcher sees NOT_SERVING within one interval of `/readyz`
/// turning 503, and SERVING again once it is 200.
pub async fn follow_readiness(reporter: HealthReporter, state: Arc<State>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last = None;
    loop {
        tick.tick().await;
        let ready = state.readiness().await.ready();
        if last != Some(ready) {
            for name in NAMES {
                reporter.set_service_status(name, serving(ready)).await;
            }
            last = Some(ready);
        }
    }
}

/// The gRPC health on SIGTERM: every name NOT_SERVING, then the statuses
/// dropped, so that each open `Watch` stream sends NOT_SERVING and ends
/// (a stream that never ends would hold the drain until the process is
/// killed). A `Check` from then on is refused with the connection.
pub async fn stopping(health: &mut HealthReporter) {
    for name in NAMES {
        health
            .set_service_status(name, ServingStatus::NotServing)
            .await;
    }
    for name in NAMES {
        health.clear_service_status(name).await;
    }
}

#[cfg(test)]
mod tests {
    use futures_util::StreamExt;
    use tonic_health::pb::health_server::Health;
    use tonic_health::pb::{health_check_response::ServingStatus, HealthCheckRequest};
    use tonic_health::server::{health_reporter, HealthService};

    #[tokio::test]
    async fn stopping_turns_every_watch_not_serving_then_ends_it() {
        let (mut health, _) = health_reporter();
        for name in super::NAMES {
            health
                .set_service_status(name, tonic_health::ServingStatus::Serving)
                .await;
        }
        let service = HealthService::from_health_reporter(health.clone());
        let mut watches = Vec::new();
        for name in super::NAMES {
            let request = tonic::Request::new(HealthCheckRequest {
                service: name.to_string(),
            });
            let mut w = service.watch(request).await.unwrap().into_inner();
            let first = w.next().await.unwrap().unwrap();
            assert_eq!(first.status, ServingStatus::Serving as i32);
            watches.push(w);
        }
        super::stopping(&mut health).await;
        for mut w in watches {
            let last = w.next().await.unwrap().unwrap();
            assert_eq!(last.status, ServingStatus::NotServing as i32);
            let end = tokio::time::timeout(std::time::Duration::from_secs(5), w.next()).await;
            assert!(matches!(end, Ok(None)), "the watch stream did not end");
        }
    }
}

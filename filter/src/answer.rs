//! The rate-limit service's answer, decoded once. Whoever reads an answer
//! (the request's verdict in `decision`, a lease's outcome in `lease`, a
//! sync view in `sync`) takes it from here: an `Answer`, or why there is
//! none (`RlsError`).

use std::fmt;

use prost::Message;

use crate::host::HostError;
use crate::proto::{Code, RateLimitResponse};

/// Why the service's answer could not be used (or the call not made).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RlsError {
    /// A gRPC status other than OK (14 for timeouts and refused connections).
    Grpc(u32),
    /// The body was missing or was not a `RateLimitResponse`.
    Undecodable,
    /// `overall_code` was UNKNOWN or a code this filter does not know.
    UnknownCode,
    /// A host call failed (reading the header, dispatching the call).
    Host(HostError),
    /// No answer within `timeout_ms` (a request queued for the worker's next
    /// call, or a call whose answer never came).
    Expired,
    /// The worker's queue of calls is full.
    QueueFull,
    /// The worker's tables of calls were in use (a callback re-entered the
    /// batcher while it held them): the part could not be queued or kept.
    Busy,
    /// The part names a group the configuration does not have.
    NoGroup,
    /// No call was made: the breaker is open (`breaker`).
    BreakerOpen,
}

impl fmt::Display for RlsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RlsError::Grpc(status) => write!(f, "gRPC status {status}"),
            RlsError::Undecodable => f.write_str("the answer is not a RateLimitResponse"),
            RlsError::UnknownCode => f.write_str("the answer's overall code is unknown"),
            RlsError::Host(e) => e.fmt(f),
            RlsError::Expired => f.write_str("no answer within timeout_ms"),
            RlsError::QueueFull => f.write_str("the worker's queue of calls is full"),
            RlsError::Busy => f.write_str("the worker's tables of calls were in use"),
            RlsError::NoGroup => f.write_str("the call names a group the configuration lacks"),
            RlsError::BreakerOpen => f.write_str("the breaker is open"),
        }
    }
}

impl std::error::Error for RlsError {}

/// An answer the service gave: OK or OVER_LIMIT, with its statuses (one
/// per descriptor sent, in order: the group's units, shortest first) and
/// its headers.
#[derive(Clone, Debug, PartialEq)]
pub struct Answer {
    /// `overall_code` is OVER_LIMIT (else OK).
    pub over_limit: bool,
    pub response: RateLimitResponse,
}

/// Decodes the answer to a call from its gRPC status and body.
pub fn decode(grpc_status: u32, body: Option<&[u8]>) -> Result<Answer, RlsError> {
    if grpc_status != 0 {
        return Err(RlsError::Grpc(grpc_status));
    }
    let response = body
        .and_then(|b| RateLimitResponse::decode(b).ok())
        .ok_or(RlsError::Undecodable)?;
    let over_limit = match response.overall_code() {
        Code::Ok => false,
        Code::OverLimit => true,
        Code::Unknown => return Err(RlsError::UnknownCode),
    };
    Ok(Answer {
        over_limit,
        response,
    })
}

impl Answer {
    /// The smallest `limit_remaining` of the statuses (`u32::MAX` without
    /// any).
    pub fn remaining(&self) -> u32 {
        self.response
            .statuses
            .iter()
            .map(|s| s.limit_remaining)
            .min()
            .unwrap_or(u32::MAX)
    }

    /// Per status, in the order of the descriptors sent: whether it is over
    /// its limit, and its `limit_remaining`.
    pub fn counts(&self) -> impl Iterator<Item = (bool, u32)> + '_ {
        self.response
            .statuses
            .iter()
            .map(|s| (s.code() == Code::OverLimit, s.limit_remaining))
    }

    /// Whether any status is over its limit.
    pub fn any_over_limit(&self) -> bool {
        self.counts().any(|(over, _)| over)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::RateLimitUnit;
    use crate::testing::{answer, status};
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn an_answer_is_ok_or_over_limit_and_anything_else_an_error() {
        let ok = answer(
            Code::Ok,
            vec![
                status(Code::Ok, 10, RateLimitUnit::Minute, 7, 40),
                status(Code::Ok, 100, RateLimitUnit::Hour, 3, 400),
            ],
        );
        let a = decode(0, Some(&ok)).unwrap();
        assert!(!a.over_limit);
        assert_eq!(a.remaining(), 3);
        assert_eq!(a.counts().collect::<Vec<_>>(), [(false, 7), (false, 3)]);
        assert!(!a.any_over_limit());
        let over = answer(
            Code::OverLimit,
            vec![status(Code::OverLimit, 10, RateLimitUnit::Minute, 0, 40)],
        );
        let a = decode(0, Some(&over)).unwrap();
        assert!(a.over_limit && a.any_over_limit());
        assert_eq!(
            decode(0, Some(&answer(Code::Ok, vec![])))
                .unwrap()
                .remaining(),
            u32::MAX
        );
        assert_eq!(decode(14, Some(&ok)), Err(RlsError::Grpc(14)));
        assert_eq!(decode(0, None), Err(RlsError::Undecodable));
        assert_eq!(decode(0, Some(&[0xff, 0xff])), Err(RlsError::Undecodable));
        // An empty message decodes to overall_code UNKNOWN: an error.
        assert_eq!(decode(0, Some(&[])), Err(RlsError::UnknownCode));
    }

    #[test]
    fn errors_say_what_failed() {
        use crate::host::HostCall;
        assert_eq!(RlsError::Grpc(14).to_string(), "gRPC status 14");
        let e = RlsError::Host(HostError::new(HostCall::Dispatch, 1));
        assert_eq!(e.to_string(), "dispatch_grpc failed (status 1)");
    }
}

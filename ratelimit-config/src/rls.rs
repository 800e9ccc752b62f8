//! What the filter and `ratelimit-counter` say to each other, in one place:
//! the messages of `envoy.service.ratelimit.v3.RateLimitService`, with the
//! field numbers of envoyproxy/data-plane-api (`rls.proto`,
//! `envoy/extensions/common/ratelimit/v3/ratelimit.proto`), derived with
//! prost so that no protoc is needed; the request marks the counter reads
//! ([`REQUEST_MARK`], [`PUSH`]); and the mapping between the team file's
//! [`Unit`] and the RLS unit numbers ([`RateLimitUnit`]).
//!
//! Fields neither side reads are left out: prost skips unknown fields when
//! decoding, and an empty field costs nothing when encoding. Behind the
//! `rls` feature (prost); the CLI does not need it.

use prost::Message;

use crate::Unit;

pub const SERVICE: &str = "envoy.service.ratelimit.v3.RateLimitService";
pub const METHOD: &str = "ShouldRateLimit";

/// The key of the entry that begins a request in a call to the counter: a
/// descriptor whose first entry has this key is a mark, left out of every
/// counter key. The counter decides each request of a call as a whole
/// (admitted only if all of its windows admit it); a call without marks is
/// one request.
pub const REQUEST_MARK: &str = "trl.request";

/// The mark's value that begins a push: hits the caller admitted (served)
/// already, which the counter counts on every window whatever the limits,
/// answering the counts. An ordinary request's mark has an empty value.
pub const PUSH: &str = "push";

/// The gRPC metadata (request header) that names the Envoy a call comes
/// from: one id per Envoy process, shared by its workers. The counter
/// answers a call that carries it with the fleet's size
/// ([`RateLimitResponse::fleet_envoys`]); envoyproxy/ratelimit ignores it.
pub const ENVOY_ID_HEADER: &str = "x-trl-envoy-id";

/// The most bytes of an Envoy id the counter reads; a longer one is not
/// counted.
pub const MAX_ENVOY_ID_BYTES: usize = 64;

/// The field number of [`RateLimitResponse::fleet_envoys`]: not one of
/// `rls.proto`'s (they end at 7), far above them, so that a reader of the
/// standard message (Envoy's own filter) skips it as an unknown field.
pub const FLEET_ENVOYS_FIELD: u32 = 1_000;

#[derive(Clone, PartialEq, Message)]
pub struct RateLimitRequest {
    #[prost(string, tag = "1")]
    pub domain: String,
    #[prost(message, repeated, tag = "2")]
    pub descriptors: Vec<RateLimitDescriptor>,
    /// 0 (unset) counts 1, as envoyproxy/ratelimit does.
    #[prost(uint32, tag = "3")]
    pub hits_addend: u32,
}

/// `envoy.extensions.common.ratelimit.v3.RateLimitDescriptor`
#[derive(Clone, PartialEq, Message)]
pub struct RateLimitDescriptor {
    #[prost(message, repeated, tag = "1")]
    pub entries: Vec<Entry>,
    /// This descriptor's own hits (it overrides the request's
    /// `hits_addend`; 0 checks without counting): what lets one call carry
    /// requests of different costs.
    #[prost(message, optional, tag = "3")]
    pub hits_addend: Option<UInt64Value>,
}

/// `google.protobuf.UInt64Value`
#[derive(Clone, Copy, PartialEq, Message)]
pub struct UInt64Value {
    #[prost(uint64, tag = "1")]
    pub value: u64,
}

#[derive(Clone, PartialEq, Message)]
pub struct Entry {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum Code {
    Unknown = 0,
    Ok = 1,
    OverLimit = 2,
}

#[derive(Clone, PartialEq, Message)]
pub struct RateLimitResponse {
    #[prost(enumeration = "Code", tag = "1")]
    pub overall_code: i32,
    #[prost(message, repeated, tag = "2")]
    pub statuses: Vec<DescriptorStatus>,
    /// Headers for the client: on the 429, or on the upstream's response.
    #[prost(message, repeated, tag = "3")]
    pub response_headers_to_add: Vec<HeaderValue>,
    /// Headers for the upstream request of an admitted request.
    #[prost(message, repeated, tag = "4")]
    pub request_headers_to_add: Vec<HeaderValue>,
    /// ratelimit-counter's own: the Envoys that called it for the domain
    /// in its fleet interval, answered to a call that named its Envoy
    /// ([`ENVOY_ID_HEADER`]); 0 (absent) otherwise, and always from
    /// envoyproxy/ratelimit. Field [`FLEET_ENVOYS_FIELD`].
    #[prost(uint32, tag = "1000")]
    pub fleet_envoys: u32,
}

/// `envoy.config.core.v3.HeaderValue`. Its `raw_value` (field 3, bytes)
/// is left out, as Envoy's own rate-limit client reads only `value`.
#[derive(Clone, PartialEq, Message)]
pub struct HeaderValue {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct DescriptorStatus {
    #[prost(enumeration = "Code", tag = "1")]
    pub code: i32,
    #[prost(message, optional, tag = "2")]
    pub current_limit: Option<RateLimit>,
    #[prost(uint32, tag = "3")]
    pub limit_remaining: u32,
    #[prost(message, optional, tag = "4")]
    pub duration_until_reset: Option<Duration>,
}

impl DescriptorStatus {
    /// Whole seconds until the window resets, never negative.
    pub fn reset_seconds(&self) -> u64 {
        self.duration_until_reset
            .map(|d| u64::try_from(d.seconds).unwrap_or(0))
            .unwrap_or(0)
    }

    /// Seconds until the window resets, rounded up.
    pub fn reset_seconds_ceil(&self) -> u64 {
        let nanos = self.duration_until_reset.map(|d| d.nanos).unwrap_or(0);
        self.reset_seconds() + u64::from(nanos > 0)
    }
}

/// `RateLimitResponse.RateLimit.Unit`: WEEK is 7, after MONTH and YEAR.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum RateLimitUnit {
    Unknown = 0,
    Second = 1,
    Minute = 2,
    Hour = 3,
    Day = 4,
    Month = 5,
    Year = 6,
    Week = 7,
}

impl RateLimitUnit {
    /// The window length in seconds, as the headers' `w=` gives it (a
    /// week is 7 days on the calendar too); 0 for the units whose length
    /// varies (months, years), which the headers leave out.
    pub fn window_seconds(self) -> u64 {
        match self {
            RateLimitUnit::Second => 1,
            RateLimitUnit::Minute => 60,
            RateLimitUnit::Hour => 3_600,
            RateLimitUnit::Day => 86_400,
            RateLimitUnit::Week => 7 * 86_400,
            _ => 0,
        }
    }

    /// The team file's unit of this one (None: `Unknown`).
    pub fn unit(self) -> Option<Unit> {
        Some(match self {
            RateLimitUnit::Unknown => return None,
            RateLimitUnit::Second => Unit::Second,
            RateLimitUnit::Minute => Unit::Minute,
            RateLimitUnit::Hour => Unit::Hour,
            RateLimitUnit::Day => Unit::Day,
            RateLimitUnit::Week => Unit::Week,
            RateLimitUnit::Month => Unit::Month,
            RateLimitUnit::Year => Unit::Year,
        })
    }
}

impl From<Unit> for RateLimitUnit {
    fn from(unit: Unit) -> RateLimitUnit {
        match unit {
            Unit::Second => RateLimitUnit::Second,
            Unit::Minute => RateLimitUnit::Minute,
            Unit::Hour => RateLimitUnit::Hour,
            Unit::Day => RateLimitUnit::Day,
            Unit::Week => RateLimitUnit::Week,
            Unit::Month => RateLimitUnit::Month,
            Unit::Year => RateLimitUnit::Year,
            // The protocol has no other length: the filter knows the
            // window from the descriptor it sent, never from this.
            Unit::Custom(_) => RateLimitUnit::Unknown,
        }
    }
}

#[derive(Clone, PartialEq, Message)]
pub struct RateLimit {
    #[prost(string, tag = "3")]
    pub name: String,
    #[prost(uint32, tag = "1")]
    pub requests_per_unit: u32,
    #[prost(enumeration = "RateLimitUnit", tag = "2")]
    pub unit: i32,
}

/// `google.protobuf.Duration`
#[derive(Clone, Copy, PartialEq, Message)]
pub struct Duration {
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fleet's size travels in its own field, which a reader of the
    /// standard message skips; absent when it is 0.
    #[test]
    fn the_fleet_size_is_field_1000_and_absent_at_zero() {
        let mut r = RateLimitResponse {
            overall_code: Code::Ok as i32,
            statuses: Vec::new(),
            response_headers_to_add: Vec::new(),
            request_headers_to_add: Vec::new(),
            fleet_envoys: 0,
        };
        assert_eq!(r.encode_to_vec(), [0x08, 0x01]);
        r.fleet_envoys = 6;
        let key = u64::from(FLEET_ENVOYS_FIELD) << 3;
        assert_eq!(key, 0x1f40);
        assert_eq!(r.encode_to_vec(), [0x08, 0x01, 0xc0, 0x3e, 0x06]);
    }

    /// Every unit maps to its RLS number and back; the numbers are
    /// data-plane-api's.
    #[test]
    fn units_map_both_ways() {
        for unit in Unit::ALL {
            assert_eq!(RateLimitUnit::from(unit).unit(), Some(unit));
        }
        assert_eq!(RateLimitUnit::Unknown.unit(), None);
        let numbers = [
            (Unit::Second, 1),
            (Unit::Minute, 2),
            (Unit::Hour, 3),
            (Unit::Day, 4),
            (Unit::Month, 5),
            (Unit::Year, 6),
            (Unit::Week, 7),
        ];
        for (unit, number) in numbers {
            assert_eq!(RateLimitUnit::from(unit) as i32, number, "{unit:?}");
        }
    }

    #[test]
    fn reset_seconds_round_up_nanos() {
        let s = DescriptorStatus {
            duration_until_reset: Some(Duration {
                seconds: 42,
                nanos: 5,
            }),
            ..DescriptorStatus::default()
        };
        assert_eq!(s.reset_seconds(), 42);
        assert_eq!(s.reset_seconds_ceil(), 43);
        let negative = DescriptorStatus {
            duration_until_reset: Some(Duration {
                seconds: -1,
                nanos: 0,
            }),
            ..DescriptorStatus::default()
        };
        assert_eq!(negative.reset_seconds(), 0);
    }
}

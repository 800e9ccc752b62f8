//! The messages of `envoy.service.ratelimit.v3.RateLimitService`, with the
//! field numbers of envoyproxy/data-plane-api (`rls.proto`,
//! `envoy/extensions/common/ratelimit/v3/ratelimit.proto`), derived with
//! prost (no protoc). Fields the counter never reads are left out: prost
//! skips unknown fields when decoding.

use prost::Message;

pub const SERVICE: &str = "envoy.service.ratelimit.v3.RateLimitService";
pub const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

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

#[derive(Clone, PartialEq, Message)]
pub struct RateLimitDescriptor {
    #[prost(message, repeated, tag = "1")]
    pub entries: Vec<Entry>,
    /// This descriptor's own hits, over the request's (0: check only).
    #[prost(message, optional, tag = "3")]
    pub hits_addend: Option<UInt64Value>,
}

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

#[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
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

#[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
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

#[derive(Clone, PartialEq, Message)]
pub struct RateLimit {
    #[prost(string, tag = "3")]
    pub name: String,
    #[prost(uint32, tag = "1")]
    pub requests_per_unit: u32,
    #[prost(enumeration = "RateLimitUnit", tag = "2")]
    pub unit: i32,
}

#[derive(Clone, Copy, PartialEq, Message)]
pub struct Duration {
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}

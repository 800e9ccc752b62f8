//! The filter's side of `envoy.service.ratelimit.v3.RateLimitService`: the
//! messages are `ratelimit_config::rls` (one definition for the filter and
//! `ratelimit-counter`), re-exported here; the request is encoded by hand
//! from borrowed strings (no owned message built per call), and the
//! upstream named as a serialized `GrpcService`.

#[cfg(test)]
use prost::Message;
pub use ratelimit_config::rls::{
    Code, DescriptorStatus, Duration, Entry, HeaderValue, RateLimit, RateLimitDescriptor,
    RateLimitRequest, RateLimitResponse, RateLimitUnit, UInt64Value, METHOD, SERVICE,
};

/// `envoy.config.core.v3.GrpcService`, only its `envoy_grpc` target (the
/// filter writes it by hand: `grpc_upstream`).
#[cfg(test)]
#[derive(Clone, PartialEq, Message)]
pub struct GrpcService {
    #[prost(message, optional, tag = "1")]
    pub envoy_grpc: Option<EnvoyGrpc>,
}

#[cfg(test)]
#[derive(Clone, PartialEq, Message)]
pub struct EnvoyGrpc {
    #[prost(string, tag = "1")]
    pub cluster_name: String,
}

/// What `dispatch_grpc_call` is given as its upstream. Envoy first tries to
/// parse that string as a serialized `GrpcService` and only then takes it as
/// a cluster name, so a bare name could be misread as a message; a
/// serialized `GrpcService` is unambiguous. It must be passed as `&str`: for
/// names of up to 125 ASCII bytes every byte of it is below 0x80. Anything
/// else falls back to the bare name.
pub fn grpc_upstream(cluster: &str) -> String {
    // GrpcService { envoy_grpc (1): EnvoyGrpc { cluster_name (1) } },
    // written as prost writes it (no prost encoder linked for it).
    let inner = string_len(cluster);
    let mut bytes = Vec::with_capacity(delimited_len(inner));
    bytes.push(ENVOY_GRPC);
    put_varint(&mut bytes, inner);
    put_string(&mut bytes, CLUSTER_NAME, cluster);
    String::from_utf8(bytes).unwrap_or_else(|_| cluster.to_string())
}

/// Keys of `GrpcService.envoy_grpc` and `EnvoyGrpc.cluster_name`.
const ENVOY_GRPC: u8 = 1 << 3 | 2;
const CLUSTER_NAME: u8 = 1 << 3 | 2;

fn varint_len(mut n: usize) -> usize {
    let mut len = 1;
    while n >= 0x80 {
        n >>= 7;
        len += 1;
    }
    len
}

fn put_varint(out: &mut Vec<u8>, mut n: usize) {
    while n >= 0x80 {
        out.push((n as u8 & 0x7f) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// A length-delimited field of `len` bytes, with its one-byte key.
fn delimited_len(len: usize) -> usize {
    1 + varint_len(len) + len
}

/// A string field: proto3 leaves out an empty one.
fn string_len(s: &str) -> usize {
    if s.is_empty() {
        0
    } else {
        delimited_len(s.len())
    }
}

fn put_string(out: &mut Vec<u8>, key: u8, s: &str) {
    if !s.is_empty() {
        out.push(key);
        put_varint(out, s.len());
        out.extend_from_slice(s.as_bytes());
    }
}

/// Keys (field number and wire type 2) of the request's fields.
const DOMAIN: u8 = 1 << 3 | 2;
const DESCRIPTORS: u8 = 2 << 3 | 2;
const ENTRIES: u8 = 1 << 3 | 2;
const ENTRY_KEY: u8 = 1 << 3 | 2;
const ENTRY_VALUE: u8 = 2 << 3 | 2;
const HITS_ADDEND: u8 = 3 << 3;
/// A descriptor's own `hits_addend` (a `UInt64Value`), and its `value`.
const DESCRIPTOR_HITS: u8 = 3 << 3 | 2;
const UINT64_VALUE: u8 = 1 << 3;

fn entry_len((key, value): (&str, &str)) -> usize {
    string_len(key) + string_len(value)
}

/// A descriptor's own hits, as its `hits_addend` field (`UInt64Value`).
fn descriptor_hits_len(hits: Option<u32>) -> usize {
    hits.map_or(0, |h| delimited_len(1 + varint_len(h as usize)))
}

fn descriptor_len(entries: &[(&str, &str)], hits: Option<u32>) -> usize {
    entries
        .iter()
        .map(|e| delimited_len(entry_len(*e)))
        .sum::<usize>()
        + descriptor_hits_len(hits)
}

/// A `RateLimitRequest` encoded straight from borrowed strings, in one
/// allocation of its exact size: the same bytes as encoding the owned
/// message, without building it. `descriptors` gives the descriptors'
/// entries, each time it is called (twice: to size, then to write).
/// `hits_addend` 0 is left out (the service then counts 1 hit).
pub fn encode_rate_limit_request<'a, F, D, E>(
    domain: &str,
    hits_addend: u32,
    descriptors: F,
) -> Vec<u8>
where
    F: Fn() -> D,
    D: Iterator<Item = E>,
    E: AsRef<[(&'a str, &'a str)]>,
{
    encode(domain, hits_addend, &|f: &mut dyn Each| {
        for d in descriptors() {
            f.each(d.as_ref(), None);
        }
    })
}

/// The request of a call that carries several requests (or tenants): each
/// descriptor with its own hits, as its own `hits_addend` when it is not 1
/// (left out, the service counts 1), and no request-wide `hits_addend`.
pub fn encode_batch_request<'a, F, D, E>(domain: &str, descriptors: F) -> Vec<u8>
where
    F: Fn() -> D,
    D: Iterator<Item = (E, u32)>,
    E: AsRef<[(&'a str, &'a str)]>,
{
    encode(domain, 0, &|f: &mut dyn Each| {
        for (d, hits) in descriptors() {
            f.each(d.as_ref(), (hits != 1).then_some(hits));
        }
    })
}

/// Takes a descriptor's entries and own hits. A trait of one method, not
/// `dyn FnMut`: that vtable also holds a `call_once` copy of the closure,
/// never called (the .wasm's size counts).
trait Each {
    fn each(&mut self, entries: &[(&str, &str)], hits: Option<u32>);
}

impl<F: FnMut(&[(&str, &str)], Option<u32>)> Each for F {
    fn each(&mut self, entries: &[(&str, &str)], hits: Option<u32>) {
        self(entries, hits)
    }
}

/// Hands each descriptor to `Each`, in order (called twice: to size, then
/// to write); one method, as `Each`.
trait Source {
    fn source(&self, f: &mut dyn Each);
}

impl<F: Fn(&mut dyn Each)> Source for F {
    fn source(&self, f: &mut dyn Each) {
        self(f)
    }
}

type Descriptors<'f> = &'f dyn Source;

/// One body for every message (not one per caller's iterator type: the
/// .wasm's size counts).
fn encode(domain: &str, hits_addend: u32, descriptors: Descriptors<'_>) -> Vec<u8> {
    // u32 fits a usize on every target this builds for (32 and 64 bits).
    let hits = usize::try_from(hits_addend).unwrap_or(usize::MAX);
    let hits_len = if hits == 0 { 0 } else { 1 + varint_len(hits) };
    let mut len = string_len(domain) + hits_len;
    descriptors.source(&mut |d: &[(&str, &str)], h: Option<u32>| {
        len += delimited_len(descriptor_len(d, h))
    });
    let mut out = Vec::with_capacity(len);
    put_string(&mut out, DOMAIN, domain);
    descriptors.source(&mut |entries: &[(&str, &str)], own: Option<u32>| {
        out.push(DESCRIPTORS);
        put_varint(&mut out, descriptor_len(entries, own));
        for &(key, value) in entries {
            out.push(ENTRIES);
            put_varint(&mut out, entry_len((key, value)));
            put_string(&mut out, ENTRY_KEY, key);
            put_string(&mut out, ENTRY_VALUE, value);
        }
        if let Some(h) = own {
            let h = h as usize;
            out.push(DESCRIPTOR_HITS);
            put_varint(&mut out, 1 + varint_len(h));
            out.push(UINT64_VALUE);
            put_varint(&mut out, h);
        }
    });
    if hits != 0 {
        out.push(HITS_ADDEND);
        put_varint(&mut out, hits);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn request_encodes_byte_for_byte() {
        let req = RateLimitRequest {
            domain: "d".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![
                    Entry {
                        key: "generic_key".into(),
                        value: "per_hour".into(),
                    },
                    Entry {
                        key: "tenant".into(),
                        value: "a".into(),
                    },
                ],
                hits_addend: None,
            }],
            hits_addend: 0,
        };
        let mut expected = vec![0x0a, 0x01, b'd', 0x12, 0x26];
        // descriptor: entries (field 1) twice
        expected.extend([0x0a, 0x17, 0x0a, 0x0b]);
        expected.extend(b"generic_key");
        expected.extend([0x12, 0x08]);
        expected.extend(b"per_hour");
        expected.extend([0x0a, 0x0b, 0x0a, 0x06]);
        expected.extend(b"tenant");
        expected.extend([0x12, 0x01, b'a']);
        assert_eq!(req.encode_to_vec(), expected);
    }

    #[test]
    fn response_decodes_from_wire_bytes() {
        // overall_code OVER_LIMIT; one status: code OVER_LIMIT,
        // current_limit {requests_per_unit 100, unit HOUR, name "n"},
        // limit_remaining 0 (default, absent), duration_until_reset {seconds 42, nanos 5},
        // then an unknown field 7 (quota) that must be skipped.
        let bytes = [
            0x08, 0x02, // overall_code = 2
            0x12, 0x13, // statuses, 19 bytes
            0x08, 0x02, // code = 2
            0x12, 0x07, 0x1a, 0x01, b'n', 0x08, 0x64, 0x10, 0x03, // current_limit
            0x22, 0x04, 0x08, 0x2a, 0x10, 0x05, // duration_until_reset
            0x18, 0x00, // limit_remaining = 0, explicitly
            0x3a, 0x00, // quota (unknown here), empty
        ];
        let r = RateLimitResponse::decode(&bytes[..]).unwrap();
        assert_eq!(r.overall_code(), Code::OverLimit);
        assert_eq!(r.statuses.len(), 1);
        let s = &r.statuses[0];
        assert_eq!(s.code(), Code::OverLimit);
        let limit = s.current_limit.as_ref().unwrap();
        assert_eq!(limit.requests_per_unit, 100);
        assert_eq!(limit.unit, RateLimitUnit::Hour as i32);
        assert_eq!(limit.name, "n");
        assert_eq!(s.limit_remaining, 0);
        assert_eq!(s.reset_seconds(), 42);
        assert_eq!(s.reset_seconds_ceil(), 43);
    }

    proptest::proptest! {
        /// The borrowed encoder gives prost's bytes for the owned message,
        /// empty strings and long (multi-byte length) ones included.
        #[test]
        fn borrowed_request_encodes_as_the_owned_one(
            domain in "[a-z]{0,3}|.{0,200}",
            descriptors in proptest::collection::vec(
                proptest::collection::vec(("[a-z_]{0,12}", ".{0,160}"), 0..3),
                0..5,
            ),
            hits_addend in proptest::prop_oneof![proptest::strategy::Just(0u32), proptest::prelude::any::<u32>()],
        ) {
            let owned = RateLimitRequest {
                domain: domain.clone(),
                descriptors: descriptors
                    .iter()
                    .map(|entries| RateLimitDescriptor {
                        entries: entries
                            .iter()
                            .map(|(k, v)| Entry { key: k.clone(), value: v.clone() })
                            .collect(),
                        hits_addend: None,
                    })
                    .collect(),
                hits_addend,
            };
            let borrowed: Vec<Vec<(&str, &str)>> = descriptors
                .iter()
                .map(|entries| entries.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect())
                .collect();
            let bytes = encode_rate_limit_request(&domain, hits_addend, || borrowed.iter());
            proptest::prop_assert_eq!(bytes.len(), bytes.capacity());
            proptest::prop_assert_eq!(bytes, owned.encode_to_vec());
        }

        /// A batch's descriptors carry their own hits (left out for 1), in
        /// prost's bytes for the owned message.
        #[test]
        fn a_batch_request_encodes_each_descriptors_hits(
            descriptors in proptest::collection::vec(
                (proptest::collection::vec(("[a-z_]{1,12}", ".{0,40}"), 1..3), 1u32..),
                1..8,
            ),
        ) {
            let owned = RateLimitRequest {
                domain: "d".into(),
                descriptors: descriptors
                    .iter()
                    .map(|(entries, hits)| RateLimitDescriptor {
                        entries: entries
                            .iter()
                            .map(|(k, v)| Entry { key: k.clone(), value: v.clone() })
                            .collect(),
                        hits_addend: (*hits != 1).then_some(UInt64Value { value: u64::from(*hits) }),
                    })
                    .collect(),
                hits_addend: 0,
            };
            let borrowed: Vec<(Vec<(&str, &str)>, u32)> = descriptors
                .iter()
                .map(|(entries, hits)| {
                    (entries.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect(), *hits)
                })
                .collect();
            let bytes = encode_batch_request("d", || borrowed.iter().map(|(d, h)| (d, *h)));
            proptest::prop_assert_eq!(bytes.len(), bytes.capacity());
            proptest::prop_assert_eq!(bytes, owned.encode_to_vec());
        }
    }

    #[test]
    fn headers_to_add_decode_from_wire_bytes() {
        // overall_code OK; response_headers_to_add {key "a", value "1"};
        // request_headers_to_add {key "b", raw_value "2"}: raw_value is
        // skipped, as Envoy's filter skips it.
        let bytes = [
            0x08, 0x01, 0x1a, 0x06, 0x0a, 0x01, b'a', 0x12, 0x01, b'1', 0x22, 0x06, 0x0a, 0x01,
            b'b', 0x1a, 0x01, b'2',
        ];
        let r = RateLimitResponse::decode(&bytes[..]).unwrap();
        assert_eq!(r.overall_code(), Code::Ok);
        assert_eq!(r.response_headers_to_add.len(), 1);
        assert_eq!(r.response_headers_to_add[0].key, "a");
        assert_eq!(r.response_headers_to_add[0].value, "1");
        assert_eq!(r.request_headers_to_add[0].key, "b");
        assert_eq!(r.request_headers_to_add[0].value, "");
    }

    #[test]
    fn garbage_does_not_decode() {
        assert!(RateLimitResponse::decode(&[0x12, 0x05, 0x08][..]).is_err());
    }

    #[test]
    fn unknown_codes_read_as_unknown() {
        let r = RateLimitResponse {
            overall_code: 9,
            ..RateLimitResponse::default()
        };
        assert_eq!(r.overall_code(), Code::Unknown);
    }

    #[test]
    fn upstream_is_a_serialized_grpc_service() {
        let up = grpc_upstream("ratelimit");
        let mut expected = vec![0x0a, 0x0b, 0x0a, 0x09];
        expected.extend(b"ratelimit");
        assert_eq!(up.as_bytes(), expected);
        let long = "c".repeat(200);
        assert_eq!(grpc_upstream(&long), long);
        // The bytes prost writes, whatever the name.
        for name in ["", "r", &"n".repeat(125), "ratelimit_cluster.v2"] {
            let owned = GrpcService {
                envoy_grpc: Some(EnvoyGrpc {
                    cluster_name: name.to_string(),
                }),
            }
            .encode_to_vec();
            assert_eq!(grpc_upstream(name).as_bytes(), owned, "{name}");
        }
    }
}

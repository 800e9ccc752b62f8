//! Target `slot`: the local layer's slot decoder over arbitrary stored
//! bytes (shared data is written by every worker and every VM of the
//! filter), the decode -> encode round trip, and what a request does with
//! whatever is stored (`admit`: claim, cached refusal, token bucket).
//!
//! Input: bytes 0..6 the clock in milliseconds (48 bits, up to the year
//! 10889), 6..10 and 10..14 the bucket's rate and burst, byte 14 chooses
//! (bit 0) no bucket, (bit 1) `headers: "off"`, (bit 2) nothing stored,
//! (bit 3) a tenant other than the stored one; the rest is the stored value.
//!
//! Checks: it never panics; only a value of exactly `SLOT_BYTES` decodes;
//! a decoded slot encodes to `SLOT_BYTES` bytes that decode to the same
//! slot (the stored bytes themselves need not come back: unused bytes and
//! unknown flag bits are dropped); a refusal carries a Retry-After of at
//! least one second; only a request that proceeds writes, it writes its
//! own tenant's slot, and what it writes decodes to itself.

use ratelimit_config::{BucketParams, HeaderMode};
use tenant_ratelimit::headers::RETRY_AFTER;
use tenant_ratelimit::local::{admit, LocalVerdict, Slot, SlotRef, SLOT_BYTES};

fn field<const N: usize>(data: &[u8], at: usize) -> [u8; N] {
    let mut b = [0u8; N];
    for (to, from) in b.iter_mut().zip(data.iter().skip(at)) {
        *to = *from;
    }
    b
}

fn round_trips(s: &Slot) {
    let bytes = s.encode();
    assert_eq!(bytes.len(), SLOT_BYTES);
    assert_eq!(bytes.as_slice(), s.encode_fixed().as_slice());
    assert_eq!(Slot::decode(&bytes).as_ref(), Some(s));
}

fn retry_after_at_least_one(headers: &[(&str, String)]) {
    let retry = headers.last().filter(|(name, _)| *name == RETRY_AFTER);
    assert!(
        retry.is_some_and(|(_, v)| v.parse::<u64>().is_ok_and(|s| s >= 1)),
        "{headers:?}"
    );
}

pub fn check(data: &[u8]) {
    let [a, b, c, d, e, f] = field::<6>(data, 0);
    let now_ms = u64::from_le_bytes([a, b, c, d, e, f, 0, 0]);
    let params = BucketParams {
        tokens_per_second: u32::from_le_bytes(field(data, 6)),
        burst: u32::from_le_bytes(field(data, 10)),
    };
    let [flags] = field::<1>(data, 14);
    let stored = data.get(15..).unwrap_or_default();
    let decoded = Slot::decode(stored);
    if let Some(s) = &decoded {
        assert_eq!(stored.len(), SLOT_BYTES);
        round_trips(s);
    }
    let own = decoded.as_ref().map_or(0x5eed, |s| s.fingerprint);
    let at = SlotRef {
        index: 0,
        fingerprint: if flags & 8 == 0 { own } else { own ^ 1 },
    };
    let bucket = (flags & 1 == 0).then_some(params);
    let mode = if flags & 2 == 0 {
        HeaderMode::DraftVersion03
    } else {
        HeaderMode::Off
    };
    let stored = (flags & 4 == 0).then_some(stored);
    let (verdict, write) = admit(stored, at, now_ms, bucket, mode);
    match &verdict {
        LocalVerdict::Proceed => {}
        LocalVerdict::Contended => assert_ne!(Some(at.fingerprint), decoded.map(|s| s.fingerprint)),
        LocalVerdict::BucketEmpty(h) | LocalVerdict::CachedOverLimit(h) => {
            retry_after_at_least_one(h)
        }
    }
    if let Some(w) = write {
        assert_eq!(verdict, LocalVerdict::Proceed);
        assert_eq!(w.fingerprint, at.fingerprint);
        round_trips(&w);
    }
}

//! The rate-limit headers the filter writes, and the service's own headers
//! it forwards, all as pure functions of the service's answer.
//!
//! - `draft03_headers`: `X-RateLimit-*` as Envoy's own filter writes them
//!   with `DRAFT_VERSION_03`;
//! - `ietf_headers`: `RateLimit-Policy` and `RateLimit` of
//!   draft-ietf-httpapi-ratelimit-headers-10, RFC 9651 structured fields;
//! - `retry_after`: the seconds of `Retry-After`, only from what the
//!   service said (never guessed);
//! - `forwarded`: the service's `response_headers_to_add` and
//!   `request_headers_to_add`, bounded and sanitised.
//!
//! Every text that comes from the service (a rule name, a forwarded header)
//! is escaped or cleaned here before it reaches a header: a rule name with
//! CR LF in it must not become a header of its own.

use std::fmt::Write;

use ratelimit_config::{HeaderMode, UnitLimits};

use crate::proto::{Code, DescriptorStatus, HeaderValue, RateLimitUnit};

pub const X_RATELIMIT_LIMIT: &str = "x-ratelimit-limit";
pub const X_RATELIMIT_REMAINING: &str = "x-ratelimit-remaining";
pub const X_RATELIMIT_RESET: &str = "x-ratelimit-reset";
pub const RETRY_AFTER: &str = "retry-after";
pub const RATELIMIT_POLICY: &str = "ratelimit-policy";
pub const RATELIMIT: &str = "ratelimit";

/// A rule name longer than this (after cleaning) is cut here: it is the
/// service's text, written into every response.
pub const MAX_NAME_BYTES: usize = 128;

/// At most this many of the service's headers are forwarded, each way.
pub const MAX_FORWARDED_HEADERS: usize = 16;
/// A forwarded header whose name or value is longer is dropped.
pub const MAX_FORWARDED_NAME_BYTES: usize = 64;
pub const MAX_FORWARDED_VALUE_BYTES: usize = 1_024;
/// Forwarding stops once names and values reach this many bytes, each way.
pub const MAX_FORWARDED_BYTES: usize = 4_096;

/// The headers of a refusal or an admission, in the configured family.
pub fn limit_headers(
    mode: HeaderMode,
    statuses: &[DescriptorStatus],
) -> Vec<(&'static str, String)> {
    match mode {
        HeaderMode::DraftVersion03 => draft03_headers(statuses),
        HeaderMode::IetfDraft10 => ietf_headers(statuses),
        HeaderMode::Off => Vec::with_capacity(1),
    }
}

/// The descriptor with the fewest remaining requests (the first, on a tie)
/// among those with a limit, and that limit.
fn tightest(statuses: &[DescriptorStatus]) -> Option<(&DescriptorStatus, u32)> {
    let mut tightest: Option<(&DescriptorStatus, u32)> = None;
    for s in statuses {
        let Some(limit) = &s.current_limit else {
            continue;
        };
        if tightest.is_none_or(|(t, _)| s.limit_remaining < t.limit_remaining) {
            tightest = Some((s, limit.requests_per_unit));
        }
    }
    tightest
}

fn unit_of(s: &DescriptorStatus) -> RateLimitUnit {
    s.current_limit
        .as_ref()
        .and_then(|l| RateLimitUnit::try_from(l.unit).ok())
        .unwrap_or(RateLimitUnit::Unknown)
}

/// The X-RateLimit-* headers with Envoy's DRAFT_VERSION_03 semantics: the
/// descriptor with the fewest remaining requests (the first, on a tie) gives
/// the limit, remaining and reset; every descriptor with a known window adds
/// `<limit>;w=<seconds>` to the limit header, and `;name="<rule name>"` when
/// the rule has one (escaped as an RFC 9651 string).
pub fn draft03_headers(statuses: &[DescriptorStatus]) -> Vec<(&'static str, String)> {
    let Some((t, limit)) = tightest(statuses) else {
        return Vec::with_capacity(1);
    };
    // Written into one string (a write to a String cannot fail).
    let mut limits = String::with_capacity(64);
    let _ = write!(limits, "{limit}");
    for limit in statuses.iter().filter_map(|s| s.current_limit.as_ref()) {
        let unit = RateLimitUnit::try_from(limit.unit).unwrap_or(RateLimitUnit::Unknown);
        let window = unit.window_seconds();
        if window > 0 {
            let _ = write!(limits, ", {};w={}", limit.requests_per_unit, window);
            if limit.name.chars().any(|c| (' '..='~').contains(&c)) {
                limits.push_str(";name=");
                write_sf_string(&mut limits, &limit.name);
            }
        }
    }
    // Room for the Retry-After of a refusal.
    let mut headers = Vec::with_capacity(4);
    headers.push((X_RATELIMIT_LIMIT, limits));
    headers.push((X_RATELIMIT_REMAINING, t.limit_remaining.to_string()));
    headers.push((X_RATELIMIT_RESET, t.reset_seconds().to_string()));
    headers
}

/// The policy name of a window: the descriptor value the filter sends for
/// it (`per_second`, `per_minute`, `per_hour`, `per_day`, `per_week`), the same from
/// the service, the over-limit cache and the bucket.
fn policy_name(unit: RateLimitUnit) -> Option<&'static str> {
    match unit {
        RateLimitUnit::Second => Some("per_second"),
        RateLimitUnit::Minute => Some("per_minute"),
        RateLimitUnit::Hour => Some("per_hour"),
        RateLimitUnit::Day => Some("per_day"),
        RateLimitUnit::Week => Some("per_week"),
        _ => None,
    }
}

/// `RateLimit-Policy` and `RateLimit` of draft-ietf-httpapi-ratelimit-headers-10:
/// one quota policy item per window (`"per_minute";q=20;w=60`), and the
/// service limit of the tightest window (`"per_minute";r=2;t=37`), the one
/// X-RateLimit-* would describe. Both are RFC 9651 lists of items whose
/// value is a String.
pub fn ietf_headers(statuses: &[DescriptorStatus]) -> Vec<(&'static str, String)> {
    let Some((t, _)) = tightest(statuses) else {
        return Vec::with_capacity(1);
    };
    let mut policy = String::with_capacity(96);
    for s in statuses {
        let Some(limit) = &s.current_limit else {
            continue;
        };
        let unit = unit_of(s);
        if let Some(name) = policy_name(unit) {
            write_policy_item(
                &mut policy,
                name,
                limit.requests_per_unit,
                unit.window_seconds(),
            );
        }
    }
    let mut headers = Vec::with_capacity(3);
    if !policy.is_empty() {
        headers.push((RATELIMIT_POLICY, policy));
    }
    if let Some(name) = policy_name(unit_of(t)) {
        let mut limit = String::with_capacity(40);
        write_sf_string(&mut limit, name);
        let _ = write!(limit, ";r={};t={}", t.limit_remaining, t.reset_seconds());
        headers.push((RATELIMIT, limit));
    }
    headers
}

fn write_policy_item(out: &mut String, name: &str, quota: u32, window: u64) {
    if !out.is_empty() {
        out.push_str(", ");
    }
    write_sf_string(out, name);
    let _ = write!(out, ";q={quota};w={window}");
}

/// `RateLimit-Policy` for a group (or a route), from its configured limits:
/// what a bucket refusal carries in the IETF family (the bucket knows no
/// window, so no `RateLimit`). None in the other modes.
pub fn group_policy(mode: HeaderMode, limits: &UnitLimits) -> Option<(&'static str, String)> {
    if mode != HeaderMode::IetfDraft10 {
        return None;
    }
    let mut policy = String::with_capacity(96);
    for (unit, limit) in limits.iter() {
        // The windows the service's answers name: a custom window, a
        // month and a year are left out, as they are of an answer's.
        let unit = RateLimitUnit::from(unit);
        if let Some(name) = policy_name(unit) {
            write_policy_item(&mut policy, name, limit, unit.window_seconds());
        }
    }
    (!policy.is_empty()).then_some((RATELIMIT_POLICY, policy))
}

/// Writes `text` as an RFC 9651 String: in double quotes, `"` and `\`
/// escaped, and every character a String cannot hold (controls, CR, LF,
/// DEL, non-ASCII) left out; at most `MAX_NAME_BYTES` of it.
pub fn write_sf_string(out: &mut String, text: &str) {
    out.push('"');
    let mut written = 0;
    for c in text.chars() {
        if !(' '..='~').contains(&c) {
            continue;
        }
        if written == MAX_NAME_BYTES {
            break;
        }
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
        written += 1;
    }
    out.push('"');
}

/// Seconds a refused client should wait, from the service's statuses:
/// until every window it is over has reset (the longest of them), rounded
/// up, at least 1. None when no over-limit status says when its window
/// resets (a server that sends no statuses): then no guess.
pub fn retry_after(statuses: &[DescriptorStatus]) -> Option<u64> {
    statuses
        .iter()
        .filter(|s| s.code() == Code::OverLimit && s.duration_until_reset.is_some())
        .map(DescriptorStatus::reset_seconds_ceil)
        .max()
        .map(|s| s.max(1))
}

/// Retry-After from the service's own headers, when its statuses say
/// nothing: its `Retry-After`, else its `RateLimit-Reset` or
/// `X-RateLimit-Reset` (delay seconds, at least 1). None when it sent none
/// that is a number.
pub fn retry_after_from_headers(forwarded: &[(String, String)]) -> Option<u64> {
    let seconds = |name: &str| {
        forwarded
            .iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| delay_seconds(v))
    };
    seconds(RETRY_AFTER)
        .or_else(|| seconds("ratelimit-reset"))
        .or_else(|| seconds(X_RATELIMIT_RESET))
        .map(|s| s.max(1))
}

/// A delay in whole seconds: digits only (an HTTP date is not taken).
fn delay_seconds(v: &str) -> Option<u64> {
    if v.is_empty() || v.len() > 10 {
        return None;
    }
    v.bytes().try_fold(0u64, |n, b| {
        b.is_ascii_digit().then(|| n * 10 + u64::from(b - b'0'))
    })
}

/// Headers a forwarded header must not set: framing, hop-by-hop, routing.
const NOT_FORWARDED: [&str; 10] = [
    "connection",
    "content-length",
    "host",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "x-envoy-ratelimited",
];

/// RFC 9110 `tchar`.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// The header name, lowercase, if it is a token that may be forwarded.
fn forwardable_name(name: &str) -> Option<String> {
    if name.is_empty() || name.len() > MAX_FORWARDED_NAME_BYTES || !name.bytes().all(is_tchar) {
        return None;
    }
    let name = name.to_ascii_lowercase();
    (!NOT_FORWARDED.contains(&name.as_str())).then_some(name)
}

/// The header value without what a field value may not hold (controls
/// other than HTAB, CR, LF, NUL, DEL), trimmed; None if it is too long.
fn forwardable_value(value: &str) -> Option<String> {
    if value.len() > MAX_FORWARDED_VALUE_BYTES {
        return None;
    }
    // Only ASCII bytes are dropped, so what is left is still UTF-8.
    let mut clean = value.to_string();
    clean.retain(|c| c == '\t' || !(c < ' ' || c == '\u{7f}'));
    let trimmed = clean.trim_matches(|c| c == ' ' || c == '\t');
    Some(if trimmed.len() == clean.len() {
        clean
    } else {
        trimmed.to_string()
    })
}

/// The service's headers to forward: valid names, lowercased; values
/// cleaned; headers in `skip` (the ones the filter writes itself) and the
/// framing ones left out; at most `MAX_FORWARDED_HEADERS` and
/// `MAX_FORWARDED_BYTES`. Returns them and how many were dropped.
pub fn forwarded(headers: &[HeaderValue], skip: &[&str]) -> (Vec<(String, String)>, usize) {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut bytes = 0;
    let mut dropped = 0;
    for h in headers {
        let value = h.value.as_str();
        let kept = forwardable_name(&h.key)
            .filter(|n| !skip.contains(&n.as_str()))
            .zip(forwardable_value(value))
            .filter(|(n, v)| {
                out.len() < MAX_FORWARDED_HEADERS
                    && bytes + n.len() + v.len() <= MAX_FORWARDED_BYTES
            });
        match kept {
            Some((n, v)) => {
                bytes += n.len() + v.len();
                out.push((n, v));
            }
            None => dropped += 1,
        }
    }
    (out, dropped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{Duration, RateLimit};
    use crate::testing::status;
    use ratelimit_config::parse_plugin_config;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn named(mut s: DescriptorStatus, name: &str) -> DescriptorStatus {
        if let Some(l) = s.current_limit.as_mut() {
            l.name = name.to_string();
        }
        s
    }

    fn hv(k: &str, v: &str) -> HeaderValue {
        HeaderValue {
            key: k.into(),
            value: v.into(),
        }
    }

    fn three() -> Vec<DescriptorStatus> {
        vec![
            status(Code::Ok, 5, RateLimitUnit::Second, 4, 1),
            status(Code::Ok, 20, RateLimitUnit::Minute, 2, 37),
            status(Code::Ok, 30, RateLimitUnit::Hour, 2, 1800),
        ]
    }

    #[test]
    fn ietf_headers_list_every_window_and_the_tightest() {
        assert_eq!(
            ietf_headers(&three()),
            vec![
                (
                    RATELIMIT_POLICY,
                    r#""per_second";q=5;w=1, "per_minute";q=20;w=60, "per_hour";q=30;w=3600"#
                        .to_string()
                ),
                (RATELIMIT, r#""per_minute";r=2;t=37"#.to_string()),
            ]
        );
        // The same window X-RateLimit-* describes.
        let d = draft03_headers(&three());
        assert_eq!(d[0].1, "20, 5;w=1, 20;w=60, 30;w=3600");
        assert_eq!(d[1].1, "2");
        assert_eq!(d[2].1, "37");
        // Nothing to describe: nothing written.
        assert!(ietf_headers(&[]).is_empty());
        let no_limit = DescriptorStatus {
            code: Code::Ok as i32,
            ..DescriptorStatus::default()
        };
        assert!(ietf_headers(&[no_limit]).is_empty());
    }

    #[test]
    fn a_week_has_its_window_and_months_and_years_none() {
        let h = draft03_headers(&[
            status(Code::Ok, 9, RateLimitUnit::Month, 8, 100),
            status(Code::Ok, 7, RateLimitUnit::Week, 3, 100),
            status(Code::Ok, 99, RateLimitUnit::Year, 50, 100),
        ]);
        assert_eq!(h[0].1, "7, 7;w=604800");
        let h = ietf_headers(&[status(Code::Ok, 7, RateLimitUnit::Week, 3, 100)]);
        assert_eq!(h[0].1, r#""per_week";q=7;w=604800"#);
    }

    #[test]
    fn windows_the_draft_cannot_say_are_left_out_of_the_policy() {
        let month = status(Code::Ok, 9, RateLimitUnit::Month, 1, 100);
        let h = ietf_headers(&[
            month.clone(),
            status(Code::Ok, 5, RateLimitUnit::Second, 4, 1),
        ]);
        assert_eq!(h[0].1, r#""per_second";q=5;w=1"#);
        // The tightest is the month: it has no policy name, so no RateLimit.
        assert_eq!(h.len(), 1);
        assert!(ietf_headers(&[month]).is_empty());
    }

    #[test]
    fn sf_strings_escape_quotes_and_drop_what_a_string_cannot_hold() {
        let mut s = String::new();
        write_sf_string(&mut s, "a\"b\\c\r\nX-Injected: 1\u{0}\u{7f}é");
        assert_eq!(s, r#""a\"b\\cX-Injected: 1""#);
        let mut long = String::new();
        write_sf_string(&mut long, &"n".repeat(500));
        assert_eq!(long.len(), MAX_NAME_BYTES + 2);
    }

    #[test]
    fn hostile_rule_names_stay_inside_their_header() {
        let hostile = "evil\r\nx-injected: yes\r\n\"; q=\\";
        let statuses = vec![
            named(
                status(Code::OverLimit, 5, RateLimitUnit::Minute, 0, 20),
                hostile,
            ),
            named(status(Code::Ok, 9, RateLimitUnit::Hour, 3, 200), "\u{1}\n"),
        ];
        let h = draft03_headers(&statuses);
        assert_eq!(
            h[0].1,
            r#"5, 5;w=60;name="evilx-injected: yes\"; q=\\", 9;w=3600"#
        );
        for (_, v) in h.iter().chain(ietf_headers(&statuses).iter()) {
            assert!(v.bytes().all(|b| (0x20..0x7f).contains(&b)), "{v:?}");
        }
    }

    #[test]
    fn a_groups_policy_comes_from_its_limits_in_the_ietf_family_only() {
        let text = r#"{"domain": "d", "rate_limit_service": {"cluster": "c"},
            "limits": {"x-tenant-id": {"default": {"persecond": 5, "perhour": 30}}}}"#;
        let c = parse_plugin_config(text.as_bytes()).unwrap().0;
        let g = &c.limits.all_groups().next().unwrap().limits;
        assert_eq!(
            group_policy(HeaderMode::IetfDraft10, g),
            Some((
                RATELIMIT_POLICY,
                r#""per_second";q=5;w=1, "per_hour";q=30;w=3600"#.to_string()
            ))
        );
        assert_eq!(group_policy(HeaderMode::DraftVersion03, g), None);
        assert_eq!(group_policy(HeaderMode::Off, g), None);
    }

    /// The bucket's policy names the windows an answer names: a custom
    /// window, a month and a year are left out, as they are of the
    /// service's answers (their RLS unit is none or of no fixed length).
    #[test]
    fn a_bucket_policy_leaves_out_what_an_answer_leaves_out() {
        let text = r#"{"domain": "d", "rate_limit_service": {"cluster": "c", "service": "counter"},
            "limits": {"x-tenant-id": {"default": {"perminute": 50, "per5minutes": 100,
                "perweek": 900, "permonth": 1000, "peryear": 5000}}}}"#;
        let c = parse_plugin_config(text.as_bytes()).unwrap().0;
        let g = &c.limits.all_groups().next().unwrap().limits;
        assert_eq!(
            group_policy(HeaderMode::IetfDraft10, g),
            Some((
                RATELIMIT_POLICY,
                r#""per_minute";q=50;w=60, "per_week";q=900;w=604800"#.to_string()
            ))
        );
        // The counter's answer for the same windows gives the same policy.
        let statuses = [
            status(Code::Ok, 50, RateLimitUnit::Minute, 49, 30),
            status(Code::Ok, 100, RateLimitUnit::Unknown, 99, 200),
            status(Code::Ok, 900, RateLimitUnit::Week, 899, 9_000),
            status(Code::Ok, 1000, RateLimitUnit::Month, 999, 90_000),
            status(Code::Ok, 5000, RateLimitUnit::Year, 4999, 900_000),
        ];
        let h = ietf_headers(&statuses);
        assert_eq!(h[0], group_policy(HeaderMode::IetfDraft10, g).unwrap());
        // The tightest is a minute here: its reset, never 0.
        assert_eq!(h[1].1, r#""per_minute";r=49;t=30"#);
        let d = draft03_headers(&statuses);
        assert_eq!(d[0].1, "50, 50;w=60, 900;w=604800");
        assert_eq!(d[2].1, "30");
    }

    #[test]
    fn retry_after_comes_only_from_what_the_service_said() {
        assert_eq!(
            retry_after(&[status(Code::OverLimit, 5, RateLimitUnit::Second, 0, 0)]),
            Some(1)
        );
        assert_eq!(retry_after(&[]), None);
        // An over-limit status without a reset says nothing either.
        let mut bare = status(Code::OverLimit, 5, RateLimitUnit::Minute, 0, 0);
        bare.duration_until_reset = None;
        assert_eq!(retry_after(&[bare]), None);
        let mut half = status(Code::OverLimit, 5, RateLimitUnit::Minute, 0, 54);
        half.duration_until_reset = Some(Duration {
            seconds: 54,
            nanos: 1,
        });
        assert_eq!(retry_after(&[half]), Some(55));
        let h = |k: &str, v: &str| vec![(k.to_string(), v.to_string())];
        assert_eq!(retry_after_from_headers(&h("retry-after", "57")), Some(57));
        assert_eq!(
            retry_after_from_headers(&h("ratelimit-reset", "0")),
            Some(1)
        );
        assert_eq!(
            retry_after_from_headers(&h("x-ratelimit-reset", "9")),
            Some(9)
        );
        assert_eq!(
            retry_after_from_headers(&h("retry-after", "Wed, 21 Oct 2015 07:28:00 GMT")),
            None
        );
        assert_eq!(retry_after_from_headers(&h("ratelimit-limit", "5")), None);
        assert_eq!(retry_after_from_headers(&[]), None);
    }

    #[test]
    fn forwarded_headers_are_cleaned_and_bounded() {
        let (out, dropped) = forwarded(
            &[
                hv("RateLimit-Limit", "10"),
                hv("X-Note", " a\r\nb\u{0}c\td "),
                hv("bad name", "x"),
                hv("", "x"),
                hv(":status", "200"),
                hv("Content-Length", "0"),
                hv("x-ratelimit-limit", "mine"),
                hv("x-long", &"v".repeat(MAX_FORWARDED_VALUE_BYTES + 1)),
            ],
            &[X_RATELIMIT_LIMIT],
        );
        assert_eq!(
            out,
            vec![
                ("ratelimit-limit".to_string(), "10".to_string()),
                ("x-note".to_string(), "abc\td".to_string()),
            ]
        );
        assert_eq!(dropped, 6);
        let many: Vec<HeaderValue> = (0..40).map(|i| hv(&format!("x-{i}"), "v")).collect();
        let (out, dropped) = forwarded(&many, &[]);
        assert_eq!(
            (out.len(), dropped),
            (MAX_FORWARDED_HEADERS, 40 - MAX_FORWARDED_HEADERS)
        );
        let big: Vec<HeaderValue> = (0..10)
            .map(|i| hv(&format!("x-{i}"), &"v".repeat(1_000)))
            .collect();
        let (out, _) = forwarded(&big, &[]);
        assert_eq!(out.len(), 4);
        assert!(out.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>() <= MAX_FORWARDED_BYTES);
    }

    proptest::proptest! {
        #[test]
        fn any_name_or_header_gives_printable_single_line_values(
            name in ".{0,300}",
            key in ".{0,80}",
            value in ".{0,300}",
        ) {
            let s = DescriptorStatus {
                code: Code::OverLimit as i32,
                current_limit: Some(RateLimit { name: name.clone(), requests_per_unit: 3, unit: RateLimitUnit::Hour as i32 }),
                limit_remaining: 0,
                duration_until_reset: Some(Duration { seconds: 9, nanos: 0 }),
            };
            for (_, v) in draft03_headers(std::slice::from_ref(&s)).iter().chain(ietf_headers(&[s]).iter()) {
                proptest::prop_assert!(v.bytes().all(|b| (0x20..0x7f).contains(&b)));
            }
            for (k, v) in forwarded(&[hv(&key, &value)], &[]).0 {
                proptest::prop_assert!(k.bytes().all(is_tchar));
                proptest::prop_assert!(!v.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0));
            }
        }
    }
}

//! Which rule the service applies to a descriptor: entry by entry,
//! `key_value`, then the level's wildcard rules in file order, then the bare
//! `key`; only a rule reached by the last entry applies.

use super::service::Rule;

/// envoyproxy/ratelimit's wildcard match: each `*` matches any run of
/// characters.
pub(super) fn wildcard_match(pattern: &str, value: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    let (Some(first), Some(last)) = (parts.first(), parts.last()) else {
        return false;
    };
    if parts.len() == 1 {
        return pattern == value;
    }
    let fixed: usize = parts.iter().map(|p| p.len()).sum();
    if value.len() < fixed || !value.starts_with(first) || !value.ends_with(last) {
        return false;
    }
    let mut rest = value
        .get(first.len()..value.len() - last.len())
        .unwrap_or("");
    for part in parts.iter().skip(1).take(parts.len().saturating_sub(2)) {
        match rest.find(part) {
            Some(i) => rest = rest.get(i + part.len()..).unwrap_or(""),
            None => return false,
        }
    }
    true
}

/// The rule whose limit the service applies to `entries`, and the path of
/// rules the walk went through.
pub fn lookup<'a>(
    roots: &'a [Rule],
    entries: &[(&str, &str)],
) -> (Option<&'a Rule>, Vec<&'a Rule>) {
    let mut level = roots;
    let mut walked = Vec::new();
    let mut found = None;
    for (i, (key, value)) in entries.iter().enumerate() {
        let composite = format!("{key}_{value}");
        let next = level
            .iter()
            .find(|r| r.composite == composite)
            .or_else(|| {
                level
                    .iter()
                    .filter(|r| r.composite.contains('*'))
                    .find(|r| wildcard_match(&r.composite, &composite))
            })
            .or_else(|| level.iter().find(|r| r.composite == *key));
        let Some(rule) = next else { break };
        walked.push(rule);
        if rule.limit.is_some() && i + 1 == entries.len() {
            found = Some(rule);
        }
        if rule.children.is_empty() {
            break;
        }
        level = &rule.children;
    }
    (found, walked)
}

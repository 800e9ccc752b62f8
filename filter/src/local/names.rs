//! The rule names of cached refusals (the service's `;name="..."`), in a
//! small fixed table in shared data: `NAME_ENTRIES` keys `trl.name.<i>`,
//! created zeroed at configure, each holding one name. A slot keeps only a
//! one-byte id per status (0: no name), so the slot stays 116 bytes and the
//! names cost `NAME_ENTRIES` × `NAME_VALUE_BYTES` per Envoy, whatever the
//! number of tenants.
//!
//! Names come from the service's configuration, not from clients: a handful
//! per group. A name is placed at its hash and, when that entry holds
//! another name, at the next free one. An entry is written once, under the
//! CAS token of the read that found it empty, so two workers never put two
//! names in one entry. When every entry holds another name (a service
//! configuration with more named rules than entries), a new name is left
//! out of the cached refusals (the service's own refusals still carry it).
//! Entries are never freed: a renamed rule keeps its old entry until Envoy
//! restarts.

use crate::host::{SharedData, SharedDataError};

/// How many names the table holds.
pub const NAME_ENTRIES: u8 = 32;
/// Every entry's value: a length byte and up to 127 bytes of name.
pub const NAME_VALUE_BYTES: usize = 128;
/// The longest name kept (printable ASCII): a longer one is left out, not
/// cut (a wrong name is worse than none).
pub const MAX_KEPT_NAME: usize = NAME_VALUE_BYTES - 1;

/// The shared-data key of entry `i`.
pub fn name_key(i: u8) -> String {
    format!("trl.name.{i}")
}

/// A rule name as the table keeps it: the characters a header's quoted
/// string can hold (printable ASCII); None when nothing is left or it is
/// longer than `MAX_KEPT_NAME`.
pub fn kept_name(name: &str) -> Option<String> {
    let clean: String = name.chars().filter(|c| (' '..='~').contains(c)).collect();
    (!clean.is_empty() && clean.len() <= MAX_KEPT_NAME).then_some(clean)
}

fn encode(name: &str) -> [u8; NAME_VALUE_BYTES] {
    let mut v = [0u8; NAME_VALUE_BYTES];
    let bytes = name.as_bytes();
    let n = bytes.len().min(MAX_KEPT_NAME);
    v[0] = n as u8;
    if let (Some(dst), Some(src)) = (v.get_mut(1..=n), bytes.get(..n)) {
        dst.copy_from_slice(src);
    }
    v
}

/// The name an entry holds; None for an empty (zeroed) or unreadable one.
fn decode(v: &[u8]) -> Option<&str> {
    if v.len() != NAME_VALUE_BYTES {
        return None;
    }
    let n = usize::from(*v.first()?);
    let bytes = v.get(1..=n)?;
    if n == 0 || !bytes.iter().all(|b| (0x20..0x7f).contains(b)) {
        return None;
    }
    std::str::from_utf8(bytes).ok()
}

/// FNV-1a: names are the service's, not chosen by clients.
fn home(name: &str) -> u8 {
    let mut h: u32 = 0x811c_9dc5;
    for b in name.bytes() {
        h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    (h % u32::from(NAME_ENTRIES)) as u8
}

/// The id of `name` in the table (entry index + 1), storing it if it is
/// not there yet; 0 when it cannot be kept (not a name `kept_name` keeps,
/// the table is full, or shared data fails).
pub fn intern<S: SharedData + ?Sized>(shared: &S, name: &str) -> u8 {
    let Some(name) = kept_name(name) else {
        return 0;
    };
    let start = home(&name);
    for probe in 0..NAME_ENTRIES {
        let i = (start + probe) % NAME_ENTRIES;
        let key = name_key(i);
        // Twice: a lost race re-reads the entry the winner wrote.
        for _ in 0..2 {
            let (stored, cas) = match shared.get_shared(&key) {
                Ok(read) => read,
                Err(e) => {
                    log::debug!("rule-name table: {e}");
                    return 0;
                }
            };
            // Only entries created at configure: a CAS on a key that does
            // not exist always writes, so two workers could both win.
            let (Some(stored), Some(cas)) = (stored, cas) else {
                break;
            };
            match decode(&stored) {
                Some(held) if held == name => return i + 1,
                Some(_) => break,
                None => match shared.set_shared(&key, &encode(&name), Some(cas)) {
                    Ok(()) => return i + 1,
                    Err(SharedDataError::CasMismatch) => continue,
                    Err(SharedDataError::Host(e)) => {
                        log::debug!("rule-name table: {e}");
                        return 0;
                    }
                },
            }
        }
    }
    0
}

/// The name with this id (from `intern`), if the table has it.
pub fn lookup<S: SharedData + ?Sized>(shared: &S, id: u8) -> Option<String> {
    if id == 0 || id > NAME_ENTRIES {
        return None;
    }
    match shared.get_shared(&name_key(id - 1)) {
        Ok((stored, _)) => decode(&stored?).map(str::to_string),
        Err(e) => {
            log::debug!("rule-name table: {e}");
            None
        }
    }
}

/// A zeroed entry, as the glue creates them at configure.
pub fn empty_entry() -> [u8; NAME_VALUE_BYTES] {
    [0u8; NAME_VALUE_BYTES]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::HostCall;
    use crate::testing::MemHost;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn table() -> MemHost {
        let h = MemHost::new();
        h.create_slots(1);
        h
    }

    #[test]
    fn a_name_gets_one_id_and_reads_back_cleaned() {
        let h = table();
        let id = intern(&h, "per-minute \"gold\"\r\nx-injected: 1");
        assert_ne!(id, 0);
        assert_eq!(intern(&h, "per-minute \"gold\"x-injected: 1"), id);
        assert_eq!(
            lookup(&h, id).as_deref(),
            Some("per-minute \"gold\"x-injected: 1")
        );
        let other = intern(&h, "daily");
        assert!(other != 0 && other != id);
        assert_eq!(lookup(&h, other).as_deref(), Some("daily"));
        assert_eq!(lookup(&h, 0), None);
        assert_eq!(lookup(&h, NAME_ENTRIES + 1), None);
    }

    #[test]
    fn names_that_cannot_be_kept_get_no_id() {
        let h = table();
        assert_eq!(intern(&h, ""), 0);
        assert_eq!(intern(&h, "\r\n\u{1}é"), 0);
        assert_eq!(intern(&h, &"n".repeat(MAX_KEPT_NAME + 1)), 0);
        let longest = "n".repeat(MAX_KEPT_NAME);
        let id = intern(&h, &longest);
        assert_eq!(lookup(&h, id), Some(longest));
        // Without the table (no entries created): nothing, never a guess.
        assert_eq!(intern(&MemHost::new(), "daily"), 0);
        h.fail(HostCall::GetShared);
        assert_eq!(intern(&h, "other"), 0);
        assert_eq!(lookup(&h, id), None);
    }

    #[test]
    fn a_full_table_keeps_the_names_it_has_and_refuses_new_ones() {
        let h = table();
        let ids: Vec<u8> = (0..NAME_ENTRIES)
            .map(|i| intern(&h, &format!("rule-{i}")))
            .collect();
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), usize::from(NAME_ENTRIES));
        assert!(!sorted.contains(&0));
        assert_eq!(intern(&h, "one-too-many"), 0);
        for (i, id) in ids.iter().enumerate() {
            assert_eq!(lookup(&h, *id), Some(format!("rule-{i}")));
        }
    }

    #[test]
    fn a_lost_race_takes_the_winners_entry_or_the_next() {
        let h = table();
        let home_key = name_key(home("daily"));
        // Another worker writes "daily" between our read and our write.
        h.interfere(1, |_| encode("daily").to_vec());
        let id = intern(&h, "daily");
        assert_eq!(name_key(id - 1), home_key);
        // Another worker writes another name there: we move on.
        let h = table();
        h.interfere(1, |_| encode("weekly").to_vec());
        let id = intern(&h, "daily");
        assert_ne!(name_key(id - 1), home_key);
        assert_eq!(lookup(&h, id).as_deref(), Some("daily"));
    }
}

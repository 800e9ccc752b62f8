//! The team files the counter serves, read with the library that
//! `ratelimit-config validate --service counter` runs, and read again when
//! they change. A file that fails keeps its domain's last good version.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use ratelimit_config::team_file::check_team_file_for;
use ratelimit_config::Service;

use crate::decide::Domain;
use crate::metrics::Metrics;

pub struct Source {
    pub path: PathBuf,
    pub domain: Option<String>,
    pub descriptor_key: String,
}

#[derive(Default)]
pub struct Teams {
    domains: RwLock<Arc<HashMap<String, Arc<Domain>>>>,
    /// The text last read of each file, to read again only what changed.
    seen: Mutex<HashMap<PathBuf, String>>,
}

/// The files of `source` and their domains.
fn files(source: &Source) -> Vec<(String, PathBuf)> {
    let stem = |p: &Path| {
        p.file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    if source.path.is_dir() {
        let mut out: Vec<(String, PathBuf)> = std::fs::read_dir(&source.path)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                let name = p
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                // A mounted ConfigMap's ..data and its timestamped folders.
                !name.starts_with('.') && name.ends_with(".json")
            })
            .map(|p| (stem(&p), p))
            .collect();
        out.sort();
        out
    } else {
        let domain = source.domain.clone().unwrap_or_else(|| stem(&source.path));
        vec![(domain, source.path.clone())]
    }
}

impl Teams {
    pub fn get(&self, domain: &str) -> Option<Arc<Domain>> {
        self.domains
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(domain)
            .cloned()
    }

    /// Whether any team file is loaded.
    pub fn loaded(&self) -> bool {
        !self
            .domains
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_empty()
    }

    /// Reads every file that changed since the last call.
    pub fn reload(&self, source: &Source, metrics: &Metrics) {
        let current = self
            .domains
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let mut next: HashMap<String, Arc<Domain>> = HashMap::new();
        let mut changed = false;
        let mut seen = self
            .seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let listed = files(source);
        for (domain, path) in &listed {
            let text = match std::fs::read_to_string(path) {
                Ok(t) => t,
                Err(e) => {
                    if seen.get(path).is_none_or(|t| !t.is_empty()) {
                        eprintln!("ratelimit-counter: {}: cannot read: {e}; keeping the last good team file of domain {domain:?}", path.display());
                        metrics.reload(domain, "failed");
                        seen.insert(path.clone(), String::new());
                    }
                    if let Some(d) = current.get(domain) {
                        next.insert(domain.clone(), d.clone());
                    }
                    continue;
                }
            };
            if seen.get(path) == Some(&text) {
                if let Some(d) = current.get(domain) {
                    next.insert(domain.clone(), d.clone());
                }
                continue;
            }
            seen.insert(path.clone(), text.clone());
            let shown = path.display().to_string();
            let report = check_team_file_for(&shown, &text, Service::Counter);
            match report.parsed {
                Some((_, limits)) => {
                    eprintln!("ratelimit-counter: loaded domain {domain:?} from {shown}");
                    metrics.reload(domain, "ok");
                    changed = true;
                    next.insert(
                        domain.clone(),
                        Arc::new(Domain {
                            limits,
                            descriptor_key: source.descriptor_key.clone(),
                        }),
                    );
                }
                None => {
                    for f in &report.findings {
                        eprintln!("ratelimit-counter: {f}");
                    }
                    eprintln!("ratelimit-counter: {shown} has errors; keeping the last good team file of domain {domain:?}");
                    metrics.reload(domain, "failed");
                    if let Some(d) = current.get(domain) {
                        next.insert(domain.clone(), d.clone());
                    }
                }
            }
        }
        // A file removed from a directory: its domain is kept too (a
        // ConfigMap update swaps files in one step; losing a domain's limits
        // by accident is worse than keeping them).
        for (domain, d) in current.iter() {
            if !next.contains_key(domain) {
                next.insert(domain.clone(), d.clone());
            }
        }
        if changed {
            *self
                .domains
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(next);
        }
    }
}

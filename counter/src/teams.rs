//! The team files the counter serves, read with the library that
//! `ratelimit-config validate --service counter` runs, and read again when
//! they change. A file that fails keeps its domain's last good version; at
//! start there is no last good version, and [`Teams::load_at_start`] says
//! why nothing could be served.

use std::collections::{BTreeMap, HashMap};
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

/// One domain as served: its limits, and its groups' names by their index
/// in `all_groups()` (the index a request's `Outcome` carries).
pub struct Served {
    pub domain: Domain,
    group_names: Box<[String]>,
}

impl Served {
    fn new(domain: Domain) -> Served {
        let group_names = domain.limits.all_groups().map(|g| g.name.clone()).collect();
        Served {
            domain,
            group_names,
        }
    }

    /// The name of the group at `index` ("" for an index it has not).
    pub fn group_name(&self, index: usize) -> &str {
        self.group_names.get(index).map_or("", String::as_str)
    }
}

#[derive(Default)]
pub struct Teams {
    domains: RwLock<Arc<HashMap<String, Arc<Served>>>>,
    /// The text last read of each file, to read again only what changed.
    seen: Mutex<HashMap<PathBuf, String>>,
    /// What is wrong with each file (or the directory) that is not served
    /// as it is now; cleared once it loads.
    problems: Mutex<BTreeMap<PathBuf, String>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
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
    pub fn get(&self, domain: &str) -> Option<Arc<Served>> {
        self.domains
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(domain)
            .cloned()
    }

    /// The first read, at start: an error, saying why, unless at least one
    /// team file is served (a missing or unreadable path, a directory with
    /// no team file, or no file that parses). The counter does not start
    /// without limits: it would answer OK to every call.
    pub fn load_at_start(&self, source: &Source, metrics: &Metrics) -> Result<(), String> {
        let shown = source.path.display();
        let meta = std::fs::metadata(&source.path)
            .map_err(|e| format!("--limits {shown}: cannot read: {e}"))?;
        if meta.is_dir() {
            std::fs::read_dir(&source.path)
                .map_err(|e| format!("--limits {shown}: cannot list the directory: {e}"))?;
        }
        self.reload(source, metrics);
        match self.status() {
            Ok(_) => Ok(()),
            Err(why) => Err(format!("--limits {shown}: {why}")),
        }
    }

    /// What is served, or why nothing is (for `/readyz` and the start):
    /// the domains, and each file not served as it is now, with why.
    pub fn status(&self) -> Result<String, String> {
        let domains = self
            .domains
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let problems = lock(&self.problems);
        let problems = problems
            .iter()
            .map(|(p, why)| format!("{}: {why}", p.display()))
            .collect::<Vec<_>>()
            .join("; ");
        if domains.is_empty() {
            return Err(if problems.is_empty() {
                "no team file loaded".to_string()
            } else {
                format!("no team file loaded: {problems}")
            });
        }
        let mut names: Vec<&str> = domains.keys().map(String::as_str).collect();
        names.sort_unstable();
        let mut shown = format!("domains: {}", names.join(", "));
        if !problems.is_empty() {
            shown.push_str("; the last good version kept of: ");
            shown.push_str(&problems);
        }
        Ok(shown)
    }

    /// Reads every file that changed since the last call.
    pub fn reload(&self, source: &Source, metrics: &Metrics) {
        let current = self
            .domains
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let mut next: HashMap<String, Arc<Served>> = HashMap::new();
        let mut changed = false;
        let mut seen = lock(&self.seen);
        let mut problems = lock(&self.problems);
        let listed = files(source);
        if listed.is_empty() && source.path.is_dir() {
            if !problems.contains_key(&source.path) {
                eprintln!(
                    "ratelimit-counter: {}: no team file (NAME.json) in the directory",
                    source.path.display()
                );
            }
            problems.insert(
                source.path.clone(),
                "no team file (NAME.json) in the directory".to_string(),
            );
        } else {
            problems.remove(&source.path);
        }
        for (domain, path) in &listed {
            let text = match std::fs::read_to_string(path) {
                Ok(t) => t,
                Err(e) => {
                    if seen.get(path).is_none_or(|t| !t.is_empty()) {
                        eprintln!("ratelimit-counter: {}: cannot read: {e}; keeping the last good team file of domain {domain:?}", path.display());
                        metrics.reload(domain, "failed");
                        seen.insert(path.clone(), String::new());
                    }
                    problems.insert(path.clone(), format!("cannot read: {e}"));
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
                    problems.remove(path);
                    changed = true;
                    next.insert(
                        domain.clone(),
                        Arc::new(Served::new(Domain {
                            limits,
                            descriptor_key: source.descriptor_key.clone(),
                        })),
                    );
                }
                None => {
                    for f in &report.findings {
                        eprintln!("ratelimit-counter: {f}");
                    }
                    eprintln!("ratelimit-counter: {shown} has errors; keeping the last good team file of domain {domain:?}");
                    metrics.reload(domain, "failed");
                    let why = report
                        .findings
                        .iter()
                        .map(|f| format!("line {}, column {}: {}", f.at.line, f.at.column, f.error))
                        .collect::<Vec<_>>()
                        .join("; ");
                    problems.insert(path.clone(), format!("has errors: {why}"));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("trl-teams-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn source(path: PathBuf) -> Source {
        Source {
            path,
            domain: None,
            descriptor_key: "tenant".to_string(),
        }
    }

    #[test]
    fn nothing_to_serve_at_start_is_an_error_that_says_why() {
        let metrics = Metrics::default();
        let missing = dir("missing").join("nope");
        let e = Teams::default()
            .load_at_start(&source(missing.clone()), &metrics)
            .unwrap_err();
        assert!(
            e.starts_with(&format!("--limits {}: cannot read: ", missing.display())),
            "{e}"
        );

        let empty = dir("empty");
        let e = Teams::default()
            .load_at_start(&source(empty.clone()), &metrics)
            .unwrap_err();
        assert!(
            e.contains("no team file (NAME.json) in the directory"),
            "{e}"
        );

        let bad = dir("bad");
        std::fs::write(bad.join("d.json"), "{").unwrap();
        let e = Teams::default()
            .load_at_start(&source(bad.clone()), &metrics)
            .unwrap_err();
        assert!(e.contains("d.json: has errors: line "), "{e}");
    }

    #[test]
    fn a_good_file_beside_a_bad_one_starts_and_names_the_bad_one() {
        let metrics = Metrics::default();
        let d = dir("mixed");
        std::fs::write(d.join("bad.json"), "{").unwrap();
        std::fs::write(
            d.join("good.json"),
            r#"{"x-tenant-id": {"default": {"perhour": 5}, "gold": {"perhour": 9, "header_value": ["a"]}}}"#,
        )
        .unwrap();
        let teams = Teams::default();
        teams.load_at_start(&source(d.clone()), &metrics).unwrap();
        let status = teams.status().unwrap();
        assert!(
            status.starts_with("domains: good; the last good version kept of: "),
            "{status}"
        );
        assert!(status.contains("bad.json: has errors"), "{status}");
        let good = teams.get("good").unwrap();
        let names: Vec<&str> = (0..3).map(|i| good.group_name(i)).collect();
        assert_eq!(names, ["default", "gold", ""]);
    }
}

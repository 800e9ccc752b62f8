//! Output folders that `generate` and `render` own: each records what it
//! wrote there in a manifest ([`MANIFEST`]), so that a later run removes
//! the files it wrote before and no longer writes, says so file by file,
//! and never touches a file it did not write.
//!
//! The manifest keeps each file's name and a hash of what was written: a
//! file it no longer writes is removed only when it still holds those
//! bytes (one edited since is left, and said so). A file of a name it
//! writes that is not in the manifest is someone else's: nothing is
//! written then. A folder with no manifest (written before there was one)
//! is taken as it is: the files of the names written are replaced, no
//! other is removed.

use std::fmt;
use std::path::{Path, PathBuf};

/// The manifest's name in an output folder.
pub const MANIFEST: &str = ".ratelimit-config-written";

/// One file to write: its name in the folder and its text.
pub struct Output<'a> {
    pub name: &'a str,
    pub text: &'a str,
}

/// What a run did to one file, in the order done.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    Wrote(PathBuf),
    /// Written by an earlier run, no longer written: removed.
    Removed(PathBuf),
    /// Written by an earlier run, no longer written, but changed since:
    /// left as it is.
    KeptEdited(PathBuf),
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Change::Wrote(p) => write!(f, "wrote {}", p.display()),
            Change::Removed(p) => write!(
                f,
                "removed {}: an earlier run wrote it and this one does not",
                p.display()
            ),
            Change::KeptEdited(p) => write!(
                f,
                "left {}: an earlier run wrote it and this one does not, but it was edited since; remove it yourself if it is not needed",
                p.display()
            ),
        }
    }
}

/// Why nothing (or not everything) was written.
#[derive(Debug)]
pub enum OwnedError {
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Files of the names to write that this tool did not write.
    NotOurs(Vec<PathBuf>),
}

impl fmt::Display for OwnedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OwnedError::Io { path, source } => write!(f, "{}: {source}", path.display()),
            OwnedError::NotOurs(paths) => {
                for (i, p) in paths.iter().enumerate() {
                    if i > 0 {
                        f.write_str("\n")?;
                    }
                    write!(
                        f,
                        "{}: not written by ratelimit-config (not in {MANIFEST}): nothing written; move it away or choose another --out",
                        p.display()
                    )?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for OwnedError {}

/// FNV-1a, 64 bits: enough to tell an edited file from the one written
/// (nothing here is adversarial), and the same on every platform and
/// Rust version.
fn hash(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The manifest's entries: (name, hash of what was written).
fn read_manifest(text: &str) -> Vec<(String, u64)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (h, name) = l.split_once("  ")?;
            Some((name.to_string(), u64::from_str_radix(h, 16).ok()?))
        })
        .collect()
}

fn manifest_text(by: &str, files: &[Output<'_>]) -> String {
    let mut out = format!(
        "# What `ratelimit-config {by}` wrote in this folder: a later run removes those it no longer writes. Do not edit.\n"
    );
    for f in files {
        out.push_str(&format!("{:016x}  {}\n", hash(f.text.as_bytes()), f.name));
    }
    out
}

/// Writes `files` into `out` (created when missing), as the folder's owner:
/// see the module's documentation. `by` names the command in the manifest.
pub fn write_owned(out: &Path, files: &[Output<'_>], by: &str) -> Result<Vec<Change>, OwnedError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| OwnedError::Io { path, source }
    };
    std::fs::create_dir_all(out).map_err(io(out))?;
    let manifest_path = out.join(MANIFEST);
    let earlier = match std::fs::read_to_string(&manifest_path) {
        Ok(text) => Some(read_manifest(&text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(io(&manifest_path)(e)),
    };
    if let Some(earlier) = &earlier {
        let not_ours: Vec<PathBuf> = files
            .iter()
            .filter(|f| !earlier.iter().any(|(n, _)| n == f.name))
            .map(|f| out.join(f.name))
            .filter(|p| p.exists())
            .collect();
        if !not_ours.is_empty() {
            return Err(OwnedError::NotOurs(not_ours));
        }
    }
    let mut changes = Vec::new();
    for f in files {
        let path = out.join(f.name);
        std::fs::write(&path, f.text).map_err(io(&path))?;
        changes.push(Change::Wrote(path));
    }
    for (name, written) in earlier.unwrap_or_default() {
        if files.iter().any(|f| f.name == name) || name.contains(['/', '\\']) || name == MANIFEST {
            continue;
        }
        let path = out.join(&name);
        match std::fs::read(&path) {
            Ok(bytes) if hash(&bytes) == written => {
                std::fs::remove_file(&path).map_err(io(&path))?;
                changes.push(Change::Removed(path));
            }
            Ok(_) => changes.push(Change::KeptEdited(path)),
            // Already gone.
            Err(_) => {}
        }
    }
    std::fs::write(&manifest_path, manifest_text(by, files)).map_err(io(&manifest_path))?;
    Ok(changes)
}

// The files of a temporary directory: native only (the wasm32 runner
// gives the tests no such directory).
#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("owned-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn out<'a>(files: &[(&'a str, &'a str)]) -> Vec<Output<'a>> {
        files
            .iter()
            .map(|&(name, text)| Output { name, text })
            .collect()
    }

    #[test]
    fn a_later_run_removes_what_it_no_longer_writes_and_says_so() {
        let d = dir("later");
        write_owned(&d, &out(&[("a.yaml", "a"), ("b.yaml", "b")]), "generate").unwrap();
        std::fs::write(d.join("mine.txt"), "the user's").unwrap();
        let changes = write_owned(&d, &out(&[("a.yaml", "a2")]), "generate").unwrap();
        assert_eq!(
            changes,
            vec![
                Change::Wrote(d.join("a.yaml")),
                Change::Removed(d.join("b.yaml"))
            ]
        );
        assert!(!d.join("b.yaml").exists());
        assert_eq!(
            std::fs::read_to_string(d.join("mine.txt")).unwrap(),
            "the user's"
        );
        assert!(changes[1].to_string().starts_with("removed "));
    }

    #[test]
    fn an_edited_file_it_no_longer_writes_is_left_and_said_so() {
        let d = dir("edited");
        write_owned(&d, &out(&[("a.yaml", "a"), ("b.yaml", "b")]), "render").unwrap();
        std::fs::write(d.join("b.yaml"), "b, edited").unwrap();
        let changes = write_owned(&d, &out(&[("a.yaml", "a")]), "render").unwrap();
        assert_eq!(changes[1], Change::KeptEdited(d.join("b.yaml")));
        assert_eq!(
            std::fs::read_to_string(d.join("b.yaml")).unwrap(),
            "b, edited"
        );
        // Said once: the manifest no longer lists it.
        let again = write_owned(&d, &out(&[("a.yaml", "a")]), "render").unwrap();
        assert_eq!(again, vec![Change::Wrote(d.join("a.yaml"))]);
    }

    #[test]
    fn a_file_it_did_not_write_is_never_replaced() {
        let d = dir("theirs");
        write_owned(&d, &out(&[("a.yaml", "a")]), "render").unwrap();
        std::fs::write(d.join("b.yaml"), "theirs").unwrap();
        let e = write_owned(&d, &out(&[("a.yaml", "a2"), ("b.yaml", "b")]), "render").unwrap_err();
        assert!(
            matches!(&e, OwnedError::NotOurs(p) if p == &vec![d.join("b.yaml")]),
            "{e}"
        );
        assert_eq!(std::fs::read_to_string(d.join("b.yaml")).unwrap(), "theirs");
        assert_eq!(std::fs::read_to_string(d.join("a.yaml")).unwrap(), "a");
    }

    #[test]
    fn a_folder_without_a_manifest_has_its_files_replaced_and_none_removed() {
        let d = dir("legacy");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("a.yaml"), "old").unwrap();
        std::fs::write(d.join("c.yaml"), "old").unwrap();
        let changes = write_owned(&d, &out(&[("a.yaml", "new")]), "render").unwrap();
        assert_eq!(changes, vec![Change::Wrote(d.join("a.yaml"))]);
        assert!(d.join("c.yaml").exists());
        assert!(std::fs::read_to_string(d.join(MANIFEST))
            .unwrap()
            .ends_with("  a.yaml\n"));
    }
}

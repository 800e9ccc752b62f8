//! `trim-exports --keep NAME,NAME,... FILE.wasm`
//!
//! The proxy-wasm Rust SDK exports every callback of the ABI
//! (`proxy_on_log`, `proxy_on_response_body`, ...), whether the filter
//! implements it or not, and Envoy calls every exported callback on every
//! stream: each call is a crossing into the VM that does nothing. Envoy
//! skips a callback the module does not export, so this tool removes every
//! exported function not named in `--keep` (memory and other exports stay),
//! drops the code only they reached, and rewrites FILE in place.
//!
//! It fails when a name in `--keep` is not exported, so a renamed callback
//! cannot go unnoticed; running it twice changes nothing.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::ExitCode;

use walrus::{ExportItem, Module};

fn trim(path: &Path, keep: &BTreeSet<String>) -> Result<Vec<String>, String> {
    let mut module =
        Module::from_file(path).map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
    let exported: BTreeSet<String> = module.exports.iter().map(|e| e.name.clone()).collect();
    let missing: Vec<&String> = keep.difference(&exported).collect();
    if !missing.is_empty() {
        return Err(format!(
            "{}: not exported, but to be kept: {missing:?}",
            path.display()
        ));
    }
    let drop: Vec<(walrus::ExportId, String)> = module
        .exports
        .iter()
        .filter(|e| matches!(e.item, ExportItem::Function(_)) && !keep.contains(&e.name))
        .map(|e| (e.id(), e.name.clone()))
        .collect();
    if drop.is_empty() {
        return Ok(Vec::new());
    }
    for (id, _) in &drop {
        module.exports.delete(*id);
    }
    walrus::passes::gc::run(&mut module);
    let tmp = path.with_extension("wasm.trim-tmp");
    module
        .emit_wasm_file(&tmp)
        .map_err(|e| format!("{}: cannot write: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("{}: cannot replace: {e}", path.display()))?;
    Ok(drop.into_iter().map(|(_, name)| name).collect())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (keep, file) = match args.as_slice() {
        [flag, keep, file] if flag == "--keep" => (keep, file),
        _ => {
            eprintln!("usage: trim-exports --keep NAME,NAME,... FILE.wasm");
            return ExitCode::from(2);
        }
    };
    let keep: BTreeSet<String> = keep
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    match trim(Path::new(file), &keep) {
        Ok(removed) if removed.is_empty() => {
            println!("{file}: nothing to remove");
            ExitCode::SUCCESS
        }
        Ok(removed) => {
            println!(
                "{file}: removed {} exports: {}",
                removed.len(),
                removed.join(" ")
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("trim-exports: {e}");
            ExitCode::FAILURE
        }
    }
}

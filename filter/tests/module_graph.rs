//! The filter's module graph, from its own source: every file of
//! `filter/src` is a module, and module A depends on module B when A names
//! an item of B (`use crate::b::...`, a `crate::b::...` path in code, a
//! relative `use child::...`): the imports a reader sees. A re-export is
//! not followed: `use crate::local::Scope` is a dependency on `local`,
//! whose `pub use placement::Scope` is its own dependency on
//! `local::placement`, so a cycle through a module's re-exports shows as
//! one through that module. Test code
//! (`#[cfg(test)]` items, `tests.rs` files) is left out: it may use
//! anything.
//!
//! The test fails when a module depends on a module that depends on it
//! back, directly or through others (a cycle), printing the graph and the
//! cycles. To print the graph:
//!
//!     cargo test -p tenant-ratelimit --test module_graph -- --nocapture
//!
//! Native only: the wasm test runners do not open the source tree.
#![cfg(not(target_arch = "wasm32"))]
// A test crate: the checks fail loudly.
#![allow(clippy::unwrap_used, clippy::panic, clippy::indexing_slicing)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// A module path, `local::slot` (the crate root is "").
type Module = String;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Tok {
    Ident(String),
    /// `::`
    Path,
    Punct(char),
}

/// The source's tokens, without comments, strings and character literals
/// (which may hold braces or `crate::` in their text).
fn tokens(src: &str) -> Vec<Tok> {
    let b: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let at = |i: usize| b.get(i).copied().unwrap_or('\0');
    while i < b.len() {
        let c = b[i];
        if c == '/' && at(i + 1) == '/' {
            while i < b.len() && b[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if b[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c == 'r'
            && (at(i + 1) == '"' || (at(i + 1) == '#' && matches!(at(i + 2), '"' | '#')))
        {
            // A raw string: r"..", r#".."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while at(j) == '#' {
                hashes += 1;
                j += 1;
            }
            j += 1;
            loop {
                if j >= b.len() {
                    break;
                }
                if b[j] == '"' && (0..hashes).all(|k| at(j + 1 + k) == '#') {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            i = j;
        } else if c == '"' || (c == 'b' && at(i + 1) == '"') {
            let mut j = if c == 'b' { i + 2 } else { i + 1 };
            while j < b.len() && b[j] != '"' {
                if b[j] == '\\' {
                    j += 1;
                }
                j += 1;
            }
            i = j + 1;
        } else if c == '\'' {
            // A character literal ('x', '\n', '\u{..}') or a lifetime ('a).
            if at(i + 1) == '\\' {
                let mut j = i + 2;
                while j < b.len() && b[j] != '\'' {
                    j += 1;
                }
                i = j + 1;
            } else if at(i + 2) == '\'' {
                i += 3;
            } else {
                i += 1;
                while i < b.len() && (b[i].is_alphanumeric() || b[i] == '_') {
                    i += 1;
                }
            }
        } else if c.is_alphabetic() || c == '_' {
            let start = i;
            while i < b.len() && (b[i].is_alphanumeric() || b[i] == '_') {
                i += 1;
            }
            out.push(Tok::Ident(b[start..i].iter().collect()));
        } else if c.is_ascii_digit() {
            while i < b.len() && (b[i].is_alphanumeric() || b[i] == '_' || b[i] == '.') {
                if b[i] == '.' && !at(i + 1).is_ascii_digit() {
                    break;
                }
                i += 1;
            }
        } else if c == ':' && at(i + 1) == ':' {
            out.push(Tok::Path);
            i += 2;
        } else if c.is_whitespace() {
            i += 1;
        } else {
            out.push(Tok::Punct(c));
            i += 1;
        }
    }
    out
}

fn is_ident(t: Option<&Tok>, name: &str) -> bool {
    matches!(t, Some(Tok::Ident(s)) if s == name)
}

/// The index after the item that starts at `i`: at its `;` at depth 0, or
/// after the `}` that closes its first brace.
fn skip_item(t: &[Tok], mut i: usize) -> usize {
    let mut depth = 0i32;
    while i < t.len() {
        match &t[i] {
            Tok::Punct('{') | Tok::Punct('(') | Tok::Punct('[') => depth += 1,
            Tok::Punct('}') | Tok::Punct(')') | Tok::Punct(']') => {
                depth -= 1;
                if depth == 0 && t[i] == Tok::Punct('}') {
                    return i + 1;
                }
            }
            Tok::Punct(';') if depth == 0 => return i + 1,
            _ => {}
        }
        i += 1;
    }
    i
}

/// The tokens of a file without its `#[cfg(test)]` items; also the names
/// of the child modules declared test-only (`#[cfg(test)] mod tests;`).
fn without_tests(t: &[Tok]) -> (Vec<Tok>, Vec<String>) {
    let mut out = Vec::new();
    let mut test_children = Vec::new();
    let mut i = 0;
    while i < t.len() {
        let cfg_test = t.get(i) == Some(&Tok::Punct('#'))
            && t.get(i + 1) == Some(&Tok::Punct('['))
            && is_ident(t.get(i + 2), "cfg")
            && t.get(i + 3) == Some(&Tok::Punct('('))
            && is_ident(t.get(i + 4), "test")
            && t.get(i + 5) == Some(&Tok::Punct(')'))
            && t.get(i + 6) == Some(&Tok::Punct(']'));
        if cfg_test {
            let mut j = i + 7;
            // Further attributes of the same item.
            while t.get(j) == Some(&Tok::Punct('#')) {
                j = skip_item(t, j + 1);
            }
            if is_ident(t.get(j), "pub") {
                j += 1;
            }
            if is_ident(t.get(j), "mod") && t.get(j + 2) == Some(&Tok::Punct(';')) {
                if let Some(Tok::Ident(name)) = t.get(j + 1) {
                    test_children.push(name.clone());
                }
            }
            i = skip_item(t, j);
        } else {
            out.push(t[i].clone());
            i += 1;
        }
    }
    (out, test_children)
}

/// One `use` tree, flattened to its paths (`use a::{b, c::d as e}` gives
/// `a::b` and `a::c::d`, with `e` as the name it is known by).
fn use_paths(t: &[Tok], i: &mut usize, prefix: &[String], out: &mut Vec<(Vec<String>, String)>) {
    let mut path: Vec<String> = prefix.to_vec();
    loop {
        match t.get(*i) {
            Some(Tok::Ident(s)) if s == "as" => {
                *i += 1;
                if let Some(Tok::Ident(alias)) = t.get(*i) {
                    *i += 1;
                    out.push((path.clone(), alias.clone()));
                }
                return;
            }
            Some(Tok::Ident(s)) => {
                path.push(s.clone());
                *i += 1;
            }
            Some(Tok::Path) => *i += 1,
            Some(Tok::Punct('*')) => {
                *i += 1;
                out.push((path.clone(), "*".to_string()));
                return;
            }
            Some(Tok::Punct('{')) => {
                *i += 1;
                loop {
                    match t.get(*i) {
                        Some(Tok::Punct('}')) => {
                            *i += 1;
                            return;
                        }
                        Some(Tok::Punct(',')) => *i += 1,
                        None => return,
                        _ => use_paths(t, i, &path, out),
                    }
                }
            }
            _ => {
                let name = match path.last() {
                    Some(s) if s == "self" => {
                        path.pop();
                        path.last().cloned().unwrap_or_default()
                    }
                    Some(s) => s.clone(),
                    None => String::new(),
                };
                if !path.is_empty() {
                    out.push((path, name));
                }
                return;
            }
        }
    }
}

/// What one file says: its `use` paths (and whether each is `pub`), and
/// the `crate::...` paths in its code.
struct Parsed {
    uses: Vec<(bool, Vec<String>, String)>,
    inline: Vec<Vec<String>>,
    test_children: Vec<String>,
}

fn parse(src: &str) -> Parsed {
    let (t, test_children) = without_tests(&tokens(src));
    let mut uses = Vec::new();
    let mut inline = Vec::new();
    let mut i = 0;
    while i < t.len() {
        if is_ident(t.get(i), "use") {
            let public = i >= 1
                && (is_ident(t.get(i - 1), "pub")
                    || (t.get(i - 1) == Some(&Tok::Punct(')'))
                        && i >= 4
                        && is_ident(t.get(i - 4), "pub")));
            let mut j = i + 1;
            let mut paths = Vec::new();
            use_paths(&t, &mut j, &[], &mut paths);
            uses.extend(paths.into_iter().map(|(p, n)| (public, p, n)));
            i = j;
        } else if is_ident(t.get(i), "crate") && t.get(i + 1) == Some(&Tok::Path) {
            let mut path = vec!["crate".to_string()];
            let mut j = i + 1;
            while t.get(j) == Some(&Tok::Path) {
                match t.get(j + 1) {
                    Some(Tok::Ident(s)) => {
                        path.push(s.clone());
                        j += 2;
                    }
                    _ => break,
                }
            }
            inline.push(path);
            i = j;
        } else {
            i += 1;
        }
    }
    Parsed {
        uses,
        inline,
        test_children,
    }
}

/// The module of a source file (`local/mod.rs` is `local`).
fn module_of(src: &Path, file: &Path) -> Module {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
        parts.pop();
    }
    parts.join("::")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let p = entry.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

fn join(base: &str, rest: &[String]) -> Vec<String> {
    let mut v: Vec<String> = base
        .split("::")
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    v.extend(rest.iter().cloned());
    v
}

/// The filter's modules and who depends on whom.
pub struct Graph {
    pub modules: BTreeSet<Module>,
    pub edges: BTreeMap<Module, BTreeSet<Module>>,
}

/// Reads `src` (a crate's `src` directory) into its module graph.
pub fn graph(src: &Path) -> Graph {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut parsed: BTreeMap<Module, Parsed> = BTreeMap::new();
    for f in &files {
        parsed.insert(module_of(src, f), parse(&fs::read_to_string(f).unwrap()));
    }
    // Test-only modules (`#[cfg(test)] mod tests;`) are left out.
    let test_only: BTreeSet<Module> = parsed
        .iter()
        .flat_map(|(m, p)| {
            p.test_children
                .iter()
                .map(move |c| join(m, std::slice::from_ref(c)).join("::"))
        })
        .collect();
    parsed.retain(|m, _| !test_only.contains(m));
    let modules: BTreeSet<Module> = parsed.keys().cloned().collect();

    // A path as written in module `m`, absolute (segments after `crate`);
    // None for another crate's.
    let absolute = |m: &str, path: &[String]| -> Option<Vec<String>> {
        let first = path.first()?;
        match first.as_str() {
            "crate" => Some(path[1..].to_vec()),
            "self" => Some(join(m, &path[1..])),
            "super" => {
                let mut base: Vec<&str> = m.split("::").filter(|s| !s.is_empty()).collect();
                base.pop();
                Some(join(&base.join("::"), &path[1..]))
            }
            child if modules.contains(&join(m, &[child.to_string()]).join("::")) => {
                Some(join(m, path))
            }
            _ => None,
        }
    };
    // The module an absolute path names, as written (the longest prefix
    // that is a module): a re-exported item is its re-exporter's.
    fn resolve(modules: &BTreeSet<Module>, path: &[String]) -> Option<Module> {
        let mut n = path.len();
        while n > 0 && !modules.contains(&path[..n].join("::")) {
            n -= 1;
        }
        let module = path[..n].join("::");
        if n == 0 && !modules.contains(&module) {
            return None;
        }
        Some(module)
    }
    let mut edges: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (m, p) in &parsed {
        let to = edges.entry(m.clone()).or_default();
        let paths = p
            .uses
            .iter()
            .map(|(_, path, _)| path.clone())
            .chain(p.inline.iter().cloned());
        for path in paths {
            let Some(abs) = absolute(m, &path) else {
                continue;
            };
            if let Some(target) = resolve(&modules, &abs) {
                if target != *m && !target.is_empty() {
                    to.insert(target);
                }
            }
        }
    }
    Graph { modules, edges }
}

/// The strongly connected components of more than one module (Tarjan).
pub fn cycles(g: &Graph) -> Vec<Vec<Module>> {
    struct State<'a> {
        g: &'a Graph,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        next: usize,
        out: Vec<Vec<Module>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        s.index.insert(v, s.next);
        s.low.insert(v, s.next);
        s.next += 1;
        s.stack.push(v);
        s.on.insert(v);
        let g = s.g;
        for w in g.edges.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low[v];
                s.low.insert(v, lv.min(lw));
            } else if s.on.contains(w) {
                let iw = s.index[w];
                let lv = s.low[v];
                s.low.insert(v, lv.min(iw));
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on.remove(w);
                component.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.out.push(component);
            }
        }
    }
    let mut s = State {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for m in &g.modules {
        if !s.index.contains_key(m.as_str()) {
            visit(&mut s, m);
        }
    }
    s.out
}

fn show(g: &Graph) -> String {
    let mut text = String::new();
    for m in &g.modules {
        let name = if m.is_empty() { "(lib)" } else { m };
        let deps: Vec<&str> = g
            .edges
            .get(m)
            .into_iter()
            .flatten()
            .map(String::as_str)
            .collect();
        text.push_str(&format!("{name} -> {}\n", deps.join(", ")));
    }
    text
}

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn no_module_depends_on_a_module_that_depends_on_it() {
    let g = graph(&src_dir());
    let found = cycles(&g);
    let edges: usize = g.edges.values().map(BTreeSet::len).sum();
    println!(
        "{} modules, {edges} dependencies:\n{}",
        g.modules.len(),
        show(&g)
    );
    if found.is_empty() {
        println!("no cycles");
    }
    for c in &found {
        println!("cycle among: {}", c.join(", "));
    }
    assert!(found.is_empty(), "the module graph has cycles: {found:?}");
}

#[test]
fn the_checker_sees_cycles_through_reexports_and_ignores_tests() {
    let dir = std::env::temp_dir().join(format!("module-graph-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(dir.join("local")).unwrap();
    let write = |p: &str, s: &str| fs::write(dir.join(p), s).unwrap();
    write("lib.rs", "pub mod a;\npub mod local;\n");
    write(
        "local/mod.rs",
        "pub mod slot;\npub use slot::Slot;\npub fn admit() {}\n",
    );
    // slot -> a -> local -> local::slot (local's re-export, as a reader
    // of `a` sees it): a cycle.
    write("local/slot.rs", "use crate::a::Lease;\npub struct Slot;\n");
    write(
        "a.rs",
        "// use crate::local::admit; (a comment)\nuse crate::local::Slot;\npub struct Lease;\n\
         fn f() -> &'static str { \"crate::local::admit\" }\n\
         #[cfg(test)]\nmod tests { use crate::local::admit; }\n",
    );
    let g = graph(&dir);
    assert_eq!(
        g.edges["a"].iter().collect::<Vec<_>>(),
        vec!["local"],
        "{}",
        show(&g)
    );
    let names = |v: &[&str]| v.iter().map(|m| m.to_string()).collect::<Vec<_>>();
    assert_eq!(cycles(&g), vec![names(&["a", "local", "local::slot"])]);
    // The code names a function of local itself: a cycle through local.
    write("local/slot.rs", "pub struct Slot;\n");
    write("a.rs", "pub fn f() { crate::local::admit() }\n");
    write(
        "local/mod.rs",
        "pub mod slot;\npub use slot::Slot;\nuse crate::a::f;\npub fn admit() {}\n",
    );
    let g = graph(&dir);
    assert_eq!(cycles(&g), vec![vec!["a".to_string(), "local".to_string()]]);
    let _ = fs::remove_dir_all(&dir);
}

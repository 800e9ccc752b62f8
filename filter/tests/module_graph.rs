//! No import circle among the filter's modules. Every file of `filter/src`
//! is a module, parsed with syn; module A depends on module B when A names
//! an item of B: `use crate::b::...`, `use super::...`, a relative
//! `use child::...`, or a `crate::b::...` path in code. A re-export is not
//! followed (`use crate::local::Scope` depends on `local`, whose
//! `pub use placement::Scope` is its own dependency on `local::placement`).
//! Test code (`#[cfg(test)]` items and modules) is left out: it may use
//! anything. To print the graph:
//!
//!     cargo test -p tenant-ratelimit --test module_graph -- --nocapture
//!
//! Native only: the wasm test runners do not open the source tree.
#![cfg(not(target_arch = "wasm32"))]
// A test crate: the checks fail loudly.
#![allow(clippy::unwrap_used, clippy::panic, clippy::indexing_slicing)]

use std::collections::{BTreeMap, BTreeSet};
use std::{fs, path::Path};
use syn::visit::{self, Visit};

/// Module (`local::slot`; the crate root is "") → the modules it depends on.
type Graph = BTreeMap<String, BTreeSet<String>>;

fn cfg_test(attrs: &[syn::Attribute]) -> bool {
    let test = |a: &syn::Attribute| {
        a.parse_args::<syn::Meta>()
            .is_ok_and(|m| m.path().is_ident("test"))
    };
    attrs.iter().any(|a| a.path().is_ident("cfg") && test(a))
}

/// The paths a file names (`use` trees flattened; `crate::` paths in code),
/// and the child modules it declares test-only.
#[derive(Default)]
struct Names {
    paths: Vec<Vec<String>>,
    test_mods: Vec<String>,
}

fn flatten(tree: &syn::UseTree, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    let leaf = |prefix: &[String], last: String| [prefix, &[last]].concat();
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            flatten(&p.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) => out.push(leaf(prefix, n.ident.to_string())),
        syn::UseTree::Rename(r) => out.push(leaf(prefix, r.ident.to_string())),
        syn::UseTree::Glob(_) => out.push(prefix.clone()),
        syn::UseTree::Group(g) => g.items.iter().for_each(|t| flatten(t, prefix, out)),
    }
}

impl<'a> Visit<'a> for Names {
    fn visit_item(&mut self, item: &'a syn::Item) {
        match item {
            syn::Item::Mod(m) if cfg_test(&m.attrs) => self.test_mods.push(m.ident.to_string()),
            syn::Item::Use(u) if !cfg_test(&u.attrs) => {
                flatten(&u.tree, &mut Vec::new(), &mut self.paths)
            }
            syn::Item::Const(syn::ItemConst { attrs, .. })
            | syn::Item::Enum(syn::ItemEnum { attrs, .. })
            | syn::Item::Fn(syn::ItemFn { attrs, .. })
            | syn::Item::Impl(syn::ItemImpl { attrs, .. })
            | syn::Item::Static(syn::ItemStatic { attrs, .. })
            | syn::Item::Struct(syn::ItemStruct { attrs, .. })
            | syn::Item::Trait(syn::ItemTrait { attrs, .. })
            | syn::Item::Type(syn::ItemType { attrs, .. })
            | syn::Item::Use(syn::ItemUse { attrs, .. })
                if cfg_test(attrs) => {}
            _ => visit::visit_item(self, item),
        }
    }
    fn visit_impl_item(&mut self, item: &'a syn::ImplItem) {
        if !matches!(item, syn::ImplItem::Fn(f) if cfg_test(&f.attrs)) {
            visit::visit_impl_item(self, item);
        }
    }
    fn visit_path(&mut self, path: &'a syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        if segments.len() > 1 && segments[0] == "crate" {
            self.paths.push(segments);
        }
        visit::visit_path(self, path);
    }
}

/// Reads `src` (a crate's `src` directory) into its module graph.
fn graph(src: &Path) -> Graph {
    let mut files = vec![src.to_path_buf()];
    let mut parsed: BTreeMap<String, Names> = BTreeMap::new();
    while let Some(path) = files.pop() {
        if path.is_dir() {
            files.extend(fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let file = syn::parse_file(&fs::read_to_string(&path).unwrap()).unwrap();
        let rel = path.strip_prefix(src).unwrap().with_extension("");
        let mut module: Vec<&str> = rel.iter().map(|c| c.to_str().unwrap()).collect();
        if module.last() == Some(&"mod") || module == ["lib"] {
            module.pop();
        }
        if !cfg_test(&file.attrs) {
            let mut names = Names::default();
            names.visit_file(&file);
            parsed.insert(module.join("::"), names);
        }
    }
    let join = |m: &str, rest: &[String]| {
        m.split("::")
            .filter(|s| !s.is_empty())
            .map(String::from)
            .chain(rest.iter().cloned())
            .collect::<Vec<_>>()
    };
    let test_only: Vec<String> = parsed
        .iter()
        .flat_map(|(m, n)| {
            n.test_mods
                .iter()
                .map(|c| join(m, std::slice::from_ref(c)).join("::"))
        })
        .collect();
    parsed.retain(|m, _| {
        !test_only
            .iter()
            .any(|t| m == t || m.starts_with(&format!("{t}::")))
    });
    let modules: BTreeSet<String> = parsed.keys().cloned().collect();
    let mut g = Graph::new();
    for (m, names) in &parsed {
        let to = g.entry(m.clone()).or_default();
        for path in &names.paths {
            let absolute = match path[0].as_str() {
                "crate" => path[1..].to_vec(),
                "self" => join(m, &path[1..]),
                "super" => join(
                    m.rsplit_once("::").map_or("", |(parent, _)| parent),
                    &path[1..],
                ),
                child if modules.contains(&join(m, &[child.to_string()]).join("::")) => {
                    join(m, path)
                }
                _ => continue, // another crate's
            };
            // The module the path names, as written: its longest prefix that is a module.
            let target = (1..=absolute.len())
                .rev()
                .map(|n| absolute[..n].join("::"))
                .find(|p| modules.contains(p));
            if let Some(target) = target.filter(|t| t != m) {
                to.insert(target);
            }
        }
    }
    g
}

/// The modules on a cycle, grouped by those that reach each other.
fn cycles(g: &Graph) -> BTreeSet<Vec<String>> {
    let reach = |from: &str| {
        let (mut seen, mut todo) = (BTreeSet::new(), vec![from.to_string()]);
        while let Some(m) = todo.pop() {
            todo.extend(
                g.get(&m)
                    .into_iter()
                    .flatten()
                    .filter(|n| seen.insert(n.to_string()))
                    .cloned(),
            );
        }
        seen
    };
    let reached: BTreeMap<&String, BTreeSet<String>> = g.keys().map(|m| (m, reach(m))).collect();
    reached
        .iter()
        .filter(|(m, r)| r.contains(**m))
        .map(|(m, r)| {
            r.iter()
                .filter(|n| reached[n].contains(*m))
                .cloned()
                .collect()
        })
        .collect()
}

#[test]
fn no_module_depends_on_a_module_that_depends_on_it() {
    let g = graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    for (m, deps) in &g {
        println!(
            "{} -> {}",
            if m.is_empty() { "(lib)" } else { m },
            Vec::from_iter(deps.iter().map(String::as_str)).join(", ")
        );
    }
    assert!(
        g.len() > 20,
        "{} modules: not the filter's source?",
        g.len()
    );
    let found = cycles(&g);
    assert!(found.is_empty(), "the module graph has cycles: {found:?}");
    println!("no cycles");
}

#[test]
fn the_checker_sees_cycles_through_reexports_and_ignores_tests() {
    let dir = std::env::temp_dir().join(format!("module-graph-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(dir.join("local")).unwrap();
    let write = |p: &str, s: &str| fs::write(dir.join(p), s).unwrap();
    write(
        "lib.rs",
        "pub mod a;\npub mod local;\n#[cfg(test)]\nmod tests;\n",
    );
    write("tests.rs", "use crate::a::Lease;\n");
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
    assert_eq!(Vec::from_iter(&g["a"]), vec!["local"], "{g:?}");
    assert!(!g.contains_key("tests"), "{g:?}");
    let names = |v: &[&str]| v.iter().map(|m| m.to_string()).collect::<Vec<_>>();
    assert_eq!(
        Vec::from_iter(cycles(&g)),
        vec![names(&["a", "local", "local::slot"])]
    );
    // The code names a function of local itself: a cycle through local.
    write("local/slot.rs", "pub struct Slot;\n");
    write("a.rs", "pub fn f() { crate::local::admit() }\n");
    write(
        "local/mod.rs",
        "pub mod slot;\npub use slot::Slot;\nuse crate::a::f;\npub fn admit() {}\n",
    );
    assert_eq!(
        Vec::from_iter(cycles(&graph(&dir))),
        vec![names(&["a", "local"])]
    );
    // No cycle once local no longer names a.
    write(
        "local/mod.rs",
        "pub mod slot;\npub use slot::Slot;\npub fn admit() {}\n",
    );
    assert!(cycles(&graph(&dir)).is_empty());
    let _ = fs::remove_dir_all(&dir);
}

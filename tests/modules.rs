//! No import cycles between the modules of `src/`: the files' `use`
//! declarations (of `crate::` and `super::` paths, test modules left out)
//! make a graph of files, and it has no cycle. A module that imports one that
//! imports it back is two concepts that own each other.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeSet<String>>;

/// Every `.rs` file under `dir`, with its text up to its test module.
fn sources(root: &Path) -> Vec<(PathBuf, String)> {
    let mut files = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                let product = text.split("#[cfg(test)]").next().unwrap_or("").to_string();
                files.push((
                    path.strip_prefix(root).unwrap_or(&path).to_path_buf(),
                    product,
                ));
            }
        }
    }
    files
}

/// A file's module path under `src/` (`core/due.rs` -> `core::due`,
/// `controller/mod.rs` -> `controller`, `lib.rs` -> ``).
fn module_of(relative: &Path) -> String {
    let mut parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
        parts.pop();
    }
    parts.join("::")
}

/// The paths a `use` tree names, braces expanded (`a::{b, c::d}` -> `a::b`,
/// `a::c::d`).
fn expand(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        return vec![tree.split(" as ").next().unwrap_or(tree).trim().to_string()];
    };
    let prefix = &tree[..open];
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
        .into_iter()
        .filter(|p| !p.trim().is_empty())
        .flat_map(|p| expand(&format!("{prefix}{}", p.trim())))
        .collect()
}

/// The `use` trees of a file's text: each statement from a line that starts
/// with `use` (or `pub use`, `pub(crate) use`) to its `;`.
fn use_trees(text: &str) -> Vec<String> {
    let starts = ["use ", "pub use ", "pub(crate) use ", "pub(super) use "];
    text.split(';')
        .filter_map(|chunk| {
            let lines: Vec<&str> = chunk.lines().collect();
            let first = lines
                .iter()
                .position(|l| starts.iter().any(|s| l.trim_start().starts_with(s)))?;
            let statement = lines[first..].join(" ");
            Some(statement.split_once("use ")?.1.to_string())
        })
        .collect()
}

/// The module a path in `from` names: the longest of its prefixes that is a
/// module of `modules`.
fn target(path: &str, from: &str, modules: &BTreeSet<String>) -> Option<String> {
    let mut segments: Vec<String> = if let Some(rest) = path.strip_prefix("crate::") {
        rest.split("::").map(str::to_string).collect()
    } else if path.starts_with("super::") {
        let mut base: Vec<String> = from
            .split("::")
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect();
        let mut rest = path;
        while let Some(r) = rest.strip_prefix("super::") {
            base.pop();
            rest = r;
        }
        base.extend(rest.split("::").map(str::to_string));
        base
    } else {
        return None;
    };
    segments.retain(|s| s != "self" && s != "*");
    (0..=segments.len())
        .rev()
        .map(|n| segments[..n].join("::"))
        .find(|m| modules.contains(m))
}

/// The graph of modules, an edge for each import of another module.
fn graph(files: &[(PathBuf, String)]) -> Graph {
    let modules: BTreeSet<String> = files.iter().map(|(p, _)| module_of(p)).collect();
    let mut graph = Graph::new();
    for (path, text) in files {
        let from = module_of(path);
        for tree in use_trees(text) {
            for used in expand(&tree) {
                if let Some(to) = target(&used, &from, &modules).filter(|to| *to != from) {
                    graph.entry(from.clone()).or_default().insert(to);
                }
            }
        }
    }
    graph
}

/// A cycle of `graph`, if it has one.
fn cycle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &Graph,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|n| n == node) {
            return Some(path[i..].to_vec());
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(found) = visit(next, graph, path, done) {
                return Some(found);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

#[test]
fn the_modules_of_src_import_no_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files: Vec<(PathBuf, String)> = sources(&src)
        .into_iter()
        .filter(|(p, _)| !p.starts_with("bin") && p != Path::new("main.rs"))
        .collect();
    let graph = graph(&files);
    assert!(graph.len() > 20, "the graph was read: {graph:?}");
    assert!(
        graph["controller"].contains("core::due"),
        "imports through braces are read: {:?}",
        graph["controller"]
    );
    assert_eq!(cycle(&graph), None);
}

#[test]
fn a_cycle_is_found_through_super_and_braces() {
    let files = vec![
        (
            PathBuf::from("a/mod.rs"),
            "use crate::b::{self, C};\nmod x;".to_string(),
        ),
        (
            PathBuf::from("a/x.rs"),
            "use super::super::c::D;".to_string(),
        ),
        (PathBuf::from("b.rs"), "pub use crate::a::x::E;".to_string()),
        (PathBuf::from("c.rs"), "use crate::b::F as G;".to_string()),
    ];
    let graph = graph(&files);
    assert_eq!(graph["a::x"], BTreeSet::from(["c".to_string()]));
    let found = cycle(&graph).expect("b -> a::x -> c -> b");
    assert_eq!(found.len(), 3, "{found:?}");
}

//! Every arrow points down, file by file: in the leash crate (`src/`) and in the benches
//! (`benches/leash_bench/`), no module imports another in a circle, and no file imports from a
//! folder above it (a child of `cgroup/` naming an item of `cgroup/mod.rs`): the shared types of
//! a folder live in a low file of their own, which its siblings import. A module's arrows are the
//! `crate::`, `super::` and `self::` paths in its code (use trees expanded; comments and
//! test modules left out), each resolved to the deepest module it names. The test fails
//! naming the circle or the upward import.
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module path (`["cgroup", "lifecycle"]`); the crate root is empty.
type Module = Vec<String>;

fn code_of(text: &str) -> String {
    // A file's test module is left out (from `#[cfg(test)] mod tests` on); a `#[cfg(test)]` on
    // a single item elsewhere is not a place to stop reading.
    let text = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .map(|l| l.split(" // ").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every module of a crate whose root file is `root`, with its file.
fn modules(root: &Path) -> BTreeMap<Module, PathBuf> {
    let dir = root.parent().unwrap().to_path_buf();
    let mut out = BTreeMap::new();
    out.insert(Vec::new(), root.to_path_buf());
    let mut todo: Vec<(Module, PathBuf, PathBuf)> = vec![(Vec::new(), root.to_path_buf(), dir)];
    while let Some((m, file, dir)) = todo.pop() {
        let code = code_of(&std::fs::read_to_string(&file).unwrap());
        for line in code.lines() {
            let l = line.trim();
            let l = l.strip_prefix("pub ").unwrap_or(l);
            let l = l.strip_prefix("pub(crate) ").unwrap_or(l);
            let l = l.strip_prefix("pub(super) ").unwrap_or(l);
            let Some(name) = l.strip_prefix("mod ").and_then(|r| r.strip_suffix(';')) else {
                continue;
            };
            let flat = dir.join(format!("{name}.rs"));
            let nested = dir.join(name).join("mod.rs");
            let child = if flat.is_file() { flat } else { nested };
            assert!(child.is_file(), "mod {name} of {}: no file", file.display());
            let mut cm = m.clone();
            cm.push(name.to_string());
            out.insert(cm.clone(), child.clone());
            todo.push((cm, child, dir.join(name)));
        }
    }
    out
}

/// The paths a text names from `crate::`, `super::` or `self::`, use trees expanded
/// (`super::{a, b::C}` gives `super::a` and `super::b::C`).
fn paths(code: &str) -> Vec<String> {
    let bytes = code.as_bytes();
    let mut out = Vec::new();
    for head in ["crate::", "super::", "self::"] {
        for (i, _) in code.match_indices(head) {
            let boundary = i == 0 || {
                let c = bytes[i - 1] as char;
                !(c.is_alphanumeric() || c == '_' || c == ':' || c == '$')
            };
            if boundary {
                expand(&code[i..], String::new(), &mut out);
            }
        }
    }
    out
}

/// The path at the start of `text`, after `prefix`: one path, or a use tree's paths.
fn expand(text: &str, prefix: String, out: &mut Vec<String>) -> usize {
    let len = text
        .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
        .unwrap_or(text.len());
    let path = format!("{prefix}{}", &text[..len]);
    if text[len..].starts_with('{') && path.ends_with("::") {
        // A use tree: its items, separated by commas at depth one.
        let mut at = len + 1;
        loop {
            let rest = &text[at..];
            let skip = rest.len() - rest.trim_start().len();
            at += skip;
            if text[at..].starts_with('}') {
                return at + 1;
            }
            at += expand(&text[at..], path.clone(), out);
            let rest = &text[at..];
            at += rest.len() - rest.trim_start().len();
            if text[at..].starts_with(',') {
                at += 1;
            } else if text[at..].starts_with('}') {
                return at + 1;
            } else if text[at..].starts_with(" as ") || text[at..].starts_with("as ") {
                // `x as y`: skip the alias.
                let end = text[at..].find([',', '}']).unwrap_or(text.len() - at);
                at += end;
            } else if at >= text.len() {
                return at;
            } else {
                at += 1;
            }
        }
    }
    out.push(path);
    len
}

/// The deepest module `path` names, seen from module `from` (`None`: it leaves the crate).
fn resolve(path: &str, from: &Module, mods: &BTreeMap<Module, PathBuf>) -> Option<Module> {
    let mut segs = path.split("::").filter(|s| !s.is_empty()).peekable();
    let mut at: Module = match *segs.peek()? {
        "crate" => {
            segs.next();
            Vec::new()
        }
        _ => from.clone(),
    };
    while let Some(&s) = segs.peek() {
        match s {
            "self" => {}
            "super" => {
                at.pop()?;
            }
            _ => break,
        }
        segs.next();
    }
    for s in segs {
        let mut next = at.clone();
        next.push(s.to_string());
        if !mods.contains_key(&next) {
            break;
        }
        at = next;
    }
    Some(at)
}

/// Each module's arrows: the modules its code names.
fn graph(root: &Path) -> BTreeMap<Module, BTreeSet<Module>> {
    let mods = modules(root);
    let mut g = BTreeMap::new();
    for (m, file) in &mods {
        let code = code_of(&std::fs::read_to_string(file).unwrap());
        let deps: BTreeSet<Module> = paths(&code)
            .iter()
            .filter_map(|p| resolve(p, m, &mods))
            .filter(|t| t != m)
            .collect();
        g.insert(m.clone(), deps);
    }
    g
}

fn name(m: &Module) -> String {
    if m.is_empty() {
        "crate".into()
    } else {
        m.join("::")
    }
}

/// A circle through `from`, if there is one: the path back to it.
fn circle<N: Ord + Clone>(
    graph: &BTreeMap<N, BTreeSet<N>>,
    from: &N,
    at: &N,
    path: &mut Vec<N>,
    seen: &mut BTreeSet<N>,
) -> bool {
    for next in graph.get(at).into_iter().flatten() {
        if next == from {
            path.push(next.clone());
            return true;
        }
        if seen.insert(next.clone()) {
            path.push(next.clone());
            if circle(graph, from, next, path, seen) {
                return true;
            }
            path.pop();
        }
    }
    false
}

/// The circles of `g` (one per module found on one), and its upward imports: a module naming a
/// module above it (its folder's `mod.rs`, or one further up; the crate root aside).
fn problems(g: &BTreeMap<Module, BTreeSet<Module>>) -> (Vec<String>, Vec<String>) {
    let mut circles = Vec::new();
    for m in g.keys() {
        let mut path = vec![m.clone()];
        if circle(g, m, m, &mut path, &mut BTreeSet::new()) {
            circles.push(path.iter().map(name).collect::<Vec<_>>().join(" -> "));
        }
    }
    let mut upward = Vec::new();
    for (m, deps) in g {
        for d in deps {
            if !d.is_empty() && d.len() < m.len() && m.starts_with(d) {
                upward.push(format!("{} -> {}", name(m), name(d)));
            }
        }
    }
    (circles, upward)
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Folders whose files still import from their `mod.rs` (the folder's top, which also holds
/// what its files share), and how many of their files do: the work left. Each count is exact:
/// the test fails when one grows (a new upward import) and when one shrinks (lower it here, and
/// remove a folder that has none left), so the list only ever shrinks with the code.
const UPWARD_STILL: &[(&str, usize)] = &[("protocol", 1)];

fn check(root: &Path) {
    check_graph(root, &graph(root));
}

fn check_graph(root: &Path, g: &BTreeMap<Module, BTreeSet<Module>>) {
    assert!(g.len() > 5, "read the crate's modules: {g:?}");
    let (circles, upward) = problems(g);
    assert!(
        circles.is_empty(),
        "import circles in {}:\n{}",
        root.display(),
        circles.join("\n")
    );
    let mut by_folder: BTreeMap<String, Vec<&String>> = BTreeMap::new();
    for u in &upward {
        let to = u.split(" -> ").nth(1).unwrap().to_string();
        by_folder.entry(to).or_default().push(u);
    }
    for (folder, found) in &by_folder {
        let allowed = UPWARD_STILL
            .iter()
            .find(|(f, _)| f == folder)
            .map_or(0, |(_, n)| *n);
        assert!(
            found.len() <= allowed,
            "upward imports into {folder} (put what its files share in a low file of its own):\n{}",
            found
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    if root.ends_with("src/lib.rs") {
        for (folder, n) in UPWARD_STILL {
            let found = by_folder.get(*folder).map_or(0, Vec::len);
            assert_eq!(
                found, *n,
                "{folder}: {found} files import from it, UPWARD_STILL says {n}: lower the count \
                 (or remove the folder) there"
            );
        }
    }
}

#[test]
fn the_crate_imports_without_a_circle_or_an_upward_arrow() {
    let root = repo().join("src/lib.rs");
    let g = graph(&root);
    let m = |s: &str| -> Module { s.split("::").map(str::to_owned).collect() };
    assert!(
        g.iter().any(|(k, deps)| k.starts_with(&m("daemon"))
            && deps.iter().any(|d| d.starts_with(&m("controller")))),
        "the daemon's files and their imports of the controller are read"
    );
    assert!(
        g[&m("cgroup::lifecycle")]
            .iter()
            .any(|d| d.starts_with(&m("cgroup"))),
        "super:: paths are read: {:?}",
        g[&m("cgroup::lifecycle")]
    );
    check_graph(&root, &g);
}

#[test]
fn the_benches_import_without_a_circle_or_an_upward_arrow() {
    check(&repo().join("benches/leash_bench/main.rs"));
}

#[test]
fn the_top_level_modules_import_each_other_without_a_circle() {
    let g = graph(&repo().join("src/lib.rs"));
    let mut top: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (m, deps) in &g {
        let Some(from) = m.first() else { continue };
        let entry = top.entry(from.clone()).or_default();
        for d in deps {
            if let Some(to) = d.first().filter(|t| *t != from) {
                entry.insert(to.clone());
            }
        }
    }
    assert!(
        top["daemon"].contains("controller") && top["controller"].contains("store"),
        "the arrows are read: {top:?}"
    );
    for m in top.keys() {
        let mut path = vec![m.clone()];
        let found = circle(&top, m, m, &mut path, &mut BTreeSet::new());
        assert!(!found, "an import circle: {}", path.join(" -> "));
    }
}

/// The reader finds what it must: a use tree's items, `super::` and `self::` paths resolved
/// against the module, a circle and an upward import.
#[test]
fn the_reader_sees_trees_circles_and_upward_arrows() {
    assert_eq!(
        paths("use super::{a, b::{C, d}, e as f};\nlet x = crate::g::h(self::i);"),
        [
            "crate::g::h",
            "super::a",
            "super::b::C",
            "super::b::d",
            "super::e",
            "self::i"
        ]
    );
    let mods: BTreeMap<Module, PathBuf> = [
        vec![],
        vec!["a".to_string()],
        vec!["a".to_string(), "b".to_string()],
        vec!["a".to_string(), "c".to_string()],
    ]
    .into_iter()
    .map(|m| (m, PathBuf::new()))
    .collect();
    let ab = vec!["a".to_string(), "b".to_string()];
    let ac = vec!["a".to_string(), "c".to_string()];
    assert_eq!(resolve("super::c::X", &ab, &mods), Some(ac.clone()));
    assert_eq!(resolve("super::X", &ab, &mods), Some(vec!["a".to_string()]));
    assert_eq!(resolve("self::X", &ab, &mods), Some(ab.clone()));
    assert_eq!(resolve("crate::a::c::f", &ab, &mods), Some(ac.clone()));
    let g: BTreeMap<Module, BTreeSet<Module>> = [
        (ab.clone(), [ac.clone()].into()),
        (ac.clone(), [ab.clone(), vec!["a".to_string()]].into()),
    ]
    .into_iter()
    .collect();
    let (circles, upward) = problems(&g);
    assert_eq!(circles.len(), 2, "{circles:?}");
    assert_eq!(upward, ["a::c -> a"]);
}

//! Every arrow points down: the top-level modules of the leash crate (`controller`,
//! `daemon`, `store`, `cli`, …) import one another without a circle. A module's arrows are the
//! `crate::<module>` paths in its code (comments and `#[cfg(test)]` parts left out); the test
//! fails naming the circle, e.g. a store that logs through the CLI's helper.
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

fn code_of(text: &str) -> String {
    let text = text.split("#[cfg(test)]").next().unwrap_or("");
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .map(|l| l.split(" // ").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

fn collect(dir: &Path, src: &Path, graph: &mut BTreeMap<String, BTreeSet<String>>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            collect(&p, src, graph);
            continue;
        }
        if p.extension().is_none_or(|x| x != "rs") {
            continue;
        }
        let rel = p.strip_prefix(src).unwrap().to_string_lossy().into_owned();
        let top = rel
            .split('/')
            .next()
            .unwrap()
            .trim_end_matches(".rs")
            .to_string();
        if top == "lib" || top == "main" {
            continue;
        }
        let code = code_of(&std::fs::read_to_string(&p).unwrap());
        let deps = graph.entry(top.clone()).or_default();
        for (i, _) in code.match_indices("crate::") {
            let name: String = code[i + 7..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() && name != top {
                deps.insert(name);
            }
        }
    }
}

/// A circle through `from`, if there is one: the path back to it.
fn circle(
    graph: &BTreeMap<String, BTreeSet<String>>,
    from: &str,
    at: &str,
    path: &mut Vec<String>,
    seen: &mut BTreeSet<String>,
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

#[test]
fn the_top_level_modules_import_each_other_without_a_circle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut graph = BTreeMap::new();
    collect(&src, &src, &mut graph);
    assert!(graph.len() > 10, "read the crate's modules: {graph:?}");
    assert!(
        graph["daemon"].contains("controller") && graph["controller"].contains("store"),
        "the arrows are read: {graph:?}"
    );
    for m in graph.keys() {
        let mut path = vec![m.clone()];
        let found = circle(&graph, m, m, &mut path, &mut BTreeSet::new());
        assert!(
            !found,
            "an import circle: {} (every arrow: {graph:#?})",
            path.join(" -> ")
        );
    }
}

//! Every relative link in the repository's Markdown resolves: the file (or directory) it names
//! exists, and its `#anchor`, if any, is a heading of that file as GitHub names headings
//! (lowercased, punctuation dropped, spaces to hyphens, `-1`, `-2` for repeats). Links are read
//! with a CommonMark parser, so a link inside code is not a link and reference-style links count.
use pulldown_cmark::{Event, HeadingLevel, LinkType, Options, Parser, Tag, TagEnd};
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The Markdown files of the repository that a reader follows: README.md, docs/, clients/,
/// contrib/, examples/ (not target/ or node_modules/).
fn markdown_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if p.is_dir() {
                if name != "node_modules" && name != "target" && !name.starts_with('.') {
                    walk(&p, out);
                }
            } else if name.ends_with(".md") {
                out.push(p);
            }
        }
    }
    let mut out = vec![repo().join("README.md")];
    for d in ["docs", "clients", "contrib", "examples", "bench", "fuzz"] {
        walk(&repo().join(d), &mut out);
    }
    out.sort();
    out
}

/// GitHub's anchor for a heading's text.
fn slug(text: &str) -> String {
    text.trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// A Markdown file's anchors and links (destination, line).
fn read(doc: &str) -> (BTreeSet<String>, Vec<(String, usize)>) {
    let line_of = |offset: usize| doc[..offset].matches('\n').count() + 1;
    let mut anchors = BTreeSet::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut links = Vec::new();
    let mut heading: Option<String> = None;
    let parser = Parser::new_ext(doc, Options::ENABLE_TABLES).into_offset_iter();
    for (event, range) in parser {
        match event {
            Event::Start(Tag::Heading { level, .. }) if level <= HeadingLevel::H6 => {
                heading = Some(String::new())
            }
            Event::End(TagEnd::Heading(_)) => {
                let base = slug(&heading.take().unwrap_or_default());
                let n = seen.entry(base.clone()).or_insert(0);
                anchors.insert(if *n == 0 {
                    base.clone()
                } else {
                    format!("{base}-{n}")
                });
                *n += 1;
            }
            Event::Text(t) | Event::Code(t) => {
                if let Some(h) = heading.as_mut() {
                    h.push_str(&t);
                }
            }
            Event::Start(Tag::Link {
                link_type,
                dest_url,
                ..
            }) if !matches!(link_type, LinkType::Autolink | LinkType::Email) => {
                links.push((dest_url.to_string(), line_of(range.start)))
            }
            Event::Html(h) | Event::InlineHtml(h) => {
                // <a id="…"> / <a name="…"> anchors written by hand.
                for key in ["id=\"", "name=\""] {
                    if let Some(i) = h.find(key) {
                        let rest = &h[i + key.len()..];
                        if let Some(j) = rest.find('"') {
                            anchors.insert(rest[..j].to_string());
                        }
                    }
                }
            }
            _ => {}
        }
    }
    (anchors, links)
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let files = markdown_files();
    assert!(files.len() >= 10, "found only {files:?}");
    let mut anchors_of: HashMap<PathBuf, BTreeSet<String>> = HashMap::new();
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in &files {
        let doc = std::fs::read_to_string(file).unwrap();
        let (anchors, links) = read(&doc);
        anchors_of.insert(file.canonicalize().unwrap(), anchors);
        for (dest, line) in links {
            if dest.contains("://") || dest.starts_with("mailto:") || dest.starts_with("man:") {
                continue;
            }
            checked += 1;
            let (path, anchor) = match dest.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (dest.as_str(), None),
            };
            let target = if path.is_empty() {
                file.clone()
            } else if let Some(abs) = path.strip_prefix('/') {
                repo().join(abs)
            } else {
                file.parent().unwrap().join(path)
            };
            let shown = file.strip_prefix(repo()).unwrap().display().to_string();
            if !target.exists() {
                broken.push(format!("{shown}:{line}: {dest}: no such file"));
                continue;
            }
            let Some(anchor) = anchor else { continue };
            if target.extension().and_then(|e| e.to_str()) != Some("md") {
                continue; // an anchor into source code (a line) is GitHub's, not a heading
            }
            let canonical = target.canonicalize().unwrap();
            let anchors = anchors_of
                .entry(canonical.clone())
                .or_insert_with(|| read(&std::fs::read_to_string(&canonical).unwrap()).0);
            if !anchors.contains(anchor) {
                broken.push(format!(
                    "{shown}:{line}: {dest}: no heading with that anchor"
                ));
            }
        }
    }
    assert!(checked >= 50, "only {checked} relative links checked");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_anchor_rule_is_githubs() {
    // Examples of headings in these docs and the anchors GitHub gives them.
    assert_eq!(slug("The daemon: `leash serve`"), "the-daemon-leash-serve");
    assert_eq!(slug("Set up (two commands)"), "set-up-two-commands");
    assert_eq!(slug("`leash mcp` start-up"), "leash-mcp-start-up");
    let (anchors, _) = read("# A\n\n## A\n\n## B: c/d\n");
    assert_eq!(
        anchors,
        ["a", "a-1", "b-cd"].map(String::from).into_iter().collect()
    );
}

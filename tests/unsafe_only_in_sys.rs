//! `unsafe` in the leash library is confined to `src/sys.rs`: the library root denies
//! `unsafe_code` (so any `unsafe` elsewhere is a build error), and the one exemption in the whole
//! tree is the attribute on `mod sys`. This test keeps both facts from being edited away.
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn the_library_denies_unsafe_except_in_sys() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    for root in ["lib.rs", "main.rs"] {
        let text = std::fs::read_to_string(src.join(root)).unwrap();
        assert!(
            text.lines().any(|l| l.trim() == "#![deny(unsafe_code)]"),
            "src/{root} must deny unsafe_code"
        );
    }
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut exemptions = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            if l.contains("allow(unsafe_code)") {
                let next = lines.get(i + 1).map(|n| n.trim()).unwrap_or("");
                exemptions.push(format!(
                    "{}: {next}",
                    f.strip_prefix(&src).unwrap().display()
                ));
            }
        }
    }
    assert_eq!(exemptions, vec!["lib.rs: mod sys;".to_string()]);
}

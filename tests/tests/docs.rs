//! The docs name the tree as it is: every path of the repository that the
//! README or a page of docs/ cites in backquotes exists (a file moved or
//! split leaves no stale pointer behind). Needs nothing but the checkout.

use std::path::Path;

/// Top-level folders whose paths the docs cite.
const ROOTS: [&str; 9] = [
    "stall-agent/",
    "stall-common/",
    "stall-ebpf/",
    "tests/",
    "xtask/",
    "deploy/",
    "docs/",
    "demo/",
    "bench-workloads/",
];

/// Every `path` in backquotes in `text` that starts with one of [`ROOTS`],
/// cut at what is no longer a path (a `:line`, a `::item`, a glob).
fn cited_paths(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (i, span) in text.split('`').enumerate() {
        if i % 2 == 0 || !ROOTS.iter().any(|r| span.starts_with(r)) {
            continue;
        }
        let path: String =
            span.chars().take_while(|c| !c.is_whitespace() && !":*<{(#".contains(*c)).collect();
        if path.contains("...") || path.contains('…') {
            continue;
        }
        out.push(path.trim_end_matches(['.', ',']).to_string());
    }
    out
}

#[test]
fn every_path_the_docs_cite_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut pages = vec![root.join("README.md")];
    pages.extend(
        std::fs::read_dir(root.join("docs"))
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "md")),
    );
    let mut missing = Vec::new();
    let mut checked = 0;
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        for path in cited_paths(&text) {
            checked += 1;
            if !root.join(&path).exists() {
                missing.push(format!("{}: {path}", page.strip_prefix(root).unwrap().display()));
            }
        }
    }
    assert!(checked > 50, "only {checked} paths found: is the pattern right?");
    assert!(missing.is_empty(), "the docs cite paths that do not exist:\n{}", missing.join("\n"));
}

#[test]
fn a_cited_path_is_read_up_to_where_it_ends() {
    let text = "see `stall-agent/src/decode/` and `tests/tests/waits.rs:42`, not `cargo test`; \
                `stall-common/src/sched.rs` (`ThreadStats`), `docs/*.md`";
    assert_eq!(
        cited_paths(text),
        ["stall-agent/src/decode/", "tests/tests/waits.rs", "stall-common/src/sched.rs", "docs/"]
    );
}

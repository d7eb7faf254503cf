//! The repository holds sources, not build output: every clone pays for what
//! is tracked; and its documents' links lead somewhere (the reports moved to
//! `lab/`, the headlines stayed in `docs/`). These tests read git's index of
//! the checkout they run in.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// No source, document or fixture of this project comes near this size.
const MAX_TRACKED_BYTES: u64 = 1024 * 1024;

/// The first bytes of the executable formats a build can leave behind: ELF,
/// Mach-O (both byte orders, 32 and 64 bit, and fat), PE and WebAssembly.
const EXECUTABLE_MAGIC: [&[u8]; 7] = [
    b"\x7fELF",
    b"\xfe\xed\xfa\xce",
    b"\xfe\xed\xfa\xcf",
    b"\xce\xfa\xed\xfe",
    b"\xcf\xfa\xed\xfe",
    b"MZ",
    b"\0asm",
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn git(args: &[&str]) -> std::process::Output {
    Command::new("git")
        .args(args)
        .current_dir(root())
        .output()
        .expect("git runs")
}

/// Every tracked path with its git mode (`100644`, `100755`, `120000`, ...).
fn tracked() -> Vec<(String, PathBuf)> {
    let out = git(&["ls-files", "--stage", "-z"]);
    assert!(out.status.success(), "git ls-files: {out:?}");
    out.stdout
        .split(|b| *b == 0)
        .filter(|entry| !entry.is_empty())
        .map(|entry| {
            let entry = String::from_utf8_lossy(entry);
            let (meta, path) = entry.split_once('\t').expect("`mode sha stage\\tpath`");
            let mode = meta.split(' ').next().expect("a mode").to_string();
            (mode, PathBuf::from(path))
        })
        .collect()
}

/// Why `path` (tracked with `mode`) does not belong in git, if it does not.
fn why_not_source(mode: &str, path: &Path) -> Option<String> {
    if mode == "120000" || mode == "160000" {
        return None; // a symlink or a submodule: no content of its own
    }
    let full = root().join(path);
    // A file deleted in the work tree but still in the index is checked by
    // the next commit, not here.
    let bytes = std::fs::read(&full).ok()?;
    let size = u64::try_from(bytes.len()).expect("a file size fits u64");
    if size > MAX_TRACKED_BYTES {
        return Some(format!("{size} bytes, over {MAX_TRACKED_BYTES}"));
    }
    if EXECUTABLE_MAGIC
        .iter()
        .any(|magic| bytes.starts_with(magic))
    {
        return Some("an executable binary".into());
    }
    if mode == "100755" && !bytes.starts_with(b"#!") {
        return Some("executable, but not a script".into());
    }
    None
}

#[test]
fn no_tracked_file_is_build_output_a_binary_or_over_one_mib() {
    let files = tracked();
    assert!(
        files.len() > 50,
        "git lists {} files: not this repository",
        files.len()
    );
    let bad: Vec<String> = files
        .iter()
        .filter_map(|(mode, path)| {
            why_not_source(mode, path).map(|why| format!("{}: {why}", path.display()))
        })
        .collect();
    assert!(
        bad.is_empty(),
        "tracked files that are not sources:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_checks_catch_a_large_file_an_elf_and_an_executable_that_is_not_a_script() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let cases = [
        ("large", vec![b'a'; 1024 * 1024 + 1], "100644", "over"),
        (
            "elf",
            b"\x7fELF\x02\x01\x01".to_vec(),
            "100644",
            "executable binary",
        ),
        ("tool", b"plain text".to_vec(), "100755", "not a script"),
    ];
    for (name, content, mode, expected) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, content).expect("writing a case");
        let why = why_not_source(mode, &path).unwrap_or_default();
        assert!(why.contains(expected), "{name}: {why:?}");
    }
    let script = dir.path().join("script");
    std::fs::write(&script, "#!/bin/sh\n").expect("writing a script");
    assert_eq!(why_not_source("100755", &script), None);
}

#[test]
fn target_directories_are_ignored_wherever_they_appear() {
    for path in [
        "target/debug/node-holder",
        "testenv/controlplane/target/check/etcd",
        "xtask/target/x",
    ] {
        let out = git(&["check-ignore", "--no-index", "-q", path]);
        assert!(out.status.success(), "{path} is not ignored: {out:?}");
    }
}

/// The text of a Markdown document outside its fenced code blocks.
fn prose(text: &str) -> Vec<&str> {
    let mut fenced = false;
    text.lines()
        .filter(|line| {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}

/// GitHub's anchor of a heading: lower case, spaces as hyphens, every other
/// character but letters, digits, `_` and `-` dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '_' || c == '-' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a Markdown document's headings.
fn anchors(text: &str) -> BTreeSet<String> {
    prose(text)
        .into_iter()
        .filter_map(|line| {
            let heading = line.trim_start_matches('#');
            (heading.len() < line.len() && heading.starts_with(' ')).then(|| anchor(heading))
        })
        .collect()
}

/// The links of `document` (at `path`, relative to the repository's root)
/// that lead nowhere: a relative `[text](target#anchor)` whose file is
/// missing, or whose anchor no heading of that Markdown file has. Links to
/// other sites are not followed.
fn broken_links(path: &Path, document: &str) -> Vec<String> {
    let mut broken = Vec::new();
    for line in prose(document) {
        for (at, _) in line.match_indices("](") {
            let link = line[at + 2..]
                .split(|c: char| c == ')' || c.is_whitespace())
                .next()
                .unwrap_or_default();
            if link.is_empty() || link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            let (file, fragment) = link.split_once('#').unwrap_or((link, ""));
            let text = if file.is_empty() {
                document.to_string()
            } else {
                let target = root()
                    .join(path.parent().unwrap_or(Path::new("")))
                    .join(file);
                if !target.exists() {
                    broken.push(format!("{}: {link}: no such file", path.display()));
                    continue;
                }
                if target.extension().is_none_or(|e| e != "md") || target.is_dir() {
                    continue;
                }
                std::fs::read_to_string(&target).unwrap_or_default()
            };
            if !fragment.is_empty() && !anchors(&text).contains(fragment) {
                broken.push(format!("{}: {link}: no such heading", path.display()));
            }
        }
    }
    broken
}

#[test]
fn every_relative_link_of_the_documents_leads_to_a_file_and_a_heading() {
    let broken: Vec<String> = tracked()
        .iter()
        .filter(|(_, path)| path.extension().is_some_and(|e| e == "md"))
        .filter_map(|(_, path)| {
            let text = std::fs::read_to_string(root().join(path)).ok()?;
            Some(broken_links(path, &text))
        })
        .flatten()
        .collect();
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_link_check_finds_a_missing_file_and_a_missing_heading_and_reads_anchors_as_github() {
    assert_eq!(
        anchor("Every day at `WhenEmpty`, and the pool-wide hold, run 2026-11-26"),
        "every-day-at-whenempty-and-the-pool-wide-hold-run-2026-11-26"
    );
    assert_eq!(anchor("50,000 nodes: the budget"), "50000-nodes-the-budget");
    let document = "# Title\n\n[here](#title) [there](benchmarks.md#the-chaos-soak) \
                    [web](https://example.com/x) [gone](nowhere.md) [nope](benchmarks.md#nope) \
                    [not here](#nope)\n```\n[in code](nowhere.md)\n```\n";
    let broken = broken_links(Path::new("docs/x.md"), document);
    assert_eq!(
        broken,
        [
            "docs/x.md: nowhere.md: no such file",
            "docs/x.md: benchmarks.md#nope: no such heading",
            "docs/x.md: #nope: no such heading",
        ],
    );
}

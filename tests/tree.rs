//! The repository holds sources, not build output: every clone pays for what
//! is tracked. These tests read git's index of the checkout they run in.

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

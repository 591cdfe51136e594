//! The library's folders are its layers, top down: interposition (`lib.rs`, `interpose.rs`),
//! `dispatch/`, `socket/`, `smc/` (the SMC connection core), `shm/`; `util/` is a leaf every
//! layer may use. A layer uses only the layers below it and itself: this test reads the
//! sources and fails on a `crate::` path (code, not comments) that reaches up. Inside the
//! `dispatch/` and `socket/` folders the files are ordered the same way ([`FOLDER_ORDER`]).
// Test code: a failed unwrap fails the test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

/// The layer of a folder (or top-level file), 1 = top.
fn layer_of_file(rel: &Path) -> u8 {
    match rel.components().next().and_then(|c| c.as_os_str().to_str()) {
        Some("dispatch") => 2,
        Some("socket") => 3,
        Some("smc") => 4,
        Some("shm") => 5,
        Some("util") => 6,
        _ => 1,
    }
}

/// The layer of a name right after `crate::`.
fn layer_of_name(name: &str) -> Option<u8> {
    Some(match name {
        "dispatch" | "ops" | "lifecycle" => 2,
        "socket" | "daemon" | "epoll" | "epoll_set" | "fdtable" | "handshake" | "member"
        | "obj" | "poll" | "policy" | "ready" | "setup" | "stats" => 3,
        "smc" | "conn" | "dmbs" | "iov" => 4,
        "shm" => 5,
        "util" | "forklock" | "log" | "real" | "signals" | "pid" | "reset_pid" | "PID"
        | "debug" => 6,
        _ => return None,
    })
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The names a line of code takes from the crate root: `crate::a::..`, and the top-level
/// names of a `use crate::{a, b::{..}}` group (which may span lines: `group` carries it).
fn crate_names(code: &str, group: &mut Option<(usize, String)>) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = code;
    if let Some((depth, buf)) = group.as_mut() {
        // Inside a `use crate::{` group: collect until its braces close.
        for ch in code.chars() {
            match ch {
                '{' => *depth += 1,
                '}' => *depth -= 1,
                _ => {}
            }
            if *depth == 0 {
                break;
            }
            if *depth == 1 {
                buf.push(ch);
            } else {
                buf.push(' ');
            }
        }
        if *depth == 0 {
            let (_, buf) = group.take().unwrap();
            names.extend(top_names(&buf));
        }
        return names;
    }
    while let Some(i) = rest.find("crate::") {
        let after = &rest[i + 7..];
        if let Some(g) = after.strip_prefix('{') {
            let mut depth = 1usize;
            let mut buf = String::new();
            for ch in g.chars() {
                match ch {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    _ => {}
                }
                if depth == 0 {
                    break;
                }
                buf.push(if depth == 1 { ch } else { ' ' });
            }
            if depth == 0 {
                names.extend(top_names(&buf));
            } else {
                *group = Some((depth, buf));
                return names;
            }
        } else {
            let n: String = after
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            names.push(n);
        }
        rest = &rest[i + 7..];
    }
    names
}

/// `a, b::c, d::{..}` → a, b, d.
fn top_names(group: &str) -> Vec<String> {
    group
        .split(',')
        .filter_map(|item| {
            let n: String = item
                .trim()
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            (!n.is_empty()).then_some(n)
        })
        .collect()
}

#[test]
fn no_layer_uses_a_layer_above_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &mut files);
    assert!(
        files.len() > 10,
        "sources not found under {}",
        root.display()
    );
    let mut bad = Vec::new();
    let mut unknown = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(&root).unwrap();
        let own = layer_of_file(rel);
        let text = std::fs::read_to_string(f).unwrap();
        let mut group = None;
        for (no, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for name in crate_names(code, &mut group) {
                match layer_of_name(&name) {
                    Some(l) if l < own => bad.push(format!(
                        "{}:{}: layer {own} uses crate::{name} (layer {l})",
                        rel.display(),
                        no + 1
                    )),
                    Some(_) => {}
                    // Items of the crate root (lib.rs) are the top layer's.
                    None if own > 1 => unknown.push(format!(
                        "{}:{}: crate::{name} is in no layer",
                        rel.display(),
                        no + 1
                    )),
                    None => {}
                }
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "names outside the layer map:\n{}",
        unknown.join("\n")
    );
    assert!(bad.is_empty(), "uses of a layer above:\n{}", bad.join("\n"));
}

/// Inside a folder the files are layers too, top down (a file uses those after it).
const FOLDER_ORDER: &[(&str, &[&str])] = &[
    ("dispatch", &["ops", "lifecycle"]),
    (
        "socket",
        &[
            "poll",
            "epoll",
            "setup",
            "ready",
            "fdtable",
            "obj",
            "epoll_set",
            "handshake",
            "member",
            "policy",
            "daemon",
            "stats",
        ],
    ),
];

#[test]
fn no_file_uses_one_above_it_in_its_folder() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut bad = Vec::new();
    for (folder, order) in FOLDER_ORDER {
        let mut files = Vec::new();
        sources(&root.join(folder), &mut files);
        for f in &files {
            let rel = f.strip_prefix(root.join(folder)).unwrap();
            // `handshake/tests.rs` is handshake's.
            let own = rel
                .components()
                .next()
                .and_then(|c| c.as_os_str().to_str())
                .unwrap()
                .trim_end_matches(".rs");
            let Some(own_at) = order.iter().position(|n| *n == own) else {
                assert_eq!(own, "mod", "{folder}/{} is in no order", rel.display());
                continue;
            };
            let text = std::fs::read_to_string(f).unwrap();
            let mut group = None;
            for (no, line) in text.lines().enumerate() {
                let code = line.split("//").next().unwrap_or("");
                for name in crate_names(code, &mut group) {
                    let Some(at) = order.iter().position(|n| *n == name) else {
                        continue;
                    };
                    if at >= own_at {
                        continue;
                    }
                    bad.push(format!(
                        "{folder}/{}:{}: {own} uses crate::{name}, above it",
                        rel.display(),
                        no + 1
                    ));
                }
            }
        }
    }
    assert!(bad.is_empty(), "uses of a file above:\n{}", bad.join("\n"));
}

//! The modules of cairn-md import one another without a circle.
//!
//! Each source file under `src/` is a module (`src/a.rs` and `src/a/b.rs` are `a` and
//! `a::b`; `lib.rs`, the root, declares and re-exports, and is left out). A module
//! depends on another when its code (comments and its `#[cfg(test)]` part left out)
//! names a path into it: `crate::a::b::X` points at the longest module that exists
//! (`a::b`, else `a`), `super::X` at the parent. A child is not a dependency of its
//! parent merely by being declared in it. The test fails with the circle it finds.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

fn modules(dir: &Path, prefix: &str, out: &mut BTreeMap<String, String>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("read src")
        .map(|e| e.expect("entry").path())
        .collect();
    entries.sort();
    for p in entries {
        let name = p.file_stem().expect("name").to_string_lossy().to_string();
        let module = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}::{name}")
        };
        if p.is_dir() {
            modules(&p, &module, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            if prefix.is_empty() && name == "lib" {
                continue;
            }
            let module = module.trim_end_matches("::mod").to_string();
            out.insert(module, std::fs::read_to_string(&p).expect("read"));
        }
    }
}

/// The code of a file without comments and without its test part.
fn code(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let t = line.trim_start();
        if t.starts_with("#[cfg(test)]") {
            break;
        }
        if t.starts_with("//") {
            continue;
        }
        let line = match line.find("//") {
            // A `//` inside a string ("http://") is rare here; cutting it loses no path.
            Some(i) => &line[..i],
            None => line,
        };
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// Every path that follows `crate::` or `super::`, as its segments (a `{...}` group
/// gives one path per member, one level deep is enough here).
fn paths(code: &str, anchor: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find(anchor) {
        let before = rest[..i].chars().last();
        rest = &rest[i + anchor.len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let mut segs = Vec::new();
        let mut s = rest;
        loop {
            let end = s
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(s.len());
            if end == 0 {
                if let Some(group) = s.strip_prefix('{') {
                    let close = group.find('}').unwrap_or(group.len());
                    for member in group[..close].split(',') {
                        let mut p = segs.clone();
                        p.extend(
                            member
                                .trim()
                                .split("::")
                                .map(|x| x.trim().to_string())
                                .filter(|x| !x.is_empty()),
                        );
                        out.push(p);
                    }
                    segs.clear();
                }
                break;
            }
            segs.push(s[..end].to_string());
            s = &s[end..];
            match s.strip_prefix("::") {
                Some(r) => s = r,
                None => break,
            }
        }
        if !segs.is_empty() {
            out.push(segs);
        }
    }
    out
}

#[test]
fn md_modules_form_a_dag() {
    // MD_DAG_SRC: check another tree's src/ (to see the test catch a circle).
    let src = std::env::var_os("MD_DAG_SRC").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        std::path::PathBuf::from,
    );
    let mut files = BTreeMap::new();
    modules(&src, "", &mut files);
    let mut deps: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, text) in &files {
        let code = code(text);
        let mut targets = BTreeSet::new();
        for p in paths(&code, "crate::") {
            // The longest prefix that is a module.
            let mut best = None;
            for n in 1..=p.len() {
                let m = p[..n].join("::");
                if files.contains_key(&m) {
                    best = Some(m);
                }
            }
            if let Some(m) = best {
                targets.insert(m);
            }
        }
        if !paths(&code, "super::").is_empty() {
            if let Some((parent, _)) = module.rsplit_once("::") {
                targets.insert(parent.to_string());
            }
        }
        // A module naming its own children or itself is no dependency.
        targets.retain(|t| t != module && !t.starts_with(&format!("{module}::")));
        deps.insert(module.clone(), targets);
    }
    // Depth-first search for a back edge.
    fn visit(
        m: &str,
        deps: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match state.get(m) {
            Some(2) => return None,
            Some(1) => {
                let at = stack.iter().position(|x| x == m).unwrap_or(0);
                let mut circle = stack[at..].to_vec();
                circle.push(m.to_string());
                return Some(circle);
            }
            _ => {}
        }
        state.insert(m.to_string(), 1);
        stack.push(m.to_string());
        for d in deps.get(m).into_iter().flatten() {
            if let Some(c) = visit(d, deps, state, stack) {
                return Some(c);
            }
        }
        stack.pop();
        state.insert(m.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for m in deps.keys() {
        let mut stack = Vec::new();
        if let Some(circle) = visit(m, &deps, &mut state, &mut stack) {
            let graph: Vec<String> = deps
                .iter()
                .map(|(m, d)| {
                    format!(
                        "  {m} -> {}",
                        d.iter().cloned().collect::<Vec<_>>().join(", ")
                    )
                })
                .collect();
            panic!(
                "import circle in cairn-md: {}\nthe graph:\n{}",
                circle.join(" -> "),
                graph.join("\n")
            );
        }
    }
}

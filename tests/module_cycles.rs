//! No import cycles between the library's top-level modules (each `src/<name>.rs` or
//! `src/<name>/`): a module may use the ones below it, never one that uses it back. Read from
//! the `crate::…` paths of the sources, comments and in-file test modules left out (a test
//! may reach anywhere). The binary's `cli/` sits above everything and is not counted.
//!
//! `KNOWN` lists the cycles still to break (docs/architecture.md, "Layers"); a new cycle fails
//! with the edges and files that make it, and a broken one fails until it leaves the list.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Cycles that remain, each as its sorted modules: none. Keep it so; a cycle that must stay for
/// a while goes here with the reason.
const KNOWN: &[&[&str]] = &[];

fn rust_files(path: &Path, out: &mut Vec<PathBuf>) {
    if path.is_dir() {
        let mut entries: Vec<_> = std::fs::read_dir(path).unwrap().map(|e| e.unwrap().path()).collect();
        entries.sort();
        for e in entries {
            rust_files(&e, out);
        }
    } else if path.extension().is_some_and(|e| e == "rs") {
        out.push(path.to_path_buf());
    }
}

/// `source` without its in-file test module (by convention the file's last item) and without
/// line comments.
fn code(source: &str) -> String {
    let mut end = source.len();
    let mut from = 0;
    while let Some(i) = source[from..].find("#[cfg(test)]") {
        let at = from + i;
        let rest = source[at + "#[cfg(test)]".len()..].trim_start();
        if ["mod ", "pub mod ", "pub(crate) mod "].iter().any(|p| rest.starts_with(p)) {
            end = at;
            break;
        }
        from = at + 1;
    }
    source[..end].lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n")
}

fn identifier(s: &str) -> &str {
    let n = s.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(s.len());
    &s[..n]
}

/// The top-level modules `code` names through `crate::…` paths, `crate::{a, b::c}` included.
fn named_modules(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0;
            let mut item_start = true;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if item_start && !c.is_whitespace() => {
                        out.insert(identifier(&group[j..]).to_string());
                        item_start = false;
                    }
                    _ => {}
                }
            }
        } else {
            out.insert(identifier(rest).to_string());
        }
    }
    out
}

/// Tarjan's strongly connected components with more than one module.
fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct State<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        found: Vec<Vec<String>>,
    }
    fn visit<'a>(v: &'a str, s: &mut State<'a>) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        for w in &s.edges[v] {
            if !s.index.contains_key(w.as_str()) {
                visit(w, s);
                let lw = s.low[w.as_str()];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if s.stack.contains(&w.as_str()) {
                let iw = s.index[w.as_str()];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = vec![];
            loop {
                let w = s.stack.pop().unwrap();
                component.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.found.push(component);
            }
        }
    }
    let mut s = State { edges, index: BTreeMap::new(), low: BTreeMap::new(), stack: vec![], found: vec![] };
    for v in edges.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(v, &mut s);
        }
    }
    s.found.sort();
    s.found
}

#[test]
fn top_level_modules_have_no_import_cycles() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut modules: BTreeMap<String, PathBuf> = BTreeMap::new();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        if !["lib", "main", "cli"].contains(&name.as_str())
            && (path.is_dir() || path.extension().is_some_and(|e| e == "rs"))
        {
            modules.insert(name, path);
        }
    }
    assert!(modules.len() > 20 && modules.contains_key("trainer"), "read the modules of {}", src.display());
    let mut edges: BTreeMap<String, BTreeSet<String>> = modules.keys().map(|m| (m.clone(), BTreeSet::new())).collect();
    let mut via: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for (name, path) in &modules {
        let mut files = vec![];
        rust_files(path, &mut files);
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            for target in named_modules(&code(&text)) {
                if target != *name && modules.contains_key(&target) {
                    edges.get_mut(name).unwrap().insert(target.clone());
                    let shown = file.strip_prefix(&src).unwrap().display().to_string();
                    via.entry((name.clone(), target)).or_default().insert(shown);
                }
            }
        }
    }
    let found = cycles(&edges);
    let known: Vec<Vec<String>> = KNOWN.iter().map(|c| c.iter().map(|m| m.to_string()).collect()).collect();
    let describe = |cycle: &Vec<String>| -> String {
        let mut lines = vec![format!("cycle {cycle:?}:")];
        for a in cycle {
            for b in cycle {
                if let Some(files) = via.get(&(a.clone(), b.clone())) {
                    lines.push(format!("  {a} -> {b} in {files:?}"));
                }
            }
        }
        lines.join("\n")
    };
    let new: Vec<String> = found.iter().filter(|c| !known.contains(c)).map(describe).collect();
    assert!(
        new.is_empty(),
        "import cycles between top-level modules (move the shared piece down, or pass it in):\n{}",
        new.join("\n")
    );
    let gone: Vec<&Vec<String>> = known.iter().filter(|c| !found.contains(c)).collect();
    assert!(gone.is_empty(), "no longer cycles, remove them from KNOWN in {}: {gone:?}", file!());
}

#[test]
fn the_reader_sees_grouped_paths_and_skips_comments_and_tests() {
    let src = "use crate::{a::X, b, c::{d::Y, e}};\n// crate::f\nfn g() { crate::h::k(); }\n#[cfg(test)]\nmod tests { use crate::z; }\n";
    let names: Vec<String> = named_modules(&code(src)).into_iter().collect();
    assert_eq!(names, ["a", "b", "c", "h"]);
    let mut edges = BTreeMap::new();
    for (a, b) in [("x", "y"), ("y", "z"), ("z", "x"), ("z", "w"), ("w", "w")] {
        edges.entry(a.to_string()).or_insert_with(BTreeSet::new).insert(b.to_string());
        edges.entry(b.to_string()).or_insert_with(BTreeSet::new);
    }
    assert_eq!(cycles(&edges), vec![vec!["x".to_string(), "y".into(), "z".into()]]);
}

//! House rules of the generic trainer (`src/trainer/`, docs/architecture.md): every function
//! fits on a screen (at most 60 lines, the staged step stays readable as a list of stages),
//! and the trainer reaches neither the tiny agents nor model resolution (the session hands it
//! loadable models, `trainer::Inputs`).

use std::path::Path;

const MAX_LINES: usize = 60;

fn trainer_sources() -> Vec<(String, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/trainer");
    let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    let files: Vec<_> = files.into_iter().filter(|p| p.extension().is_some_and(|e| e == "rs")).collect();
    assert!(files.len() >= 4, "expected the trainer's files in {}", dir.display());
    files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            // In-file tests (the file's last item) are not the trainer.
            let code = text.split("\n#[cfg(test)]").next().unwrap().to_string();
            (p.file_name().unwrap().to_string_lossy().into_owned(), code)
        })
        .collect()
}

/// Each `fn` with its length in lines, from its signature to the closing brace at the same
/// indentation (rustfmt's layout).
fn functions(code: &str) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = code.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        let is_fn = ["fn ", "pub fn ", "pub(crate) fn ", "pub(super) fn "].iter().any(|p| trimmed.starts_with(p));
        if !is_fn {
            i += 1;
            continue;
        }
        let name: String =
            trimmed.split("fn ").nth(1).unwrap().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        // A declaration without a body (a trait's required method) ends in `;`.
        let mut open = i;
        while open < lines.len() && !lines[open].trim_end().ends_with('{') && !lines[open].trim_end().ends_with(';') {
            open += 1;
        }
        if open == lines.len() || lines[open].trim_end().ends_with(';') {
            i = open + 1;
            continue;
        }
        let close = (open + 1..lines.len())
            .find(|&k| {
                let l = lines[k];
                l.len() - l.trim_start().len() == indent && l.trim_start().starts_with('}')
            })
            .unwrap_or_else(|| panic!("no closing brace for fn {name}"));
        out.push((name, i + 1, close - i + 1));
        i = close + 1;
    }
    out
}

#[test]
fn no_trainer_function_is_longer_than_sixty_lines() {
    let mut long = Vec::new();
    let mut counted = 0;
    for (file, code) in trainer_sources() {
        for (name, line, length) in functions(&code) {
            counted += 1;
            if length > MAX_LINES {
                long.push(format!("src/trainer/{file}:{line} {name}: {length} lines"));
            }
        }
    }
    assert!(counted > 30, "only {counted} functions found: the scan is broken");
    assert!(long.is_empty(), "split these (at most {MAX_LINES} lines each):\n{}", long.join("\n"));
}

#[test]
fn the_counter_sees_a_long_function() {
    let body = "    let x = 1;\n".repeat(70);
    let code = format!(
        "impl A {{\n    fn short() {{\n    }}\n\n    pub fn long(\n        a: u8,\n    ) {{\n{body}    }}\n}}\n"
    );
    let found = functions(&code);
    assert_eq!(found.iter().map(|(n, _, l)| (n.as_str(), *l)).collect::<Vec<_>>(), [("short", 2), ("long", 74)]);
}

#[test]
fn the_trainer_reaches_neither_the_tiny_agents_nor_model_resolution() {
    for (file, code) in trainer_sources() {
        for banned in ["crate::tiny", "crate::resolve"] {
            assert!(
                !code.contains(banned),
                "src/trainer/{file} uses {banned}: hand the trainer resolved models (trainer::Inputs)"
            );
        }
    }
}

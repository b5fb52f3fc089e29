//! The pool's top-level modules form no import cycle (outside tests): each names, with
//! `crate::…`, only modules below it, so each can be read and changed knowing only those.
//! A cycle this finds is printed with the files that close it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The source without comments and without a trailing `#[cfg(test)] mod … { … }`.
fn code(text: &str) -> String {
    let text = text.split("#[cfg(test)]\nmod ").next().unwrap_or(text);
    text.lines()
        .map(|line| line.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level modules named with `crate::name` or `crate::{name, …}`.
fn named(code: &str) -> BTreeSet<String> {
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut names = BTreeSet::new();
    for rest in code.split("crate::").skip(1) {
        if let Some(group) = rest.strip_prefix('{') {
            let group = group.split('}').next().unwrap_or("");
            // Top-level items of the group: what follows the start or a comma at depth 0.
            let mut depth = 0;
            let mut start = true;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => start = true,
                    c if start && !c.is_whitespace() => {
                        names.insert(ident(&group[i..]));
                        start = false;
                    }
                    _ => {}
                }
            }
        } else {
            names.insert(ident(rest));
        }
    }
    names
}

#[test]
fn the_pools_modules_form_no_import_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    // Each file's top-level module: `src/x.rs` and everything under `src/x/`.
    let module_of = |path: &Path| -> Option<String> {
        let relative = path.strip_prefix(&src).ok()?;
        let first = relative.components().next()?.as_os_str().to_str()?;
        Some(first.trim_end_matches(".rs").to_owned())
    };
    let modules: BTreeSet<String> = files
        .iter()
        .filter_map(|f| module_of(f))
        .filter(|m| m != "lib")
        .collect();
    let mut uses: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for file in &files {
        let Some(module) = module_of(file).filter(|m| m != "lib") else {
            continue;
        };
        let name = file.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name == "tests.rs" || name == "interleavings.rs" || name == "fake.rs" {
            continue;
        }
        let text = std::fs::read_to_string(file).expect("a readable source file");
        for other in named(&code(&text)) {
            if other != module && modules.contains(&other) {
                uses.entry(module.clone())
                    .or_default()
                    .entry(other)
                    .or_default()
                    .insert(
                        file.strip_prefix(&src)
                            .unwrap_or(file)
                            .display()
                            .to_string(),
                    );
            }
        }
    }
    // A path back to `from` through `uses`, if there is one.
    fn back_to(
        uses: &BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
        from: &str,
        at: &str,
        path: &mut Vec<String>,
        seen: &mut BTreeSet<String>,
    ) -> bool {
        for next in uses.get(at).map(|m| m.keys()).into_iter().flatten() {
            path.push(next.clone());
            if next == from || (seen.insert(next.clone()) && back_to(uses, from, next, path, seen))
            {
                return true;
            }
            path.pop();
        }
        false
    }
    for module in &modules {
        let mut path = vec![module.clone()];
        if back_to(&uses, module, module, &mut path, &mut BTreeSet::new()) {
            let edges: Vec<String> = path
                .windows(2)
                .map(|pair| format!("{} -> {}: {:?}", pair[0], pair[1], uses[&pair[0]][&pair[1]]))
                .collect();
            panic!(
                "an import cycle: {}\n{}",
                path.join(" -> "),
                edges.join("\n")
            );
        }
    }
}

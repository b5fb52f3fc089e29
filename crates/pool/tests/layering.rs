//! No import cycle between sibling modules, in any directory of the pool's sources nor of
//! the workspace's other crates (outside tests). In each directory, the modules side by
//! side (`x.rs` together with everything under `x/`) name each other, with `crate::…` or
//! `super::…`, in one direction only, so that each can be read and changed knowing only
//! those below it. A cycle this finds is printed as its chain of modules, each step with
//! the files that take it.
//!
//! Paths are read as text, after comments and inline `#[cfg(test)] mod … { … }` blocks are
//! removed; modules declared `#[cfg(test)] mod x;` are left out whole. A sibling reached
//! through a re-export of the parent (`super::Name` where the parent has `use x::Name`) is
//! not seen: name the module that owns an item.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};

/// A module's path from its crate's root: `["actor", "jobs"]` for `src/actor/jobs.rs`.
type ModulePath = Vec<String>;

/// In one directory (by its module path): from a module, to a sibling, the files that
/// name the sibling.
type Uses = BTreeMap<ModulePath, BTreeMap<String, BTreeMap<String, BTreeSet<String>>>>;

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

/// The module a file is, from its path under `src`: `lib.rs` and `main.rs` are the root,
/// `x/mod.rs` is `x`.
fn module_of(src: &Path, file: &Path) -> ModulePath {
    let relative = file.strip_prefix(src).unwrap_or(file).with_extension("");
    let mut module: ModulePath = relative
        .components()
        .filter_map(|c| c.as_os_str().to_str().map(str::to_owned))
        .collect();
    if module.last().is_some_and(|last| last == "mod")
        || (module.len() == 1 && (module[0] == "lib" || module[0] == "main"))
    {
        module.pop();
    }
    module
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The identifier `text` starts with (after white space), and what follows it.
fn ident(text: &str) -> (&str, &str) {
    let text = text.trim_start();
    let end = text.find(|c: char| !is_ident(c)).unwrap_or(text.len());
    text.split_at(end)
}

/// The source without line comments and without inline `#[cfg(test)] mod name { … }`.
fn code(text: &str) -> String {
    let text: String = text
        .lines()
        .map(|line| line.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let mut kept = String::new();
    let mut rest = text.as_str();
    while let Some(at) = rest.find("#[cfg(test)]") {
        let after = &rest[at + "#[cfg(test)]".len()..];
        let (keyword, tail) = ident(after);
        let (_, tail) = ident(tail);
        let inline = keyword == "mod" && tail.trim_start().starts_with('{');
        if !inline {
            kept.push_str(&rest[..at + 1]);
            rest = &rest[at + 1..];
            continue;
        }
        kept.push_str(&rest[..at]);
        // Skip to the brace that closes the module's.
        let body = tail.trim_start();
        let mut depth = 0;
        let mut end = body.len();
        for (i, c) in body.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = i + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        rest = &body[end..];
    }
    kept.push_str(rest);
    kept
}

/// The modules a file declares `#[cfg(test)] mod name;`.
fn test_only_children(code: &str) -> Vec<String> {
    code.split("#[cfg(test)]")
        .skip(1)
        .filter_map(|after| {
            let (keyword, tail) = ident(after);
            let (name, tail) = ident(tail);
            (keyword == "mod" && tail.trim_start().starts_with(';')).then(|| name.to_owned())
        })
        .collect()
}

/// The paths a use-tree names, below `base`: `a::{b, c::{d, self}}` gives `a::b`, `a::c::d`
/// and `a::c`.
fn tree(text: &str, base: &ModulePath, out: &mut Vec<ModulePath>) {
    let text = text.trim_start();
    if let Some(group) = text.strip_prefix('{') {
        // The group's items: split at commas outside nested braces, up to its closing brace.
        let mut depth = 0;
        let mut start = 0;
        for (i, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    tree(&group[start..i], base, out);
                    return;
                }
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    tree(&group[start..i], base, out);
                    start = i + 1;
                }
                _ => {}
            }
        }
        return;
    }
    let (name, rest) = ident(text);
    if name.is_empty() || name == "self" {
        out.push(base.clone());
        return;
    }
    let mut path = base.clone();
    path.push(name.to_owned());
    match rest.trim_start().strip_prefix("::") {
        Some(rest) => tree(rest, &path, out),
        None => out.push(path),
    }
}

/// The paths that `code`, the code of `module`, names from its crate's root: each
/// `crate::…` and `super::…` (`super::super::…` too), with their groups.
fn named(code: &str, module: &ModulePath) -> Vec<ModulePath> {
    let mut paths = Vec::new();
    for (at, _) in code.match_indices("::") {
        let before = &code[..at];
        let (start, keyword) = match before.rfind(|c: char| !is_ident(c)) {
            Some(i) => (i + 1, &before[i + 1..]),
            None => (0, before),
        };
        // Only the first segment of a path: not `x::crate`, nor the second `super`.
        if before[..start].ends_with("::") {
            continue;
        }
        let mut rest = &code[at + 2..];
        let base = match keyword {
            "crate" => Vec::new(),
            "super" => {
                let mut ups = 1;
                while let Some(after) = rest.strip_prefix("super::") {
                    ups += 1;
                    rest = after;
                }
                match module.len().checked_sub(ups) {
                    Some(len) => module[..len].to_vec(),
                    None => continue,
                }
            }
            _ => continue,
        };
        tree(rest, &base, &mut paths);
    }
    paths
}

/// Who names whom among sibling modules, in every directory under `src`; each file is
/// shown by its path under `shown_from`.
fn uses_in(src: &Path, shown_from: &Path) -> Uses {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.sort();
    let mut sources = Vec::new();
    let mut test_only: BTreeSet<ModulePath> = BTreeSet::new();
    // Each directory's modules (by the directory's module path).
    let mut modules: BTreeMap<ModulePath, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let module = module_of(src, file);
        let text = std::fs::read_to_string(file).expect("a readable source file");
        let code = code(&text);
        for child in test_only_children(&code) {
            let mut path = module.clone();
            path.push(child);
            test_only.insert(path);
        }
        for len in 1..=module.len() {
            modules
                .entry(module[..len - 1].to_vec())
                .or_default()
                .insert(module[len - 1].clone());
        }
        let shown = file.strip_prefix(shown_from).unwrap_or(file);
        sources.push((module, code, shown.display().to_string()));
    }
    let is_test = |path: &[String]| (1..=path.len()).any(|len| test_only.contains(&path[..len]));
    for (dir, names) in modules.iter_mut() {
        names.retain(|name| {
            let mut path = dir.clone();
            path.push(name.clone());
            !is_test(&path)
        });
    }
    let mut uses = Uses::new();
    for (module, code, shown) in &sources {
        if is_test(module) {
            continue;
        }
        for path in named(code, module) {
            // The directory where the two paths part: there the file's module names a sibling.
            let common = module.iter().zip(&path).take_while(|(a, b)| a == b).count();
            if common >= module.len() || common >= path.len() {
                continue;
            }
            let dir = module[..common].to_vec();
            let (from, to) = (&module[common], &path[common]);
            if modules.get(&dir).is_some_and(|names| names.contains(to)) {
                uses.entry(dir)
                    .or_default()
                    .entry(from.clone())
                    .or_default()
                    .entry(to.clone())
                    .or_default()
                    .insert(shown.clone());
            }
        }
    }
    uses
}

/// The shortest way from `module` back to itself in `uses` (one directory's), if any.
fn cycle_through(
    uses: &BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
    module: &str,
) -> Option<Vec<String>> {
    let mut came_from: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue = VecDeque::from([module]);
    while let Some(at) = queue.pop_front() {
        for next in uses.get(at).map(|m| m.keys()).into_iter().flatten() {
            if next == module {
                let mut chain = vec![module.to_owned(), at.to_owned()];
                let mut step = at;
                while step != module {
                    step = came_from[step];
                    chain.push(step.to_owned());
                }
                // Built backwards: module <- at <- … <- module.
                chain.reverse();
                return Some(chain);
            }
            if !came_from.contains_key(next.as_str()) {
                came_from.insert(next, at);
                queue.push_back(next);
            }
        }
    }
    None
}

/// Every import cycle between sibling modules under `src`, one description each: the
/// directory, the chain, and the files that take each step.
fn cycles_in(src: &Path, shown_from: &Path) -> Vec<String> {
    let uses = uses_in(src, shown_from);
    let mut found = Vec::new();
    for (dir, uses) in &uses {
        let mut reported: BTreeSet<BTreeSet<String>> = BTreeSet::new();
        for module in uses.keys() {
            let Some(chain) = cycle_through(uses, module) else {
                continue;
            };
            if !reported.insert(chain.iter().cloned().collect()) {
                continue;
            }
            let directory = src.join(dir.join("/"));
            let steps: Vec<String> = chain
                .windows(2)
                .map(|pair| {
                    let files: Vec<&str> = uses[&pair[0]][&pair[1]]
                        .iter()
                        .map(String::as_str)
                        .collect();
                    format!("  {} -> {}: {}", pair[0], pair[1], files.join(", "))
                })
                .collect();
            found.push(format!(
                "in {}: {}\n{}",
                directory
                    .strip_prefix(shown_from)
                    .unwrap_or(&directory)
                    .display(),
                chain.join(" -> "),
                steps.join("\n")
            ));
        }
    }
    found
}

/// This crate's directory, and the workspace's (two up), without `..` so that paths under
/// either can be shown relative to the workspace.
fn crate_and_workspace() -> (PathBuf, PathBuf) {
    let manifest =
        std::fs::canonicalize(env!("CARGO_MANIFEST_DIR")).expect("the crate's directory");
    let root = manifest
        .parent()
        .and_then(Path::parent)
        .unwrap_or(&manifest)
        .to_path_buf();
    (manifest, root)
}

#[test]
fn no_directory_of_the_pool_has_an_import_cycle() {
    let (manifest, root) = crate_and_workspace();
    let cycles = cycles_in(&manifest.join("src"), &root);
    assert!(cycles.is_empty(), "import cycles:\n{}", cycles.join("\n"));
}

#[test]
fn no_directory_of_the_other_crates_has_an_import_cycle() {
    let (manifest, root) = crate_and_workspace();
    if manifest != root.join("crates/pool") {
        // The crate alone (as `cargo package` builds it): no workspace around it to read.
        eprintln!("not in the workspace's checkout: no other crate to read");
        return;
    }
    let mut sources = vec![root.join("src")];
    for entry in std::fs::read_dir(root.join("crates")).expect("the workspace's crates/") {
        let dir = entry.expect("an entry of crates/").path();
        if dir != manifest {
            sources.push(dir.join("src"));
        }
    }
    sources.sort();
    // The workspace's crates, not only what is left when some are missing.
    assert!(sources.len() >= 5, "crates read: {sources:?}");
    let cycles: Vec<String> = sources
        .iter()
        .flat_map(|src| cycles_in(src, &root))
        .collect();
    assert!(cycles.is_empty(), "import cycles:\n{}", cycles.join("\n"));
}

/// The reader itself: paths in groups and through `super`, test modules left out.
#[test]
fn the_reader_sees_what_a_file_names() {
    let module: ModulePath = vec!["actor".into(), "jobs".into()];
    let text = "use super::backend::{Backend, Monitor};\n\
                use super::{client, start::{Target, Up}};\n\
                use crate::{state::Built, template};\n\
                // use super::server::Gone;\n\
                fn f() { super::super::names::quote(); x::crate::y(); }\n\
                #[cfg(test)]\nmod fake;\n\
                #[cfg(test)]\nmod tests {\n    use super::super::leases::Grant;\n}\n";
    let code = code(text);
    assert_eq!(test_only_children(&code), vec!["fake".to_owned()]);
    let named: BTreeSet<String> = named(&code, &module)
        .into_iter()
        .map(|path| path.join("::"))
        .collect();
    let expected: BTreeSet<String> = [
        "actor::backend::Backend",
        "actor::backend::Monitor",
        "actor::client",
        "actor::start::Target",
        "actor::start::Up",
        "state::Built",
        "template",
        "names::quote",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();
    assert_eq!(named, expected);
}

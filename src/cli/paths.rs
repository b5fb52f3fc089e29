//! Paths compared as the kernel would resolve them, for checks such as "this file is not
//! inside that directory" where either may not exist yet. It does not open anything.

use std::path::{Component, Path, PathBuf};

/// `path` made absolute, component by component as the kernel walks it: each part that
/// exists is resolved (`canonicalize`, links followed, so a following `..` leaves the link's
/// target), and from the first part that does not exist the rest is taken lexically. Two
/// spellings of one place, through a link or not, come out alike.
pub(super) fn resolved(path: &Path) -> PathBuf {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut base = PathBuf::from("/");
    let mut exists = true;
    for component in absolute.components() {
        match component {
            Component::RootDir | Component::Prefix(_) | Component::CurDir => {}
            Component::ParentDir => {
                base.pop();
            }
            Component::Normal(part) => {
                base.push(part);
                if exists {
                    match base.canonicalize() {
                        Ok(real) => base = real,
                        Err(_) => exists = false,
                    }
                }
            }
        }
    }
    base
}

#[cfg(test)]
mod tests {
    use super::resolved;
    use std::path::Path;

    #[test]
    fn a_path_through_a_link_or_not_yet_made_resolves_alike() {
        let dir = std::env::temp_dir().join(format!("pglease-paths-{}", std::process::id()));
        let real = dir.join("real");
        std::fs::create_dir_all(&real).expect("mkdir");
        let link = dir.join("link");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&real, &link).expect("symlink");
        assert_eq!(resolved(&link.join("a/b")), resolved(&real.join("a/b")));
        assert!(resolved(&link.join("new/../key")).starts_with(resolved(&real)));
        assert!(!resolved(&real.join("../key")).starts_with(resolved(&real)));
        assert_eq!(resolved(Path::new("/")), Path::new("/"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}

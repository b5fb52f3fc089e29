//! The key file: made once, private, never read through a link, bounded, and errors that
//! never show its content.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;

use super::{load, load_or_create, KeyError};

fn tempdir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "pglease-key-{}-{}",
        std::process::id(),
        super::super::super::util::random_hex(4)
    ));
    std::fs::create_dir_all(&dir).expect("mkdir");
    dir
}

#[test]
fn a_key_is_made_once_private_and_read_back_alike() {
    let dir = tempdir();
    let path = dir.join("cache/snapshot.key");
    let made = load_or_create(&path).expect("made");
    let meta = std::fs::metadata(&path).expect("stat");
    assert_eq!(meta.mode() & 0o777, 0o600);
    assert_eq!(meta.len(), 32);
    assert_eq!(meta.uid(), nix::unistd::geteuid().as_raw());
    let again = load_or_create(&path).expect("read");
    assert_eq!(made.id(), again.id(), "a second start made another key");
    // No temporary file left beside it.
    let names: Vec<_> = std::fs::read_dir(dir.join("cache"))
        .expect("list")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(names, vec!["snapshot.key"]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_key_is_never_read_through_a_link_nor_when_others_can_read_it() {
    let dir = tempdir();
    let real = dir.join("real.key");
    std::fs::write(&real, [7u8; 32]).expect("write");
    std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let link = dir.join("link.key");
    std::os::unix::fs::symlink(&real, &link).expect("symlink");
    let error = load_or_create(&link).expect_err("read through a link");
    assert!(matches!(error, KeyError::Link { .. }), "{error}");
    std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let error = load(&real).expect_err("a readable key");
    assert!(error.to_string().contains("chmod 600"), "{error}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_key_of_the_wrong_size_is_refused_without_showing_it() {
    let dir = tempdir();
    let short = dir.join("short.key");
    std::fs::write(&short, "secret-but-short").expect("write");
    std::fs::set_permissions(&short, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let error = load(&short).expect_err("a short key");
    let text = error.to_string();
    assert!(text.contains("holds 16 bytes"), "{text}");
    assert!(!text.contains("secret"), "the error shows the key: {text}");
    let long = dir.join("long.key");
    std::fs::write(&long, vec![b'x'; 10_000]).expect("write");
    std::fs::set_permissions(&long, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let error = load(&long).expect_err("a huge key");
    assert!(matches!(error, KeyError::BadLength { .. }), "{error}");
    let error = load(&dir).expect_err("a directory");
    assert!(
        matches!(
            error,
            KeyError::NotRegular { .. } | KeyError::Exposed { .. }
        ),
        "{error}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

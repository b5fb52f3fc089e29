//! Unpacking: a jar laid out like zonky's comes out whole (modes, symlinks); archives
//! that reach outside their directory, hold devices, or are damaged are refused.

use std::os::unix::fs::PermissionsExt;

use super::*;
use crate::testing::{fake_jar, jar_of_tar, tar_of, zip_of, Scratch, TarEntry};

/// Writes `jar` to a file in `scratch` and unpacks it into `scratch/tree`.
fn unpack(scratch: &Scratch, jar: &[u8]) -> Result<std::path::PathBuf, BinariesError> {
    let path = scratch.path().join("test.jar");
    std::fs::write(&path, jar).expect("write jar");
    let tree = scratch.path().join("tree");
    unpack_jar(&path, &tree).map(|()| tree)
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .expect("stat")
        .permissions()
        .mode()
        & 0o7777
}

/// The error's message, for a refused archive.
fn refused(result: Result<std::path::PathBuf, BinariesError>) -> String {
    match result {
        Err(e @ BinariesError::BadArchive { .. }) => e.to_string(),
        other => panic!("expected BadArchive, got {other:?}"),
    }
}

#[test]
fn a_zonky_style_jar_unpacks_with_modes_and_symlinks() {
    let scratch = Scratch::new("unpack-good");
    let tree = unpack(&scratch, &fake_jar("17.6")).expect("unpack");
    assert_eq!(mode(&tree.join("bin/postgres")), 0o755);
    assert_eq!(mode(&tree.join("lib/libpq.so.5.17")), 0o700, "as archived");
    let link = std::fs::read_link(tree.join("lib/libpq.so.5")).expect("a symlink");
    assert_eq!(link, Path::new("libpq.so.5.17"));
    assert_eq!(
        std::fs::read(tree.join("share/postgresql/postgres.bki")).expect("read"),
        b"bki"
    );
    // The cache then opens everything to every user (the server's OS user is another).
    crate::cache::open_to_all(&tree).expect("open");
    assert_eq!(mode(&tree.join("lib/libpq.so.5.17")), 0o755);
    assert_eq!(mode(&tree.join("share/postgresql")), 0o755);
    assert_eq!(mode(&tree.join("share/postgresql/postgres.bki")), 0o644);
}

#[test]
fn a_path_with_dotdot_or_a_root_is_refused_and_nothing_lands_outside() {
    for name in [
        &b"../escaped"[..],
        b"bin/../../escaped",
        b"/tmp/escaped-absolute",
    ] {
        let scratch = Scratch::new("unpack-escape");
        let jar = jar_of_tar(&tar_of(&[
            TarEntry::File("bin/postgres", 0o755, b"x"),
            TarEntry::RawName(name, b"escaped"),
        ]));
        let message = refused(unpack(&scratch, &jar));
        assert!(message.contains("outside the archive"), "{message}");
        assert!(!scratch.path().join("escaped").exists());
        assert!(!Path::new("/tmp/escaped-absolute").exists());
    }
}

#[test]
fn writing_through_a_symlink_out_of_the_tree_is_refused() {
    let scratch = Scratch::new("unpack-symlink-escape");
    let outside = scratch.path().join("outside");
    std::fs::create_dir_all(&outside).expect("mkdir");
    let target = outside.display().to_string();
    let jar = jar_of_tar(&tar_of(&[
        TarEntry::Symlink("lib/out", &target),
        TarEntry::File("lib/out/planted", 0o644, b"planted"),
    ]));
    let message = refused(unpack(&scratch, &jar));
    assert!(message.contains("lib/out/planted"), "{message}");
    assert!(!outside.join("planted").exists());
}

#[test]
fn a_device_entry_is_refused() {
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Char);
    header.set_mode(0o644);
    header.set_size(0);
    builder
        .append_data(&mut header, "bin/null", std::io::empty())
        .expect("append");
    let tar = builder.into_inner().expect("tar");
    let scratch = Scratch::new("unpack-device");
    let message = refused(unpack(&scratch, &jar_of_tar(&tar)));
    assert!(message.contains("bin/null"), "{message}");
}

#[test]
fn damaged_or_misshapen_archives_are_refused() {
    let scratch = Scratch::new("unpack-damaged");
    // Not a zip at all.
    let message = refused(unpack(&scratch, b"<html>a proxy's error page</html>"));
    assert!(message.contains("not a zip"), "{message}");
    // A zip without the .txz.
    let message = refused(unpack(&scratch, &zip_of(&[("README", b"hello")])));
    assert!(message.contains("one .txz"), "{message}");
    // A .txz whose xz stream is cut short.
    let tar = tar_of(&[TarEntry::File("bin/postgres", 0o755, &[7u8; 200_000])]);
    let xz = crate::testing::xz_of(&tar);
    let cut = &xz[..xz.len() / 2];
    let scratch = Scratch::new("unpack-cut");
    refused(unpack(
        &scratch,
        &zip_of(&[("postgres-linux-x86_64.txz", cut)]),
    ));
    // A .txz holding garbage.
    let scratch = Scratch::new("unpack-garbage");
    refused(unpack(
        &scratch,
        &zip_of(&[("postgres-linux-x86_64.txz", &[0u8; 4096])]),
    ));
}

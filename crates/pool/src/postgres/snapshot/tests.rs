//! Snapshots written and read back, and hostile ones refused.
use super::*;

fn manifest() -> Manifest {
    Manifest::new(
        "15.14",
        &["--nosync".into(), "--locale=C".into()],
        vec![SnapshotTemplate {
            name: "app".into(),
            fingerprint: "ab".repeat(32),
            size_bytes: 8_000_000,
        }],
    )
}

fn fake_cluster(dir: &Path) {
    std::fs::create_dir_all(dir.join("global")).expect("test step");
    std::fs::create_dir_all(dir.join("base/1")).expect("test step");
    std::fs::write(dir.join("PG_VERSION"), "15\n").expect("test step");
    std::fs::write(dir.join("global/pg_control"), [7u8; 8192]).expect("test step");
    std::fs::write(dir.join("base/1/1259"), vec![0u8; 100_000]).expect("test step");
    std::fs::write(dir.join("postmaster.opts"), "stale").expect("test step");
}

#[test]
fn the_major_is_read_from_what_postgres_prints() {
    assert_eq!(
        major_of("postgres (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)"),
        15
    );
    assert_eq!(major_of("18.6"), 18);
    assert_eq!(version_number("postgres (PostgreSQL) 16.15"), "16.15");
}

#[test]
fn a_written_snapshot_reads_back_and_unpacks_the_cluster() {
    let root = tempdir();
    let cluster = root.join("cluster");
    fake_cluster(&cluster);
    let path = path_for(&root.join("snaps"), 15);
    let written = manifest();
    write(&cluster, &written, &path).expect("test step");
    assert_eq!(read_manifest(&path).expect("test step"), written);
    let found = find(&root.join("snaps"), "15.13", &written.initdb_args).expect("test step");
    assert_eq!(found.manifest, written);
    let out = root.join("out");
    extract(&path, &out, None).expect("test step");
    assert_eq!(
        std::fs::read(out.join("base/1/1259"))
            .expect("test step")
            .len(),
        100_000
    );
    assert!(!out.join("postmaster.opts").exists());
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&out)
        .expect("test step")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o700);
}

#[test]
fn a_snapshot_of_another_major_or_initdb_setting_is_passed_over() {
    let root = tempdir();
    let cluster = root.join("cluster");
    fake_cluster(&cluster);
    let written = manifest();
    write(&cluster, &written, &path_for(&root, 15)).expect("test step");
    // Another major looks for another file.
    assert!(find(&root, "16.2", &written.initdb_args).is_none());
    assert!(find(&root, "15.14", &["--locale=en_US.UTF-8".into()]).is_none());
    assert!(find(&root, "15.14", &written.initdb_args).is_some());
}

#[test]
fn garbage_or_a_foreign_archive_is_not_a_snapshot() {
    let root = tempdir();
    let path = path_for(&root, 15);
    std::fs::write(&path, b"not a snapshot at all").expect("test step");
    assert!(
        read_manifest(&path).expect_err("an error").contains("zstd"),
        "{:?}",
        read_manifest(&path)
    );
    assert!(find(&root, "15.14", &[]).is_none());
    // A valid zstd tar whose first entry is something else.
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(2);
    header.set_cksum();
    builder
        .append_data(&mut header, "hello", &b"hi"[..])
        .expect("test step");
    let tar = builder.into_inner().expect("test step");
    std::fs::write(
        &path,
        zstd::encode_all(tar.as_slice(), 1).expect("test step"),
    )
    .expect("test step");
    let error = read_manifest(&path).expect_err("an error");
    assert!(error.contains("not a pglease snapshot"), "{error}");
    // A cut-off file fails extraction with a message, not a panic.
    let cluster = root.join("cluster");
    fake_cluster(&cluster);
    write(&cluster, &manifest(), &path).expect("test step");
    let bytes = std::fs::read(&path).expect("test step");
    std::fs::write(&path, &bytes[..bytes.len() / 2]).expect("test step");
    let out = root.join("out");
    assert!(extract(&path, &out, None).is_err());
}

#[test]
fn an_abandoned_temporary_file_goes_and_a_fresh_one_stays() {
    let root = tempdir();
    let old = root.join(".pglease-pg15.pgsnap.tmp-aaaa");
    let fresh = root.join(".pglease-pg15.pgsnap.tmp-bbbb");
    std::fs::write(&old, b"half").expect("write");
    std::fs::write(&fresh, b"half").expect("write");
    let two_hours_ago = SystemTime::now() - std::time::Duration::from_secs(7200);
    File::options()
        .write(true)
        .open(&old)
        .and_then(|f| f.set_modified(two_hours_ago))
        .expect("set mtime");
    assert!(find(&root, "15.14", &[]).is_none());
    assert!(!old.exists());
    assert!(fresh.exists());
}

fn tempdir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "pglease-snapshot-test-{}",
        super::super::instance::random_hex(6)
    ));
    std::fs::create_dir_all(&dir).expect("test step");
    dir
}

/// One archive entry: its header and its data.
type Entry = (tar::Header, Vec<u8>);

/// A snapshot file holding the manifest and then `entries`, each a tar header (its path
/// written into the header as is, so that absolute and `..` paths can be made) and data.
fn hostile_snapshot(path: &Path, entries: Vec<Entry>) {
    let mut builder = tar::Builder::new(Vec::new());
    let json = serde_json::to_vec(&manifest()).expect("json");
    let mut header = tar::Header::new_gnu();
    header.set_size(json.len() as u64);
    header.set_mode(0o644);
    header.set_cksum();
    builder
        .append_data(&mut header, MANIFEST_ENTRY, json.as_slice())
        .expect("manifest");
    for (header, data) in entries {
        builder.append(&header, data.as_slice()).expect("entry");
    }
    let tar = builder.into_inner().expect("tar");
    std::fs::write(path, zstd::encode_all(tar.as_slice(), 1).expect("zstd")).expect("write");
}

/// A header for `name` of `kind` (with `link` as a link's target) holding `size` bytes.
fn entry(name: &str, kind: tar::EntryType, link: Option<&str>, size: u64) -> tar::Header {
    let mut header = tar::Header::new_old();
    let bytes = name.as_bytes();
    header.as_old_mut().name[..bytes.len()].copy_from_slice(bytes);
    header.set_entry_type(kind);
    header.set_mode(if kind == tar::EntryType::Directory {
        0o755
    } else {
        0o644
    });
    header.set_size(size);
    if let Some(target) = link {
        let bytes = target.as_bytes();
        header.as_old_mut().linkname[..bytes.len()].copy_from_slice(bytes);
    }
    header.set_cksum();
    header
}

fn file(name: &str, data: &[u8]) -> Entry {
    (
        entry(name, tar::EntryType::Regular, None, data.len() as u64),
        data.to_vec(),
    )
}

fn dir(name: &str) -> Entry {
    (entry(name, tar::EntryType::Directory, None, 0), Vec::new())
}

fn link(name: &str, kind: tar::EntryType, target: &str) -> Entry {
    (entry(name, kind, Some(target), 0), Vec::new())
}

/// Issue 25, row 3: a snapshot a hostile job left in the CI cache. Each entry that is not
/// a plain file or directory inside the cluster fails the unpacking, naming the entry and
/// the reason, and nothing outside the data directory changes — not its content, owner or
/// mode — even though the unpacking runs as root (as in CI) and chowns what it makes.
#[test]
fn a_hostile_snapshot_is_refused_and_touches_nothing_outside() {
    use std::os::unix::fs::MetadataExt;
    let root = tempdir();
    let victim = root.join("victim");
    std::fs::write(&victim, "precious").expect("write");
    let victim_text = victim.display().to_string();
    let owner = nix::unistd::geteuid().is_root().then_some((65534, 65534));
    let escape = format!(
        "../{}",
        victim.file_name().and_then(|n| n.to_str()).expect("name")
    );
    let cases: Vec<(&str, Vec<Entry>, &str)> = vec![
        (
            "a link, then a file written through it",
            vec![
                dir("base"),
                link("base/evil", tar::EntryType::Symlink, &victim_text),
                file("base/evil", b"overwritten"),
            ],
            "symbolic link",
        ),
        (
            "pg_hba.conf as a link",
            vec![link("pg_hba.conf", tar::EntryType::Symlink, &victim_text)],
            "symbolic link",
        ),
        (
            "a hard link",
            vec![link("PG_VERSION", tar::EntryType::Link, &victim_text)],
            "hard link",
        ),
        (
            "an absolute path",
            vec![file(&victim_text, b"overwritten")],
            "absolute path",
        ),
        (
            "a path out of the cluster",
            vec![
                dir("base"),
                file(&format!("base/../{escape}"), b"overwritten"),
            ],
            "leads out of the cluster",
        ),
        (
            "a FIFO",
            vec![(entry("base", tar::EntryType::Fifo, None, 0), Vec::new())],
            "FIFO",
        ),
        (
            "a file under a file",
            vec![file("base", b"x"), file("base/1", b"y")],
            "not a directory",
        ),
    ];
    let before = std::fs::metadata(&victim).expect("stat");
    for (what, entries, why) in cases {
        let path = root.join("hostile.pgsnap");
        hostile_snapshot(&path, entries);
        let out = root.join("out");
        let error = extract(&path, &out, owner).expect_err(what);
        assert!(error.contains(why), "{what}: {error}");
        // The caller removes the half-made directory; nothing there leads out.
        std::fs::remove_dir_all(&out).expect("remove");
        let after = std::fs::metadata(&victim).expect("stat");
        assert_eq!(
            std::fs::read_to_string(&victim).expect("read"),
            "precious",
            "{what}"
        );
        assert_eq!(
            (after.uid(), after.gid(), after.mode()),
            (before.uid(), before.gid(), before.mode()),
            "{what}"
        );
    }
}

#[test]
fn a_snapshot_file_is_private_to_its_user() {
    use std::os::unix::fs::PermissionsExt;
    let root = tempdir();
    let cluster = root.join("cluster");
    fake_cluster(&cluster);
    let path = path_for(&root.join("snaps"), 15);
    write(&cluster, &manifest(), &path).expect("write");
    let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
    assert_eq!(mode(&path), 0o600);
    assert_eq!(mode(&root.join("snaps")), 0o700);
}

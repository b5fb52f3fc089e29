//! Snapshots written and read back, and hostile ones refused.

use std::io::Write as _;
use std::os::unix::fs::{MetadataExt, PermissionsExt};

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
    write(&cluster, &written, &path, &key()).expect("test step");
    assert_eq!(manifest_of(&path).expect("test step"), written);
    let found =
        find(&root.join("snaps"), "15.13", &written.initdb_args, &key()).expect("test step");
    assert_eq!(found.manifest, written);
    let out = root.join("out");
    extract_file(&path, &out, None).expect("test step");
    assert_eq!(
        std::fs::read(out.join("base/1/1259"))
            .expect("test step")
            .len(),
        100_000
    );
    assert!(!out.join("postmaster.opts").exists());
    let mode = std::fs::metadata(&out)
        .expect("test step")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o700);
}

/// A cluster room as `room.rs` makes it for the data directory `data_dir`: `room/base` and
/// `room/pg_notify`, and the data directory's `base` and `pg_notify` links to them. What
/// `data_dir` held under those names moves into the room.
fn into_a_room(data_dir: &Path, room: &Path) {
    std::fs::create_dir_all(data_dir).expect("mkdir");
    std::fs::create_dir(room).expect("mkdir");
    for part in ["base", "pg_notify"] {
        let inside = data_dir.join(part);
        if inside.exists() {
            std::fs::rename(&inside, room.join(part)).expect("move into the room");
        } else {
            std::fs::create_dir(room.join(part)).expect("mkdir");
        }
        std::os::unix::fs::symlink(room.join(part), inside).expect("symlink");
    }
}

/// With the databases' room in `--databases-dir` (`room.rs`), a cluster's `base` and
/// `pg_notify` are links into it: a snapshot packs what the room's `base` holds as the
/// directory `base` and `pg_notify` as an empty directory (not the links, which no
/// unpacking would take), and unpacking into a data directory with links into a fresh room
/// fills the room.
#[test]
fn a_cluster_whose_databases_are_in_a_room_packs_and_unpacks_through_it() {
    let root = tempdir();
    let cluster = root.join("cluster");
    fake_cluster(&cluster);
    let room = root.join("room");
    into_a_room(&cluster, &room);
    // A queue page nobody read when the cluster stopped.
    std::fs::write(room.join("pg_notify/0000"), [1u8; 8192]).expect("write");
    let path = path_for(&root.join("snaps"), 15);
    write(&cluster, &manifest(), &path, &key()).expect("write");

    // Into a plain data directory: `base` and `pg_notify` come out directories, the queue
    // empty (postgres empties it at its start anyway).
    let plain = root.join("plain");
    extract_file(&path, &plain, None).expect("a plain unpack");
    for part in ["base", "pg_notify"] {
        assert!(std::fs::symlink_metadata(plain.join(part))
            .expect(part)
            .is_dir());
    }
    assert_eq!(
        std::fs::read(plain.join("base/1/1259"))
            .expect("read")
            .len(),
        100_000
    );
    assert_eq!(
        std::fs::read_dir(plain.join("pg_notify"))
            .expect("read")
            .count(),
        0
    );

    // Into a data directory with its own room: the files land in the room, the links stay.
    let out = root.join("out");
    let out_room = root.join("out-room");
    into_a_room(&out, &out_room);
    let found = open(&path, &key()).expect("open");
    extract(&found, &key(), &out, None, Some(&out_room)).expect("unpack into the room");
    assert_eq!(
        std::fs::read(out_room.join("base/1/1259"))
            .expect("read")
            .len(),
        100_000
    );
    for part in ["base", "pg_notify"] {
        assert!(std::fs::symlink_metadata(out.join(part))
            .expect(part)
            .is_symlink());
        let mode = std::fs::metadata(out_room.join(part))
            .expect("stat")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700, "{part}");
    }
    let _ = std::fs::remove_dir_all(&root);
}

/// A snapshot of a cluster without a room (here one packed by an older pglease, with the
/// queue's files in it) unpacks into a data directory whose `pg_notify` links into the room:
/// the queue's files are not written (postgres would remove them), the link is not
/// followed, nothing is refused.
#[test]
fn a_snapshot_with_queue_files_unpacks_into_a_room() {
    let root = tempdir();
    let out = root.join("out");
    let room = root.join("room");
    into_a_room(&out, &room);
    let path = root.join("older.pgsnap");
    hostile_snapshot(
        &path,
        vec![
            file("PG_VERSION", b"15\n"),
            dir("global"),
            file("global/pg_control", &[7u8; 8192]),
            dir("base"),
            dir("base/1"),
            file("base/1/1259", b"a table"),
            dir("pg_notify"),
            file("pg_notify/0000", &[1u8; 8192]),
        ],
    );
    let found = open(&path, &key()).expect("open");
    extract(&found, &key(), &out, None, Some(&room)).expect("unpack into the room");
    assert_eq!(
        std::fs::read(room.join("base/1/1259")).expect("read"),
        b"a table"
    );
    assert_eq!(
        std::fs::read_dir(room.join("pg_notify"))
            .expect("read")
            .count(),
        0
    );
    assert!(std::fs::symlink_metadata(out.join("pg_notify"))
        .expect("pg_notify")
        .is_symlink());
    let _ = std::fs::remove_dir_all(&root);
}

/// The room changes nothing for a hostile entry: below `base/` or `pg_notify/` it is
/// refused as anywhere else, and nothing is written through a link the archive brings.
#[test]
fn a_hostile_entry_under_base_is_refused_in_the_room_too() {
    let root = tempdir();
    let outside = root.join("outside");
    std::fs::create_dir(&outside).expect("mkdir");
    for top in ["base", "pg_notify"] {
        let out = root.join(format!("out-{top}"));
        let room = root.join(format!("room-{top}"));
        into_a_room(&out, &room);
        let path = root.join(format!("hostile-{top}.pgsnap"));
        hostile_snapshot(
            &path,
            vec![
                dir(top),
                link(
                    &format!("{top}/1"),
                    tar::EntryType::Symlink,
                    outside.to_str().expect("utf-8"),
                ),
                file(&format!("{top}/1/1259"), b"overwritten"),
            ],
        );
        let found = open(&path, &key()).expect("open");
        let error = extract(&found, &key(), &out, None, Some(&room))
            .expect_err("a link")
            .to_string();
        assert!(
            error.contains(&format!("\"{top}/1\"")) && error.contains("symbolic link"),
            "{error}"
        );
        assert_eq!(std::fs::read_dir(&outside).expect("read").count(), 0);
    }
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn a_snapshot_of_another_major_or_initdb_setting_is_passed_over() {
    let root = tempdir();
    let cluster = root.join("cluster");
    fake_cluster(&cluster);
    let written = manifest();
    write(&cluster, &written, &path_for(&root, 15), &key()).expect("test step");
    // Another major looks for another file.
    assert!(find(&root, "16.2", &written.initdb_args, &key()).is_none());
    assert!(find(&root, "15.14", &["--locale=en_US.UTF-8".into()], &key()).is_none());
    assert!(find(&root, "15.14", &written.initdb_args, &key()).is_some());
}

#[test]
fn garbage_or_a_foreign_archive_is_not_a_snapshot() {
    let root = tempdir();
    let path = path_for(&root, 15);
    std::fs::write(&path, b"not a snapshot at all").expect("test step");
    let error = manifest_of(&path).expect_err("an error");
    assert!(error.contains("not a pglease snapshot at all"), "{error}");
    assert!(matches!(
        open(&path, &key()),
        Err(OpenError::Unauthenticated(SealError::NotASnapshot))
    ));
    assert!(find(&root, "15.14", &[], &key()).is_none());
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
        sealed(
            &zstd::encode_all(tar.as_slice(), 1).expect("test step"),
            &key(),
        ),
    )
    .expect("test step");
    let error = manifest_of(&path).expect_err("an error");
    assert!(error.contains("not a pglease snapshot"), "{error}");
    assert!(
        matches!(open(&path, &key()), Err(OpenError::NoManifest { first }) if first == Path::new("hello")),
        "{error}"
    );
    // A cut-off file fails extraction with a message, not a panic.
    let cluster = root.join("cluster");
    fake_cluster(&cluster);
    write(&cluster, &manifest(), &path, &key()).expect("test step");
    let bytes = std::fs::read(&path).expect("test step");
    std::fs::write(&path, &bytes[..bytes.len() / 2]).expect("test step");
    let out = root.join("out");
    assert!(extract_file(&path, &out, None).is_err());
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
    assert!(find(&root, "15.14", &[], &key()).is_none());
    assert!(!old.exists());
    assert!(fresh.exists());
}

/// The key the tests seal with.
fn key() -> SnapshotKey {
    SnapshotKey::from_bytes(&[42u8; 32], Path::new("/test/snapshot.key"))
}

/// `path`'s manifest, as a start reads it (its MAC checked under [`key`]).
fn manifest_of(path: &Path) -> Result<Manifest, String> {
    open(path, &key())
        .map(|found| found.manifest)
        .map_err(|e| e.to_string())
}

/// Unpacks `path` as a start does: opened and checked under [`key`], then extracted.
fn extract_file(path: &Path, out: &Path, owner: Option<(u32, u32)>) -> Result<u64, String> {
    let found = open(path, &key()).map_err(|e| e.to_string())?;
    extract(&found, &key(), out, owner, None).map_err(|e| e.to_string())
}

/// `stream` with a valid trailer under `key` appended.
fn sealed(stream: &[u8], key: &SnapshotKey) -> Vec<u8> {
    let mut sealing = seal::Sealing::new(Vec::new(), key);
    sealing.write_all(stream).expect("write");
    sealing.seal().expect("seal")
}

fn tempdir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "pglease-snapshot-test-{}",
        super::super::util::random_hex(6)
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
    // Sealed with the daemon's key: these tests are of the unpacking, which must refuse a
    // hostile entry even in a snapshot whose MAC is valid.
    let stream = zstd::encode_all(tar.as_slice(), 1).expect("zstd");
    std::fs::write(path, sealed(&stream, &key())).expect("write");
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

/// A file outside the data directory that a hostile snapshot aims at, with its content,
/// owner and mode as they were, in a directory (the data directory's parent) where nothing
/// else may appear but the snapshot file and the data directory.
struct Victim {
    path: PathBuf,
    before: (Vec<u8>, u32, u32, u32),
}

impl Victim {
    /// `root/victim`, holding "precious", mode 0644, owned by whoever runs the test.
    fn new(root: &Path) -> Victim {
        let path = root.join("victim");
        std::fs::write(&path, "precious").expect("write the victim");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let before = Victim::state(&path);
        Victim { path, before }
    }

    fn state(path: &Path) -> (Vec<u8>, u32, u32, u32) {
        let meta = std::fs::symlink_metadata(path).expect("stat the victim");
        let content = std::fs::read(path).expect("read the victim");
        (content, meta.uid(), meta.gid(), meta.mode())
    }

    /// Its absolute path, for entries that name it.
    fn text(&self) -> String {
        self.path.display().to_string()
    }

    fn assert_untouched(&self, what: &str) {
        /// What the tests put beside the data directory (`out`).
        const EXPECTED: [&str; 4] = ["victim", "outside", "hostile.pgsnap", "out"];
        assert_eq!(
            Victim::state(&self.path),
            self.before,
            "{what}: the victim changed"
        );
        let dir = self.path.parent().expect("the victim's directory");
        let mut beside: Vec<String> = std::fs::read_dir(dir)
            .expect("list")
            .map(|e| e.expect("list").file_name().to_string_lossy().into_owned())
            .filter(|name| !EXPECTED.contains(&name.as_str()))
            .collect();
        beside.sort();
        assert_eq!(beside, Vec::<String>::new(), "{what}: made outside");
    }
}

/// The owner a start gives the unpacked cluster: when the test runs as root (as in CI),
/// `nobody`, so that a chown through a link would change the victim's owner and show.
fn server_owner() -> Option<(u32, u32)> {
    nix::unistd::geteuid().is_root().then_some((65534, 65534))
}

/// Unpacks a snapshot of `entries` into `root/out` as a start does and removes the
/// half-made directory as the caller does; then checks that the victim kept its content,
/// owner and mode, and that the unpacking was refused with an error naming `entry` and
/// saying `reason`.
fn assert_refused(root: &Path, victim: &Victim, entries: Vec<Entry>, entry: &str, reason: &str) {
    let path = root.join("hostile.pgsnap");
    hostile_snapshot(&path, entries);
    let out = root.join("out");
    let result = extract_file(&path, &out, server_owner());
    let _ = std::fs::remove_dir_all(&out);
    // The victim first: whatever the error says, nothing outside may have changed.
    victim.assert_untouched(entry);
    let error = result.expect_err("a hostile snapshot unpacked");
    assert!(
        error.contains(&format!("{entry:?}")),
        "the error does not name {entry}: {error}"
    );
    assert!(
        error.contains(reason),
        "the error does not say {reason:?}: {error}"
    );
}

// Issue 25, row 3: a snapshot a hostile job left in the CI cache, unpacked as root. Each
// test below tries one way out of the data directory; each entry that is not a plain file
// or directory inside the cluster fails the whole unpacking, naming the entry and the
// reason, and nothing outside the data directory changes.

/// (a) A link to a file outside, then a file of the same name that would be written, and
/// chowned, through it.
#[test]
fn a_link_is_refused_before_a_file_is_written_through_it() {
    let root = tempdir();
    let victim = Victim::new(&root);
    let entries = vec![
        dir("base"),
        link("base/evil", tar::EntryType::Symlink, &victim.text()),
        file("base/evil", b"overwritten"),
    ];
    assert_refused(&root, &victim, entries, "base/evil", "as a symbolic link");
    let _ = std::fs::remove_dir_all(&root);
}

/// (b) `pg_hba.conf` as a link, which each start writes (see also
/// `postgres::tests::pg_hba_conf_is_written_anew_never_through_a_link`).
#[test]
fn pg_hba_conf_as_a_link_is_refused() {
    let root = tempdir();
    let victim = Victim::new(&root);
    let entries = vec![link("pg_hba.conf", tar::EntryType::Symlink, &victim.text())];
    assert_refused(&root, &victim, entries, "pg_hba.conf", "as a symbolic link");
    let _ = std::fs::remove_dir_all(&root);
}

/// (c) A hard link to a file outside: chowning or writing it would be the victim's inode.
#[test]
fn a_hard_link_is_refused() {
    let root = tempdir();
    let victim = Victim::new(&root);
    let entries = vec![link("PG_VERSION", tar::EntryType::Link, &victim.text())];
    assert_refused(&root, &victim, entries, "PG_VERSION", "as a hard link");
    let _ = std::fs::remove_dir_all(&root);
}

/// (d) An entry named by the victim's absolute path.
#[test]
fn an_absolute_path_is_refused() {
    let root = tempdir();
    let victim = Victim::new(&root);
    let name = victim.text();
    let entries = vec![file(&name, b"overwritten")];
    assert_refused(&root, &victim, entries, &name, "by an absolute path");
    let _ = std::fs::remove_dir_all(&root);
}

/// (e) A path that climbs out with `..` (the data directory is `root/out`), to the victim
/// or to a new file beside it.
#[test]
fn a_path_out_of_the_cluster_is_refused() {
    let root = tempdir();
    let victim = Victim::new(&root);
    for name in ["../escaped", "../victim", "base/../../victim"] {
        let entries = vec![dir("base"), file(name, b"overwritten")];
        assert_refused(&root, &victim, entries, name, "leads out of the cluster");
    }
    let _ = std::fs::remove_dir_all(&root);
}

/// (f) Devices and FIFOs: a cluster holds none, and root could make any device.
#[test]
fn a_fifo_or_a_device_is_refused() {
    let root = tempdir();
    let victim = Victim::new(&root);
    for (kind, reason) in [
        (tar::EntryType::Fifo, "as a FIFO"),
        (tar::EntryType::Char, "as a character device"),
        (tar::EntryType::Block, "as a block device"),
    ] {
        let entries = vec![(entry("base", kind, None, 0), Vec::new())];
        assert_refused(&root, &victim, entries, "base", reason);
    }
    let _ = std::fs::remove_dir_all(&root);
}

/// An entry's name comes from the archive and goes into the log: it is shown quoted, its
/// control characters escaped, so that it cannot forge log lines.
#[test]
fn an_entry_name_is_shown_escaped() {
    let root = tempdir();
    let victim = Victim::new(&root);
    let name = "evil\nWARN forged line";
    let entries = vec![link(name, tar::EntryType::Symlink, &victim.text())];
    assert_refused(&root, &victim, entries, name, "as a symbolic link");
    let path = root.join("hostile.pgsnap");
    let error = extract_file(&path, &root.join("out"), None).expect_err("refused");
    assert!(!error.contains('\n'), "{error}");
    let _ = std::fs::remove_dir_all(&root);
}

/// A file where a directory should be: its entries are not put beside it or elsewhere.
#[test]
fn a_file_under_a_file_is_refused() {
    let root = tempdir();
    let victim = Victim::new(&root);
    let entries = vec![dir("base"), file("base/1", b"x"), file("base/1/2", b"y")];
    assert_refused(&root, &victim, entries, "base/1/2", "not a directory");
    let _ = std::fs::remove_dir_all(&root);
}

/// Defence in depth: a link already in the data directory (which the archive cannot make,
/// but someone else might) is not followed to put an entry under it.
#[test]
fn a_link_already_in_the_data_directory_is_not_followed() {
    let root = tempdir();
    let outside = root.join("outside");
    std::fs::create_dir(&outside).expect("mkdir");
    let out = root.join("out");
    std::fs::create_dir(&out).expect("mkdir");
    std::os::unix::fs::symlink(&outside, out.join("base")).expect("symlink");
    let path = root.join("hostile.pgsnap");
    hostile_snapshot(&path, vec![file("base/1259", b"overwritten")]);
    let found = open(&path, &key()).expect("open");
    let mut archive = archive(found.sealed.reader(&key())).expect("open");
    let handle = unpack::open_directory(&out).expect("open the data directory");
    let into = unpack::Into {
        root: &handle,
        base: None,
        notify_queue: None,
        data_dir: &out,
    };
    let result = unpack::unpack(
        archive.entries().expect("entries"),
        &into,
        Path::new(MANIFEST_ENTRY),
        server_owner(),
    );
    assert_eq!(
        std::fs::read_dir(&outside).expect("read").count(),
        0,
        "something was put outside"
    );
    let error = result.expect_err("unpacked through a link");
    assert!(
        matches!(&error, UnpackError::UnderNonDirectory { entry, under }
            if entry == Path::new("base/1259") && *under == out.join("base")),
        "{error:?}"
    );
    let error = error.to_string();
    assert!(
        error.contains("\"base/1259\"") && error.contains("which is not a directory"),
        "{error}"
    );
    let _ = std::fs::remove_dir_all(&root);
}

/// The caller removes a half-made data directory with `remove_dir_all`: it removes the
/// links it meets, never what they point at.
#[test]
fn removing_a_data_directory_does_not_follow_its_links() {
    let root = tempdir();
    let victim = Victim::new(&root);
    let outside = root.join("outside");
    std::fs::create_dir(&outside).expect("mkdir");
    std::fs::write(outside.join("keep"), "kept").expect("write");
    let out = root.join("out");
    std::fs::create_dir_all(out.join("base")).expect("mkdir");
    std::os::unix::fs::symlink(&outside, out.join("base/dir_link")).expect("symlink");
    std::os::unix::fs::symlink(&victim.path, out.join("file_link")).expect("symlink");
    std::fs::remove_dir_all(&out).expect("remove");
    assert!(!out.exists());
    assert_eq!(
        std::fs::read_to_string(outside.join("keep")).expect("a file behind a link went"),
        "kept"
    );
    victim.assert_untouched("remove_dir_all");
    let _ = std::fs::remove_dir_all(&root);
}

/// A snapshot file that is a link or a FIFO is not read: pglease never makes one, and a
/// FIFO would hang the start.
#[test]
fn a_snapshot_file_that_is_a_link_or_a_fifo_is_not_read() {
    let root = tempdir();
    let cluster = root.join("cluster");
    fake_cluster(&cluster);
    let real = root.join("elsewhere.pgsnap");
    write(&cluster, &manifest(), &real, &key()).expect("write");
    let snaps = root.join("snaps");
    std::fs::create_dir(&snaps).expect("mkdir");
    let path = path_for(&snaps, 15);
    std::os::unix::fs::symlink(&real, &path).expect("symlink");
    let error = manifest_of(&path).expect_err("read through a link");
    assert!(error.contains("it is a symbolic link"), "{error}");
    assert!(
        matches!(open(&path, &key()), Err(OpenError::Link { path: named }) if named == path),
        "not refused as a link"
    );
    assert!(find(&snaps, "15.14", &manifest().initdb_args, &key()).is_none());
    std::fs::remove_file(&path).expect("remove");
    nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
    let error = manifest_of(&path).expect_err("read a FIFO");
    assert!(error.contains("it is not a regular file"), "{error}");
    assert!(
        matches!(open(&path, &key()), Err(OpenError::NotAFile { .. })),
        "not refused as a FIFO"
    );
    let _ = std::fs::remove_dir_all(&root);
}

/// What a good snapshot unpacks to is what postgres requires and the server's user owns
/// (when the test runs as root): directories 0700, files 0600, whatever the archive says.
#[test]
fn an_unpacked_cluster_is_owner_only_and_the_server_users() {
    let root = tempdir();
    let cluster = root.join("cluster");
    fake_cluster(&cluster);
    std::fs::set_permissions(
        cluster.join("base/1/1259"),
        std::fs::Permissions::from_mode(0o666),
    )
    .expect("chmod");
    let path = root.join("good.pgsnap");
    write(&cluster, &manifest(), &path, &key()).expect("write");
    let out = root.join("out");
    let owner = server_owner();
    extract_file(&path, &out, owner).expect("extract");
    for (relative, mode) in [("", 0o700), ("base/1", 0o700), ("base/1/1259", 0o600)] {
        let meta = std::fs::symlink_metadata(out.join(relative)).expect("stat");
        assert_eq!(meta.mode() & 0o777, mode, "{relative}");
        if let Some((uid, gid)) = owner {
            assert_eq!((meta.uid(), meta.gid()), (uid, gid), "{relative}");
        }
    }
    let _ = std::fs::remove_dir_all(&root);
}

/// (g) A snapshot holds the whole cluster, password verifiers included: its file is 0600,
/// the directory pglease makes for it 0700.
#[test]
fn a_snapshot_file_is_private_to_its_user() {
    let root = tempdir();
    let cluster = root.join("cluster");
    fake_cluster(&cluster);
    let path = path_for(&root.join("snaps"), 15);
    write(&cluster, &manifest(), &path, &key()).expect("write");
    let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
    assert_eq!(mode(&path), 0o600);
    assert_eq!(mode(&root.join("snaps")), 0o700);
    // Where the directory cannot be made (a file is in the way), the error names it.
    let blocked = root.join("blocked");
    std::fs::write(&blocked, b"").expect("write");
    let error = write(&cluster, &manifest(), &path_for(&blocked, 15), &key())
        .expect_err("written under a file");
    assert!(
        matches!(&error, WriteError::CreateDir { path, .. } if *path == blocked),
        "{error:?}"
    );
    let _ = std::fs::remove_dir_all(&root);
}

// Issue 41, step 2: defence in depth for a snapshot whose MAC is valid (a leaked key). Only
// postgres' own data-directory layout is unpacked; the configuration files are skipped (the
// start writes its own).

/// Row 1's recovery signal, a postmaster file, a backup label, or a script beside them.
#[test]
fn a_signal_file_a_postmaster_file_or_a_foreign_name_is_refused() {
    let root = tempdir();
    let victim = Victim::new(&root);
    for (entries, entry, reason) in [
        (
            vec![file("recovery.signal", b"")],
            "recovery.signal",
            "would start recovery",
        ),
        (
            vec![file("standby.signal", b"")],
            "standby.signal",
            "would start recovery",
        ),
        (
            vec![file("postmaster.pid", b"1")],
            "postmaster.pid",
            "belongs to a running server",
        ),
        (
            vec![file("backup_label", b"x")],
            "backup_label",
            "recovery from a backup",
        ),
        (
            vec![file("x.sh", b"touch /tmp/x")],
            "x.sh",
            "no part of a postgres data directory",
        ),
        (
            vec![file("open_hba.conf", b"host all all 0/0 trust")],
            "open_hba.conf",
            "no part of",
        ),
        (
            vec![dir("PG_VERSION")],
            "PG_VERSION",
            "not of the kind postgres makes there",
        ),
        (
            vec![file("pg_wal", b"x")],
            "pg_wal",
            "not of the kind postgres makes there",
        ),
    ] {
        assert_refused(&root, &victim, entries, entry, reason);
    }
    let _ = std::fs::remove_dir_all(&root);
}

/// The configuration files of a snapshot are not unpacked at all (row 1's
/// `restore_command`, row 2's `hba_file` in `postgresql.auto.conf`).
#[test]
fn the_configuration_files_of_a_snapshot_are_not_unpacked() {
    let root = tempdir();
    let path = root.join("configured.pgsnap");
    hostile_snapshot(
        &path,
        vec![
            file("PG_VERSION", b"15\n"),
            dir("global"),
            file("global/pg_control", &[7u8; 64]),
            file("postgresql.auto.conf", b"restore_command = 'sh ./x.sh'\n"),
            file("postgresql.conf", b"hba_file = '/tmp/open'\n"),
            file("pg_hba.conf", b"host all all 0/0 trust\n"),
            file("pg_ident.conf", b"x y z\n"),
        ],
    );
    let out = root.join("out");
    extract_file(&path, &out, None).expect("unpacked");
    for name in unpack::CONFIG_FILES {
        assert!(!out.join(name).exists(), "{name} was unpacked");
    }
    assert!(out.join("global/pg_control").exists());
    let _ = std::fs::remove_dir_all(&root);
}

//! The rule of who controls a command's files, on made-up trees (each test one way to give
//! another user that control), and once on the real file system as root.

use std::collections::BTreeMap;

use super::*;

/// A made-up file system: each path's entry; a directory's children are the paths one
/// component below it.
#[derive(Default)]
struct Fake(BTreeMap<PathBuf, Entry>);

impl Fake {
    /// `/srv/app` (and its parents) as a root-owned checkout no one else can write, with a
    /// script and a migrations directory.
    fn checkout(owner: u32) -> Fake {
        let mut tree = Fake::default();
        tree.dir("/", 0, 0o755)
            .dir("/srv", 0, 0o755)
            .dir("/srv/app", owner, 0o755)
            .file("/srv/app/migrate.sh", owner, 0o755)
            .dir("/srv/app/migrations", owner, 0o755)
            .file("/srv/app/migrations/001.sql", owner, 0o644);
        tree
    }

    fn put(&mut self, path: &str, uid: u32, mode: u32, kind: Kind) -> &mut Fake {
        let type_bits = match kind {
            Kind::Dir => 0o040000,
            Kind::Link => 0o120000,
            Kind::Other => 0o100000,
        };
        self.0.insert(
            PathBuf::from(path),
            Entry {
                uid,
                gid: uid,
                mode: type_bits | mode,
                kind,
            },
        );
        self
    }

    fn dir(&mut self, path: &str, uid: u32, mode: u32) -> &mut Fake {
        self.put(path, uid, mode, Kind::Dir)
    }

    fn file(&mut self, path: &str, uid: u32, mode: u32) -> &mut Fake {
        self.put(path, uid, mode, Kind::Other)
    }
}

impl Tree for Fake {
    fn lstat(&self, path: &Path) -> io::Result<Entry> {
        self.0
            .get(path)
            .copied()
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
    }

    fn children(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        Ok(self
            .0
            .keys()
            .filter(|path| path.parent() == Some(dir))
            .cloned()
            .collect())
    }
}

fn decide_for(tree: &Fake, named: &[&str]) -> CommandUser {
    let named: Vec<PathBuf> = named.iter().map(PathBuf::from).collect();
    decide(tree, Path::new("/srv/app"), &named, 1000)
}

fn reason(user: CommandUser) -> String {
    match user {
        CommandUser::ChildUser { reason } => reason,
        owner => panic!("expected the child user, got {owner:?}"),
    }
}

#[test]
fn a_root_owned_checkout_no_one_else_can_write_runs_as_root() {
    let user = decide_for(&Fake::checkout(0), &["/srv/app/migrate.sh"]);
    assert!(
        matches!(&user, CommandUser::Owner { uid: 0, gid: 0, workdir, .. } if workdir == Path::new("/srv/app")),
        "{user:?}"
    );
}

#[test]
fn a_users_checkout_under_root_owned_parents_runs_as_that_user() {
    let mut tree = Fake::checkout(1000);
    // A file root put there changes nothing: root is trusted anyway.
    tree.file("/srv/app/root-made", 0, 0o644);
    let user = decide_for(&tree, &[]);
    assert!(
        matches!(user, CommandUser::Owner { uid: 1000, .. }),
        "{user:?}"
    );
}

#[test]
fn a_parent_others_may_write_gives_no_one_control_even_when_sticky() {
    let mut tree = Fake::checkout(0);
    tree.dir("/srv", 0, 0o1777);
    assert_eq!(
        reason(decide_for(&tree, &[])),
        "/srv is writable by others (mode 1777)"
    );
}

#[test]
fn a_group_writable_directory_or_file_gives_no_one_control() {
    let mut tree = Fake::checkout(0);
    tree.dir("/srv/app", 0, 0o775);
    assert_eq!(
        reason(decide_for(&tree, &[])),
        "/srv/app is writable by its group (mode 0775)"
    );
    let mut tree = Fake::checkout(0);
    tree.file("/srv/app/migrations/001.sql", 0, 0o664);
    assert_eq!(
        reason(decide_for(&tree, &[])),
        "/srv/app/migrations/001.sql is writable by its group (mode 0664)"
    );
}

#[test]
fn a_script_others_may_write_gives_no_one_control() {
    let mut tree = Fake::checkout(0);
    tree.file("/srv/app/migrate.sh", 0, 0o757);
    assert_eq!(
        reason(decide_for(&tree, &["/srv/app/migrate.sh"])),
        "/srv/app/migrate.sh is writable by others (mode 0757)"
    );
}

#[test]
fn an_entry_or_parent_of_a_third_user_gives_no_one_control() {
    let mut tree = Fake::checkout(1000);
    tree.file("/srv/app/migrations/002.sql", 1001, 0o644);
    assert_eq!(
        reason(decide_for(&tree, &[])),
        "/srv/app/migrations/002.sql belongs to uid 1001, neither root nor the owner of the working directory (uid 1000)"
    );
    let mut tree = Fake::checkout(1000);
    tree.dir("/srv", 1001, 0o755);
    assert!(reason(decide_for(&tree, &[])).starts_with("/srv belongs to uid 1001"));
}

#[test]
fn a_named_file_outside_is_checked_with_its_parents() {
    let mut tree = Fake::checkout(0);
    tree.dir("/opt", 0, 0o755)
        .dir("/opt/shared", 1001, 0o755)
        .file("/opt/shared/migrate.sh", 0, 0o755);
    assert!(reason(decide_for(&tree, &["/opt/shared/migrate.sh"]))
        .starts_with("/opt/shared belongs to uid 1001"));
    tree.dir("/opt/shared", 0, 0o755);
    assert!(matches!(
        decide_for(&tree, &["/opt/shared/migrate.sh"]),
        CommandUser::Owner { uid: 0, .. }
    ));
}

#[test]
fn a_named_file_reached_through_a_link_others_may_replace_gives_no_one_control() {
    let mut tree = Fake::checkout(0);
    // `sh /tmp/link/migrate.sh`, /tmp/link -> /srv/app: the target is root's, but whoever
    // made the link in /tmp may point it elsewhere once the check is done.
    tree.dir("/tmp", 0, 0o1777)
        .put("/tmp/link", 1001, 0o777, Kind::Link)
        .file("/tmp/link/migrate.sh", 0, 0o755);
    assert_eq!(
        reason(decide_for(
            &tree,
            &["/tmp/link/migrate.sh", "/srv/app/migrate.sh"]
        )),
        "/tmp is writable by others (mode 1777)"
    );
}

#[test]
fn links_inside_are_not_followed_and_not_held_against_the_owner() {
    let mut tree = Fake::checkout(0);
    // What a venv holds: python -> /usr/bin/python3, 0777 as every link.
    tree.put("/srv/app/python", 0, 0o777, Kind::Link);
    assert!(matches!(
        decide_for(&tree, &[]),
        CommandUser::Owner { uid: 0, .. }
    ));
}

#[test]
fn a_tree_beyond_the_limit_or_an_unreadable_one_runs_as_the_child_user() {
    let tree = Fake::checkout(0);
    let user = decide(&tree, Path::new("/srv/app"), &[], 2);
    assert!(reason(user).contains("more than 2 entries"));
    let user = decide(&tree, Path::new("/srv/gone"), &[], 1000);
    assert!(reason(user).starts_with("cannot check /srv/gone"));
    let user = decide(&tree, Path::new("srv/app"), &[], 1000);
    assert!(reason(user).contains("not an absolute path"));
    let user = decide(&tree, Path::new("/srv/app/migrate.sh"), &[], 1000);
    assert!(reason(user).contains("not a directory"));
}

/// The real file system as root: a root-owned 0755 directory under a 0700 parent is
/// root's; made group-writable, nobody's. It is made in the build's target directory,
/// not under /tmp, which others may write.
#[test]
fn on_disk_a_root_checkout_is_roots_until_its_group_may_write_it() {
    use std::os::unix::fs::PermissionsExt;
    if !nix::unistd::geteuid().is_root() {
        eprintln!("not root: the on-disk rule is not tried");
        return;
    }
    let base = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../target")
        .join(format!("control-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(base.join("app")).expect("mkdir");
    let base = std::fs::canonicalize(&base).expect("canonical");
    let app = base.join("app");
    std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    std::fs::set_permissions(&app, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::fs::write(app.join("migrate.sh"), "true\n").expect("write");
    std::fs::set_permissions(
        app.join("migrate.sh"),
        std::fs::Permissions::from_mode(0o755),
    )
    .expect("chmod");
    let ancestors_closed = app.ancestors().skip(1).all(|dir| {
        Disk.lstat(dir)
            .is_ok_and(|e| e.mode & 0o022 == 0 && e.uid == 0)
    });
    if ancestors_closed {
        let user = who_controls(&app, "sh migrate.sh");
        assert!(
            matches!(user, CommandUser::Owner { uid: 0, .. }),
            "{user:?}"
        );
    } else {
        eprintln!(
            "{}: a parent is open to others; only the refusal is tried",
            base.display()
        );
    }
    std::fs::set_permissions(&app, std::fs::Permissions::from_mode(0o775)).expect("chmod");
    let user = who_controls(&app, "sh migrate.sh");
    assert!(
        reason(user).contains("is writable by"),
        "a group-writable checkout is nobody's"
    );
    let _ = std::fs::remove_dir_all(&base);
}

#[test]
fn named_files_are_the_words_that_exist_resolved() {
    let dir = std::env::temp_dir().join(format!("pglease-named-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("bin")).expect("mkdir");
    std::fs::write(dir.join("bin/migrate"), "").expect("write");
    std::fs::write(dir.join("manage.py"), "").expect("write");
    let dir = std::fs::canonicalize(&dir).expect("canonical");
    let named = named_files(
        &dir,
        "python manage.py migrate --noinput && ./bin/migrate $HOME >/dev/null",
    );
    assert_eq!(named, vec![dir.join("bin/migrate"), dir.join("manage.py")]);
    // Through a link: as written (whose holder must be checked) and where it leads.
    std::os::unix::fs::symlink(dir.join("bin"), dir.join("link")).expect("symlink");
    let named = named_files(&dir, "sh link/migrate");
    assert_eq!(
        named,
        vec![dir.join("bin/migrate"), dir.join("link/migrate")]
    );
    let _ = std::fs::remove_dir_all(&dir);
}

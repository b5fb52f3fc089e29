//! What a failed command's error says about who ran it: the path a "Permission denied"
//! line names, and the recipe for the child user and for the owner.

use super::*;

fn runner(is_child_user: bool, uid: u32) -> Runner {
    Runner {
        user: ChildUser {
            name: if is_child_user { "nobody" } else { "root" }.into(),
            uid,
            gid: uid,
            home: PathBuf::from("/nonexistent"),
            switch: true,
        },
        why: "/tmp is writable by others (mode 1777)".into(),
        is_child_user,
        workdir: PathBuf::from("/srv/app"),
        _home: None,
    }
}

#[test]
fn the_path_a_permission_denied_line_names_is_found() {
    let cases = [
        ("sh: 1: python: Permission denied", "python"),
        (
            "/bin/sh: 1: /root/.pyenv/shims/python3: Permission denied",
            "/root/.pyenv/shims/python3",
        ),
        (
            "python3: can't open file '/srv/app/manage.py': [Errno 13] Permission denied",
            "/srv/app/manage.py",
        ),
        (
            "mkdir: cannot create directory \u{2018}/nonexistent\u{2019}: Permission denied",
            "/nonexistent",
        ),
        (
            "java.io.FileNotFoundException: /nonexistent/.m2/settings.xml (Permission denied)",
            "/nonexistent/.m2/settings.xml",
        ),
        (
            "bash: line 1: ./migrate.sh: Permission denied",
            "./migrate.sh",
        ),
    ];
    for (line, path) in cases {
        assert_eq!(unreachable_path(line).as_deref(), Some(path), "{line}");
    }
    assert_eq!(unreachable_path("no such thing"), None);
}

#[test]
fn the_child_users_recipe_names_the_user_why_and_what_to_change() {
    let tail = vec![
        "running migrations".to_owned(),
        "sh: 1: python: Permission denied".to_owned(),
    ];
    let text = runner(true, 65534)
        .recipe(Some(126), &tail)
        .expect("a recipe");
    assert!(
        text.starts_with("it ran as user nobody (uid 65534) because /tmp is writable by others (mode 1777); nobody could not reach python"),
        "{text}"
    );
    assert!(
        text.contains("Run it from a checkout no other user can write"),
        "{text}"
    );
    assert!(text.contains("--child-user"), "{text}");
}

#[test]
fn the_owners_recipe_and_no_recipe_for_other_failures() {
    let text = runner(false, 0)
        .recipe(Some(127), &["sh: 1: alembic: not found".to_owned()])
        .expect("a recipe");
    assert!(
        text.starts_with("it ran as user root (uid 0) because"),
        "{text}"
    );
    assert!(
        text.contains("a program was not found in the PATH it ran with"),
        "{text}"
    );
    assert!(!text.contains("--child-user"), "{text}");
    let text = runner(true, 65534)
        .recipe(Some(127), &["sh: 1: alembic: Permission denied".to_owned()])
        .expect("a recipe");
    assert!(!text.contains("not found"), "found, but closed: {text}");
    assert_eq!(
        runner(true, 65534).recipe(
            Some(1),
            &["ERROR: relation \"x\" does not exist".to_owned()]
        ),
        None
    );
}

#[test]
fn a_home_that_does_not_exist_gets_a_recipe() {
    let tail = [
        "[ERROR] Could not create local repository at /nonexistent/.m2/repository -> [Help 1]"
            .to_owned(),
    ];
    let text = runner(true, 65534)
        .recipe(Some(1), &tail)
        .expect("a recipe");
    assert!(
        text.contains("its HOME, /nonexistent, does not exist"),
        "{text}"
    );
    assert!(
        text.contains("make a home directory reachable by nobody"),
        "{text}"
    );
}

#[test]
fn a_directory_closed_to_the_user_on_the_way_is_named() {
    // /root is 0700 on every Debian machine; the test's scratch space is not needed.
    let Ok(meta) = std::fs::metadata("/root") else {
        return;
    };
    use std::os::unix::fs::MetadataExt;
    if meta.mode() & 0o001 != 0 {
        return;
    }
    assert_eq!(
        first_closed(Path::new("/root/.pyenv/shims/python3"), 65534, 65534),
        Some((PathBuf::from("/root"), meta.mode() & 0o7777))
    );
    assert_eq!(
        first_closed(Path::new("/root/x"), 0, 0),
        None,
        "root enters anything"
    );
}

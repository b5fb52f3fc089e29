//! The child user's fences, tried as root (as CI runs): a file only root may read stays
//! unread through [`ChildUser::read`] while the daemon's other threads keep root's rights,
//! and a child runs as that user with none of the daemon's environment.

use std::os::unix::fs::PermissionsExt;

use super::*;

fn scratch(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("pglease-child-user-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    dir
}

/// The user these tests switch to, when they run as root (else they say so and pass).
fn nobody() -> Option<ChildUser> {
    if !geteuid().is_root() {
        eprintln!("not root: nothing to switch to, the fences are not tried");
        return None;
    }
    Some(ChildUser::resolve(None).expect("nobody exists"))
}

#[tokio::test]
async fn a_file_only_root_may_read_is_refused_to_the_reading_thread_alone() {
    let Some(user) = nobody() else { return };
    assert_eq!(user.name, "nobody");
    let dir = scratch("read");
    let secret = dir.join("secret");
    std::fs::write(&secret, "root only").expect("write");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let open = dir.join("open");
    std::fs::write(&open, "anyone").expect("write");
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).expect("chmod");

    let path = secret.clone();
    let refused = user
        .read(move || std::fs::read_to_string(path))
        .await
        .expect("thread");
    let error = refused.expect_err("nobody cannot read a 0600 root file");
    assert_eq!(
        error.kind(),
        std::io::ErrorKind::PermissionDenied,
        "{error}"
    );
    let path = open.clone();
    let read = user
        .read(move || std::fs::read_to_string(path))
        .await
        .expect("thread");
    assert_eq!(read.expect("world-readable"), "anyone");
    // The rest of the process kept root's rights.
    assert_eq!(
        std::fs::read_to_string(&secret).expect("root reads it"),
        "root only"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn a_child_runs_as_the_user_without_groups_or_the_daemons_environment() {
    let Some(user) = nobody() else { return };
    // The daemon's environment holds secrets (the API token) a child must not see; cargo
    // gives this test process variables of its own that stand for them.
    assert!(std::env::var_os("CARGO_MANIFEST_DIR").is_some());
    let out = user
        .command("sh")
        .arg("-c")
        .arg("id -u; id -G; echo \"inherited=${CARGO_MANIFEST_DIR-none} given=$GIVEN home=$HOME user=$USER\"")
        .env("GIVEN", "yes")
        .output()
        .await
        .expect("sh runs");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], user.uid.to_string());
    assert_eq!(lines[1], user.gid.to_string(), "only the primary group");
    assert_eq!(
        lines[2],
        format!(
            "inherited=none given=yes home={} user=nobody",
            user.home.display()
        )
    );
}

#[test]
fn root_is_refused_as_the_child_user() {
    if !geteuid().is_root() {
        return;
    }
    let error = ChildUser::resolve(Some("root")).expect_err("root is refused");
    assert!(error.to_string().contains("uid 0"), "{error}");
    let error = ChildUser::resolve(Some("no-such-user-here")).expect_err("unknown");
    assert!(error.to_string().contains("no such user"), "{error}");
}

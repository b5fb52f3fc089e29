//! deploy/systemd/pglease.service: `systemd-analyze verify` accepts it, and its ExecStart —
//! the same flags, a non-root user, the data directory on tmpfs — runs the daemon, which
//! tells systemd READY=1, feeds the watchdog and says STOPPING=1 at SIGTERM.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::support::{binary, process_alive};

const UNIT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/deploy/systemd/pglease.service"
);
const CONFIG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/systemd/pglease.toml");

fn exec_start() -> String {
    let unit = std::fs::read_to_string(UNIT).expect("read the unit");
    unit.lines()
        .find_map(|line| line.strip_prefix("ExecStart="))
        .expect("an ExecStart line")
        .to_owned()
}

#[test]
fn systemd_analyze_verifies_the_unit() {
    if !crate::support::tool_available(
        "systemd-analyze",
        "systemd_analyze_verifies_the_unit",
        "apt-get install systemd",
    ) {
        return;
    }
    // verify insists that the executable exists: point it at the binary under test.
    let dir = crate::support::scratch_dir("unit-verify");
    let unit = std::fs::read_to_string(UNIT)
        .expect("read")
        .replace("/usr/local/bin/pglease", env!("CARGO_BIN_EXE_pglease"));
    let path = dir.join("pglease.service");
    std::fs::write(&path, unit).expect("write");
    let out = std::process::Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("Unknown"), "{stderr}");
}

/// A directory owned by `owner` (when we are root), mode 0700.
fn owned_dir(path: &Path, owner: Option<(u32, u32)>) {
    let _ = std::fs::remove_dir_all(path);
    std::fs::create_dir_all(path).expect("mkdir");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    if let Some((uid, gid)) = owner {
        nix::unistd::chown(path, Some(uid.into()), Some(gid.into())).expect("chown");
    }
}

#[test]
fn the_units_exec_start_runs_as_a_non_root_user_and_talks_to_systemd() {
    let root = nix::unistd::geteuid().is_root();
    // systemd's DynamicUser stands for an unprivileged user: `nobody` here when we are root.
    let owner = root.then(|| {
        let user = nix::unistd::User::from_name("nobody")
            .ok()
            .flatten()
            .expect("user nobody");
        (user.uid.as_raw(), user.gid.as_raw())
    });
    let base = PathBuf::from(format!(
        "/dev/shm/pglease-test-systemd-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).expect("mkdir");
    std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let (runtime, cache, config) = (base.join("run"), base.join("cache"), base.join("etc"));
    for dir in [&runtime, &cache, &config] {
        owned_dir(dir, owner);
    }
    // The unit's ExecStartPre puts the token in the runtime directory.
    std::fs::write(runtime.join("token"), "unit-token\n").expect("token");
    std::fs::copy(CONFIG, config.join("pglease.toml")).expect("config");
    // The notify socket systemd would provide; the daemon's user must be able to send to it.
    let notify_path = base.join("notify");
    let notify = UnixDatagram::bind(&notify_path).expect("bind notify socket");
    std::fs::set_permissions(&notify_path, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    notify
        .set_read_timeout(Some(Duration::from_secs(1)))
        .expect("timeout");

    let line = exec_start()
        .replace("${CONFIGURATION_DIRECTORY}", config.to_str().expect("utf8"))
        .replace("${RUNTIME_DIRECTORY}", runtime.to_str().expect("utf8"))
        .replace("${CACHE_DIRECTORY}", cache.to_str().expect("utf8"));
    let mut words = line.split_whitespace();
    assert_eq!(words.next(), Some("/usr/local/bin/pglease"));
    let mut command = binary();
    // The unit's flags, plus a free port instead of the config's fixed 5480.
    command
        .args(words)
        .args(["--listen", "127.0.0.1:0"])
        .env("NOTIFY_SOCKET", &notify_path)
        .env("WATCHDOG_USEC", "1000000")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Ok(bin_dir) = std::env::var(crate::support::PG_BIN_ENV) {
        command.arg("--pg-bin-dir").arg(bin_dir);
    }
    if let Some((uid, gid)) = owner {
        command.uid(uid).gid(gid);
    }
    let mut child = command
        .spawn()
        .expect("spawn the daemon as the service user");
    let stderr = child.stderr.take().expect("stderr");
    let log = std::thread::spawn(move || {
        use std::io::Read;
        let mut text = String::new();
        let _ = std::io::BufReader::new(stderr).read_to_string(&mut text);
        text
    });

    let mut messages = Vec::new();
    let started = Instant::now();
    let mut buf = [0u8; 512];
    while started.elapsed() < Duration::from_secs(60)
        && !(messages.iter().any(|m: &String| m.contains("READY=1"))
            && messages.iter().any(|m| m.contains("WATCHDOG=1")))
    {
        if let Ok(n) = notify.recv(&mut buf) {
            messages.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
    }
    let ready = messages.iter().any(|m| m.contains("READY=1"));
    let fed = messages.iter().any(|m| m.contains("WATCHDOG=1"));
    // postgres runs as the service user, from the tmpfs runtime directory.
    let postmaster = std::fs::read_dir(runtime.join("data"))
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .find_map(|entry| std::fs::read_to_string(entry.path().join("postmaster.pid")).ok())
        .and_then(|pid| {
            pid.lines()
                .next()
                .and_then(|l| l.trim().parse::<u32>().ok())
        });
    let postmaster_uid = postmaster.and_then(|pid| {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("Uid:"))
                    .and_then(|r| {
                        r.split_whitespace()
                            .next()
                            .and_then(|u| u.parse::<u32>().ok())
                    })
            })
    });

    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let stopping_deadline = Instant::now();
    while stopping_deadline.elapsed() < Duration::from_secs(20)
        && !messages.iter().any(|m| m.contains("STOPPING=1"))
    {
        if let Ok(n) = notify.recv(&mut buf) {
            messages.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
    }
    let status = child.wait().expect("wait");
    let log = log.join().unwrap_or_default();
    let _ = std::fs::remove_dir_all(&base);

    assert!(ready, "no READY=1 from the daemon: {messages:?}\n{log}");
    // Only pglease talks to systemd (postgres, built with systemd support, would otherwise
    // announce READY=1 itself; its messages have no trailing newline).
    assert!(messages.iter().all(|m| m.ends_with('\n')), "{messages:?}");
    assert!(fed, "no WATCHDOG=1: {messages:?}\n{log}");
    assert!(
        messages.iter().any(|m| m.contains("STOPPING=1")),
        "no STOPPING=1: {messages:?}"
    );
    assert!(status.success(), "{status:?}\n{log}");
    let pid = postmaster
        .unwrap_or_else(|| panic!("no postmaster.pid under the runtime directory\n{log}"));
    assert!(!process_alive(pid), "postgres outlived the daemon");
    let expected_uid = owner.map_or_else(|| nix::unistd::geteuid().as_raw(), |(uid, _)| uid);
    assert_eq!(
        postmaster_uid,
        Some(expected_uid),
        "postgres runs as the service user"
    );
}

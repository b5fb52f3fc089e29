//! The MAC: a sealed file is accepted only unchanged and under its own key; the second
//! reading catches a file rewritten after the check.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use super::super::key::SnapshotKey;
use super::{SealError, Sealed, Sealing, TRAILER_LEN};

fn key(byte: u8) -> SnapshotKey {
    SnapshotKey::from_bytes(&[byte; 32], Path::new("/test/snapshot.key"))
}

/// A stream like a snapshot's: zstd of some bytes that do not compress (tens of KB).
fn stream() -> Vec<u8> {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let data: Vec<u8> = (0..50_000)
        .map(|_| {
            // xorshift: cheap bytes zstd cannot shrink.
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    zstd::encode_all(data.as_slice(), 1).expect("zstd")
}

fn seal(stream: &[u8], key: &SnapshotKey) -> Vec<u8> {
    let mut sealing = Sealing::new(Vec::new(), key);
    sealing.write_all(stream).expect("write");
    sealing.seal().expect("seal")
}

fn file_with(bytes: &[u8], name: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!(
        "pglease-seal-{}-{name}-{}",
        std::process::id(),
        super::super::super::util::random_hex(4)
    ));
    std::fs::write(&path, bytes).expect("write");
    path
}

fn verify(bytes: &[u8], key: &SnapshotKey) -> Result<Sealed, SealError> {
    let path = file_with(bytes, "verify");
    let file = std::fs::File::open(&path).expect("open");
    let result = Sealed::verify(file, &path, key);
    let _ = std::fs::remove_file(&path);
    result
}

#[test]
fn a_sealed_stream_verifies_and_reads_back_whole() {
    let stream = stream();
    let bytes = seal(&stream, &key(1));
    assert_eq!(bytes.len() as u64, stream.len() as u64 + TRAILER_LEN);
    let sealed = verify(&bytes, &key(1)).expect("verified");
    let mut reader = sealed.reader(&key(1));
    let mut read = Vec::new();
    reader.read_to_end(&mut read).expect("read");
    assert_eq!(read, stream, "the reader stops before the trailer");
    reader.finish().expect("the second reading matches");
}

#[test]
fn a_bit_flipped_anywhere_is_refused() {
    let bytes = seal(&stream(), &key(1));
    // Every 97th byte, then the trailer's every byte: stream, magic, version, key id, tag.
    let positions = (0..bytes.len())
        .step_by(97)
        .chain(bytes.len() - TRAILER_LEN as usize..bytes.len());
    for at in positions {
        let mut flipped = bytes.clone();
        flipped[at] ^= 0x01;
        let error = verify(&flipped, &key(1))
            .err()
            .unwrap_or_else(|| panic!("a bit flipped at {at} of {} verified", bytes.len()));
        let trailer_at = at as u64 >= bytes.len() as u64 - TRAILER_LEN;
        assert!(
            matches!(error, SealError::Altered)
                || (trailer_at
                    && matches!(
                        error,
                        SealError::NoMac
                            | SealError::UnknownVersion(_)
                            | SealError::OtherKey { .. }
                    )),
            "a bit flipped at {at}: {error}"
        );
    }
}

#[test]
fn a_truncated_file_or_one_without_its_trailer_is_refused() {
    let stream = stream();
    let bytes = seal(&stream, &key(1));
    for cut in [1, 10, 32, 56, bytes.len() / 2, bytes.len() - 1] {
        let error = verify(&bytes[..bytes.len() - cut], &key(1))
            .err()
            .unwrap_or_else(|| panic!("cut by {cut} verified"));
        assert!(
            matches!(
                error,
                SealError::NoMac | SealError::Altered | SealError::NotASnapshot
            ),
            "cut by {cut}: {error}"
        );
    }
    // The trailer removed: an older pglease's snapshot, as far as anyone can tell.
    let error = verify(&stream, &key(1)).expect_err("no trailer verified");
    assert!(matches!(error, SealError::NoMac), "{error}");
    assert!(
        error.to_string().contains("written by an older pglease"),
        "{error}"
    );
    // Not even zstd.
    let error = verify(b"hello", &key(1)).expect_err("garbage verified");
    assert!(matches!(error, SealError::NotASnapshot), "{error}");
}

#[test]
fn a_file_sealed_with_another_key_is_refused_and_said_so() {
    let bytes = seal(&stream(), &key(2));
    let error = verify(&bytes, &key(1)).expect_err("another key's file verified");
    assert!(matches!(error, SealError::OtherKey { .. }), "{error}");
    assert!(
        error.to_string().contains("made with another key"),
        "{error}"
    );
    // With the other key's id copied in, the tag still does not match.
    let mut forged = bytes.clone();
    let id_at = bytes.len() - TRAILER_LEN as usize + 16;
    forged[id_at..id_at + 8].copy_from_slice(&key(1).id());
    let error = verify(&forged, &key(1)).expect_err("a copied key id verified");
    assert!(matches!(error, SealError::Altered), "{error}");
}

/// The time-of-check gap: a file rewritten in place (same inode, same length) after its MAC
/// was checked is caught by the second reading, from the same descriptor.
#[test]
fn a_file_rewritten_after_the_check_fails_the_second_reading() {
    let stream = stream();
    let bytes = seal(&stream, &key(1));
    let path = file_with(&bytes, "rewritten");
    let file = std::fs::File::open(&path).expect("open");
    let sealed = Sealed::verify(file, &path, &key(1)).expect("verified");
    let mut changed = bytes.clone();
    changed[100] ^= 0xff;
    let mut writer = std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open for writing");
    writer.write_all(&changed).expect("rewrite in place");
    drop(writer);
    let mut reader = sealed.reader(&key(1));
    let mut read = Vec::new();
    reader.read_to_end(&mut read).expect("read");
    let error = reader.finish().expect_err("a rewritten file passed");
    assert!(matches!(error, SealError::ChangedWhileRead), "{error}");
    // Cut after the check: the reading fails.
    std::fs::write(&path, &bytes[..1000]).expect("truncate");
    let mut reader = sealed.reader(&key(1));
    assert!(reader.read_to_end(&mut Vec::new()).is_err());
    let _ = std::fs::remove_file(&path);
}

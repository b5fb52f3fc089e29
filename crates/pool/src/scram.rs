//! SCRAM-SHA-256 verifiers computed in the daemon, so lease roles can be given a low
//! iteration count: postgres accepts `SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`
//! as a password and the count travels to clients in the exchange. With a random 32-byte
//! password the iteration count protects nothing (there is nothing to brute-force); the
//! default is postgres' own 4096 all the same, which every common driver accepts, and
//! `--scram-iterations 16` saves 1-7 ms of CPU a connection where every client takes fewer.
//!
//! It only computes strings; sending them to postgres is `session.rs`'s job.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

type HmacSha256 = Hmac<Sha256>;

/// A fresh random password: 32 bytes from the OS, hex-encoded (safe in URLs and SQL).
pub fn random_password() -> String {
    hex::encode(rand::random::<[u8; 32]>())
}

/// The verifier postgres stores for `password` with a random 16-byte salt.
///
/// [`verifier_with_salt`] takes half the CPU of `postgres-protocol`'s, which keys a new HMAC
/// at every iteration (measured: 0.5 against 1.0 ms for postgres' count, 4096: a clone pays
/// it once). One path in every build: the workspace's Cargo.toml optimizes PBKDF2 and its
/// hashes in test builds too (unoptimized, 4096 iterations take ~65 ms).
pub fn verifier(password: &str, iterations: u32) -> String {
    verifier_with_salt(password, &rand::random::<[u8; 16]>(), iterations)
}

/// Postgres' own iteration count, the one `postgres_protocol::password::scram_sha_256` uses
/// (and the minimum some drivers accept: Go's lib/pq, pg8000). Roles whose clients are not
/// known to accept fewer (the build roles, the IntegreSQL clients' role) get it.
pub(crate) const STANDARD_ITERATIONS: u32 = 4096;

/// The verifier for a given salt (RFC 5802 / RFC 7677 key derivation).
pub fn verifier_with_salt(password: &str, salt: &[u8], iterations: u32) -> String {
    let iterations = iterations.max(1);
    let mut salted = [0u8; 32];
    // Our passwords are ASCII hex, which SASLprep leaves unchanged.
    pbkdf2::pbkdf2_hmac::<Sha256>(password.as_bytes(), salt, iterations, &mut salted);
    let client_key = hmac(&salted, b"Client Key");
    let stored_key = Sha256::digest(client_key);
    let server_key = hmac(&salted, b"Server Key");
    format!(
        "SCRAM-SHA-256${iterations}:{}${}:{}",
        BASE64.encode(salt),
        BASE64.encode(stored_key),
        BASE64.encode(server_key)
    )
}

fn hmac(key: &[u8], message: &[u8]) -> [u8; 32] {
    // HMAC takes keys of any length; this cannot fail.
    let mut mac = <HmacSha256 as KeyInit>::new_from_slice(key)
        .unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
    mac.update(message);
    mac.finalize().into_bytes().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_an_independent_computation() {
        // Computed with Python's hashlib.pbkdf2_hmac and hmac for the same inputs.
        let salt: Vec<u8> = (0..16).collect();
        assert_eq!(
            verifier_with_salt("pencil", &salt, 16),
            "SCRAM-SHA-256$16:AAECAwQFBgcICQoLDA0ODw==$+kTDhE5a05ruQ0C5RBlOHRYDRcv0gxvznYMokbgpYGM=:8m8MqeQNWkjldDnQ0nx67zREkBE9a+/1g3bDqZTIgZ4="
        );
    }

    /// What release builds store at postgres' count (computed the same way with Python).
    #[test]
    fn matches_an_independent_computation_at_postgres_count() {
        let salt: Vec<u8> = (0..16).collect();
        assert_eq!(
            verifier_with_salt("pencil", &salt, STANDARD_ITERATIONS),
            "SCRAM-SHA-256$4096:AAECAwQFBgcICQoLDA0ODw==$zHCdol2044/ZyWzPLi7oxApCkamKw9Z+E4U/QApd/5Y=:dd5peBOitVnLNFu7VmwP+HiDaaw4OUCv396eVCWhYiE="
        );
    }

    #[test]
    fn passwords_and_salts_are_fresh() {
        let (a, b) = (random_password(), random_password());
        assert_ne!(a, b);
        assert_eq!(a.len(), 64);
        assert_ne!(verifier(&a, 1), verifier(&a, 1), "a new salt each time");
        assert!(
            verifier(&a, 0).starts_with("SCRAM-SHA-256$1:"),
            "at least one iteration"
        );
    }
}

#[cfg(test)]
mod postgres_count {
    /// Postgres' count in postgres' text form (from postgres-protocol in test builds; the
    /// integration tests log in with it against real servers).
    #[test]
    fn the_default_count_is_postgres_own() {
        let verifier = super::verifier("0123456789abcdef", 4096);
        assert!(verifier.starts_with("SCRAM-SHA-256$4096:"), "{verifier}");
        assert_eq!(verifier.split(['$', ':']).count(), 5, "{verifier}");
    }
}

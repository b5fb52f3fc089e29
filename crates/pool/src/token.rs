//! The daemon's token: what an HTTP client sends as `Authorization: Bearer` (`pglease-api`)
//! and a client of the PostgreSQL front as its password (`pglease-front`). One type, so
//! that both doors compare it the same way.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The token; its `Debug` does not show it.
#[derive(Clone)]
pub struct Token(String);

impl Token {
    /// Wraps a token; empty ones are refused by the caller.
    pub fn new(token: String) -> Self {
        Token(token)
    }

    /// Compares in constant time: both sides are hashed first, so neither the time taken
    /// nor the lengths tell anything about the token.
    pub fn matches(&self, given: &[u8]) -> bool {
        let (expected, given) = (Sha256::digest(self.0.as_bytes()), Sha256::digest(given));
        expected.as_slice().ct_eq(given.as_slice()).into()
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(***)")
    }
}

#[cfg(test)]
mod tests {
    use super::Token;

    #[test]
    fn only_the_token_itself_matches_and_debug_hides_it() {
        let token = Token::new("s3cret".into());
        assert!(token.matches(b"s3cret"));
        for wrong in [&b""[..], b"s3cre", b"s3cret ", b"S3CRET"] {
            assert!(!token.matches(wrong), "{wrong:?}");
        }
        assert_eq!(format!("{token:?}"), "Token(***)");
    }
}

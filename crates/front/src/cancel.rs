//! Cancel keys: each relayed connection's client gets a key of the front's own (a random
//! process id and secret) in place of its backend's, so that no client learns a backend's
//! key; a CancelRequest to the front's port is looked up here and sent on, with the backend's
//! real key, to the server that runs the query.
//!
//! The map holds an entry only while its connection is relayed (`Registration` removes it
//! when dropped). It does not decide who may cancel: as in postgres, whoever knows the key.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use bytes::BytesMut;
use subtle::ConstantTimeEq;
use tokio::io::AsyncWriteExt;

use crate::backend::{self, Address};
use crate::codec::CancelKey;

/// Where a cancel for one relayed connection goes.
#[derive(Debug, Clone)]
pub(crate) struct CancelTarget {
    /// The backend's server.
    pub(crate) address: Address,
    /// The backend's own key.
    pub(crate) key: CancelKey,
}

/// The front's keys of the connections it relays, by the process id it handed out.
#[derive(Debug, Clone, Default)]
pub(crate) struct CancelMap {
    entries: Arc<Mutex<HashMap<i32, (i32, CancelTarget)>>>,
}

impl CancelMap {
    /// Gives `target` a new key of the front's own, kept until the registration is dropped.
    pub(crate) fn register(&self, target: CancelTarget) -> Registration {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        // Positive, as process ids are: some clients print it as the server's pid.
        let process_id = loop {
            let candidate = rand::random_range(1..=i32::MAX);
            if !entries.contains_key(&candidate) {
                break candidate;
            }
        };
        let secret_key = rand::random();
        entries.insert(process_id, (secret_key, target));
        Registration {
            map: self.clone(),
            key: CancelKey {
                process_id,
                secret_key,
            },
        }
    }

    /// The target of the connection whose front key is `key`, if one is relayed; the secret
    /// is compared in constant time.
    pub(crate) fn lookup(&self, key: CancelKey) -> Option<CancelTarget> {
        let entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        let (secret, target) = entries.get(&key.process_id)?;
        let matches: bool = secret
            .to_be_bytes()
            .ct_eq(&key.secret_key.to_be_bytes())
            .into();
        matches.then(|| target.clone())
    }

    /// How many connections have a key now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// A relayed connection's key; dropping it forgets the key.
#[derive(Debug)]
pub(crate) struct Registration {
    map: CancelMap,
    key: CancelKey,
}

impl Registration {
    /// The key the client is given (BackendKeyData).
    pub(crate) fn key(&self) -> CancelKey {
        self.key
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.map
            .entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.key.process_id);
    }
}

/// Sends a CancelRequest with the backend's own key to its server. Postgres answers a cancel
/// with nothing and closes; neither does the front tell its client how it went.
pub(crate) async fn forward(target: &CancelTarget) -> std::io::Result<()> {
    let mut stream = backend::open(&target.address).await?;
    let mut buf = BytesMut::new();
    postgres_protocol::message::frontend::cancel_request(
        target.key.process_id,
        target.key.secret_key,
        &mut buf,
    );
    stream.write_all(&buf).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(process_id: i32) -> CancelTarget {
        CancelTarget {
            address: Address {
                host: "127.0.0.1".into(),
                port: 5432,
            },
            key: CancelKey {
                process_id,
                secret_key: 1,
            },
        }
    }

    #[test]
    fn a_key_finds_its_target_while_registered_and_only_with_its_secret() {
        let map = CancelMap::default();
        let first = map.register(target(100));
        let second = map.register(target(200));
        assert_ne!(first.key().process_id, second.key().process_id);
        assert!(first.key().process_id > 0);
        let found = map.lookup(first.key()).expect("registered");
        assert_eq!(found.key.process_id, 100);
        let wrong_secret = CancelKey {
            secret_key: first.key().secret_key.wrapping_add(1),
            ..first.key()
        };
        assert!(map.lookup(wrong_secret).is_none());
        let key = first.key();
        drop(first);
        assert!(map.lookup(key).is_none(), "forgotten when dropped");
        assert_eq!(map.len(), 1);
        drop(second);
        assert_eq!(map.len(), 0);
    }
}

//! The keys over a real pool with a real postgres, in process: the grace keeps a key's
//! database for a connection that comes back and releases it after, a release over HTTP
//! ends the lease in the pool, and a key's next connection gets a new database. What the
//! pool is told is checked with the pool itself (a renewal of a released lease fails).
//! `PGLEASE_PG_BIN_DIR` names postgres' bin directory, as for `tests/it`; without it the
//! pool finds an installed server (or its cache, or a download) as the daemon does.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pglease_pool::{
    EmbeddedConfig, LeaseId, LeaseRequest, PoolConfig, PoolLimits, ServerConfig, Servers,
    TemplateName,
};

use super::{KeyName, Keys, Member};
use crate::error::{Refusal, SessionError};

/// Short, so that the test waits little for the grace; long enough that a connection that
/// comes back at once is well within it.
const GRACE: Duration = Duration::from_millis(500);
/// How long the test polls for what must happen soon.
const POLL_LIMIT: Duration = Duration::from_secs(30);

fn config() -> PoolConfig {
    let limits = PoolLimits::default();
    let mut server = EmbeddedConfig::for_limits(&limits, 1);
    server.bin_dir = std::env::var_os("PGLEASE_PG_BIN_DIR").map(Into::into);
    // initdb's result is cached between runs, apart from the daemon's own cache.
    server.cache_dir = Some(std::env::temp_dir().join("pglease-front-tests-cache"));
    PoolConfig {
        server: ServerConfig::Embedded(Box::new(server)),
        templates: Vec::new(),
        limits,
        clone_strategy: Default::default(),
        prebuild: false,
        lease_auth: Default::default(),
        lease_superuser: false,
        verify_templates: false,
        majors_on_request: false,
        child_user: None,
        integresql_role: None,
    }
}

/// A connection to `default.k` joins and gets the key's lease, leasing from the pool as a
/// session would when the key has none.
async fn connect(keys: &Arc<Keys>, servers: &Servers) -> (Member, pglease_pool::Lease) {
    let member = keys.join(match KeyName::parse("default.k") {
        Ok((_, Some(key))) => key,
        other => panic!("a key: {other:?}"),
    });
    let request = LeaseRequest {
        template: TemplateName::default_name(),
        ttl: None,
        wait: Duration::from_secs(60),
        connections: None,
        reclaimable: false,
        postgres_version: None,
        label: Some("default.k".into()),
    };
    let make = async {
        servers
            .lease(request)
            .await
            .map_err(|error| SessionError::Refused(Refusal::from(error)))
    };
    let lease = member.lease(make).await.expect("the key's lease");
    (member, lease)
}

/// Whether the pool still holds `id` open (a renewal succeeds).
async fn open(servers: &Servers, id: &LeaseId) -> bool {
    servers.renew(id.clone(), None).await.is_ok()
}

/// Polls until the pool no longer holds `id`.
async fn until_released(servers: &Servers, id: &LeaseId) {
    let start = Instant::now();
    while open(servers, id).await {
        assert!(start.elapsed() < POLL_LIMIT, "{id} was never released");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_over_a_real_pool_keeps_its_database_within_the_grace_and_releases_it_after() {
    let (servers, pool_task) = Servers::start(config()).await.expect("a real pool");
    let keys = Arc::new(Keys::new(servers.clone(), GRACE));

    let (first, lease) = connect(&keys, &servers).await;
    let (second, again) = connect(&keys, &servers).await;
    assert_eq!(again.id, lease.id, "one lease for the key's connections");
    assert_eq!(again.connect.database, lease.connect.database);
    // Both leave, and one comes back at once: the same database, still open in the pool.
    drop((first, second));
    let (back, kept) = connect(&keys, &servers).await;
    assert_eq!(kept.id, lease.id, "kept within the grace");
    assert!(open(&servers, &lease.id).await);
    // Gone for good: the pool gets the release a grace later, and the key's next
    // connection a new database.
    drop(back);
    until_released(&servers, &lease.id).await;
    let (fresh, next) = connect(&keys, &servers).await;
    assert_ne!(next.id, lease.id);
    assert_ne!(
        next.connect.database, lease.connect.database,
        "a new database"
    );

    // DELETE /front/keys/default.k while a connection is joined: released in the pool at
    // once, and the joined connection's key is gone.
    let released = keys.release("default.k").await.expect("released");
    assert_eq!(released, next.id);
    assert!(!open(&servers, &next.id).await, "released in the pool");
    assert!(keys.report().is_empty(), "{:?}", keys.report());
    drop(fresh);

    servers.shutdown().await;
    pool_task.await.expect("the pool stops");
}

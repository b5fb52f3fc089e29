//! Helpers for tests, here and in the crates above: how generated (proptest) tests run
//! ([`proptest_config`]), and a fake pool for tests of code that holds a [`PoolHandle`]
//! (the HTTP API, above all).
//! [`fake_pool`] returns a real handle whose commands arrive at a [`FakeActor`] instead of
//! the pool actor; the test receives each one as a [`FakeCommand`] and answers it through
//! its reply sender, exactly as the actor would.
//!
//! Only built with the `testing` feature, which crates enable for their dev-dependencies.
//! It starts no postgres, spawns no task and keeps no state: what the pool *would* answer is
//! entirely up to the test.

use tokio::sync::mpsc;

use crate::handle::{Command, PoolHandle};

/// How a generated test runs (the interleavings here, the front's codec): `default` cases,
/// or as many as the variable `env` says; at most `max_shrink_iters` steps to shrink a
/// failure. A failing case is kept (its seed, in `proptest-regressions/<module path>.txt`
/// beside the crate's `src`) and replayed first by every later run: commit that file with
/// the fix, so the case the search once found stays tested.
pub fn proptest_config(
    env: &str,
    default: u32,
    max_shrink_iters: u32,
) -> proptest::test_runner::Config {
    use proptest::test_runner::{Config, FileFailurePersistence};
    let cases = std::env::var(env)
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default);
    Config {
        cases,
        max_shrink_iters,
        failure_persistence: Some(Box::new(FileFailurePersistence::SourceParallel(
            "proptest-regressions",
        ))),
        ..Config::default()
    }
}

/// Commands a handle may queue before its `send` waits. Bounded like the real pool's
/// channel; tests queue at most a few.
const CHANNEL_CAPACITY: usize = 64;

/// A handle backed by a fake actor, and that actor.
/// Dropping the [`FakeActor`] makes the handle behave as if the pool had stopped.
pub fn fake_pool() -> (PoolHandle, FakeActor) {
    let (commands, receiver) = mpsc::channel(CHANNEL_CAPACITY);
    (PoolHandle::new(commands), FakeActor { receiver })
}

/// The receiving end of a [`fake_pool`]: plays the pool actor in a test.
#[derive(Debug)]
pub struct FakeActor {
    receiver: mpsc::Receiver<Command>,
}

impl FakeActor {
    /// Waits for the next command; `None` once every handle is dropped.
    pub async fn recv(&mut self) -> Option<FakeCommand> {
        self.receiver.recv().await
    }

    /// The next command if one is already queued; lets a test assert that a request
    /// was answered without reaching the pool.
    pub fn try_recv(&mut self) -> Option<FakeCommand> {
        self.receiver.try_recv().ok()
    }
}

/// One call made on the [`PoolHandle`], with the reply sender the caller is waiting on:
/// the very command the pool actor would receive.
pub use crate::handle::Command as FakeCommand;

//! How the interleaving tests run (`state/interleavings.rs`, `actor/interleavings.rs`): a
//! number of cases an environment variable can raise, and failing cases kept.

use proptest::test_runner::{Config, FileFailurePersistence};

/// `default` cases, or as many as the variable `env` says; at most `max_shrink_iters`
/// steps to shrink a failure. A failing case is kept (its seed, in
/// crates/pool/proptest-regressions/<module path>.txt) and replayed first by every later
/// run: commit that file with the fix, so the case the search once found stays tested.
pub(crate) fn interleavings(env: &str, default: u32, max_shrink_iters: u32) -> Config {
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

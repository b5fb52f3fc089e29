//! How the codec's generated tests run (`codec/tests.rs`), as the pool's interleavings do: a
//! number of cases an environment variable can raise, and failing cases kept.

use proptest::test_runner::{Config, FileFailurePersistence};

/// `default` cases, or as many as the variable `env` says. A failing case is kept (its seed,
/// in crates/front/proptest-regressions/<module path>.txt) and replayed first by every later
/// run: commit that file with the fix, so the case the search once found stays tested.
pub(crate) fn cases(env: &str, default: u32) -> Config {
    let cases = std::env::var(env)
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default);
    Config {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::SourceParallel(
            "proptest-regressions",
        ))),
        ..Config::default()
    }
}

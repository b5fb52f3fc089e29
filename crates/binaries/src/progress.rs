//! How a download tells whoever watches it how far it got: [`Progress`], given in the
//! [`crate::Request`]. This crate draws nothing itself: the `pglease` binary draws a bar on
//! a terminal, a library caller or a test passes [`NoProgress`].
//!
//! A download reports its start (with the size, when the server says it) to the
//! [`Progress`], which returns a [`Transfer`] for that download alone: two downloads at once
//! (two majors' servers starting together) report to two transfers, never to one.

use std::fmt;

/// What watches downloads. Shared by every download of a request (and of the requests
/// made from one configuration), so it only makes the per-download [`Transfer`].
pub trait Progress: Send + Sync {
    /// A download of `total` bytes (None: the server did not say) has started; what it
    /// reports from now on goes to the returned transfer.
    fn started(&self, total: Option<u64>) -> Box<dyn Transfer>;
}

/// One download's progress, from [`Progress::started`] on. A download that fails drops it
/// without [`Transfer::finished`].
pub trait Transfer: Send {
    /// `bytes` more arrived.
    fn advanced(&mut self, bytes: u64);
    /// Everything arrived and is on disk.
    fn finished(&mut self);
}

/// Reports nothing: for callers that show no progress.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoProgress;

impl Progress for NoProgress {
    fn started(&self, _total: Option<u64>) -> Box<dyn Transfer> {
        Box::new(NoProgress)
    }
}

impl Transfer for NoProgress {
    fn advanced(&mut self, _bytes: u64) {}

    fn finished(&mut self) {}
}

// So that a request (and the configurations holding one) can derive Debug; what watches
// has nothing worth printing.
impl fmt::Debug for dyn Progress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Progress")
    }
}

//! pglease as a library: the daemon's serve path ([`run`], [`Daemon`]) and the command line
//! that configures it ([`cli`]), which the `pglease` binary (`main.rs`) and the in-process
//! integration tests (tests/it/support) share, so that a test's flags mean what they mean
//! to the binary.
//!
//! What is process-wide stays in the binary: the tracing subscriber, signal handlers, the
//! open-files limit, sd_notify, exit codes, and the client subcommands. The Rust API here is
//! internal to the project (the HTTP API is the stable contract) and follows the binary.

pub mod cli;
mod daemon;
mod listen;

pub use daemon::{run, Daemon, RunError};

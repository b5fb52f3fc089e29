//! pglease-pool: everything that touches a postgres process or SQL — supervision of the
//! embedded server, template builds, and the pool of ready clones handed out as leases.
//!
//! It has no HTTP types. The pool's state is owned by one private actor task (`actor.rs`,
//! rules in `state.rs`); callers hold a cloneable [`PoolHandle`] and talk to it through
//! commands. [`start`] brings postgres up and spawns the actor.

mod actor;
mod child_user;
pub mod config;
pub mod error;
mod handle;
pub mod names;
pub mod postgres;
mod progress;
mod scram;
mod servers;
mod session;
pub mod sql_error;
mod state;
mod template;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
mod token;
pub mod types;

pub use actor::start;
pub use config::{
    CloneStrategy, CommandOrigin, CommandSource, DumpSource, EmbeddedConfig, ExternalConfig,
    IntegresqlRole, LeaseAuth, LeaseMaxBytes, PoolConfig, PoolLimits, ServerConfig, Storage,
    TemplateConfig, TemplateSource,
};
pub use error::{
    Blocked, DatabasesDirError, LeaseError, LeaseOpError, StartError, TemplateOpError,
};
pub use handle::PoolHandle;
pub use names::{DbName, InvalidName, LeaseId, TemplateName};
pub use pglease_binaries::{parse_version_number, VersionSpec};
pub use servers::Servers;
pub use token::Token;
// How the pool words a driver error in logs and reports; the benchmark words its own the
// same way.
pub use sql_error::{pg_message, SqlError, SqlErrorKind};
pub use state::{Changer, Registered};
pub use types::{
    BuildProgress, ConnectInfo, DatabasesSpace, DropStatus, ExceededMaxBytes, FilledBy,
    KeptDatabase, Lease, LeaseRequest, LeaseSummary, LimitStatus, PostgresStatus, Readiness,
    Refusals, ServerStatus, StatusReport, StorageStatus, TemplateStatus,
};

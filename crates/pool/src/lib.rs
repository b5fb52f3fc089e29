//! pglease-pool: everything that touches a postgres process or SQL — supervision of the
//! embedded server, template builds, and the pool of ready clones handed out as leases.
//!
//! It has no HTTP types. The pool's state is owned by one private actor task; callers hold
//! a cloneable [`PoolHandle`] and talk to it through commands.

pub mod config;
pub mod error;
pub mod names;
pub mod postgres;

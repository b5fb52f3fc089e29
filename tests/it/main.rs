//! Integration tests: each starts the real `pglease` binary, which starts a real postgres,
//! and talks HTTP and the Postgres protocol to them. One module per feature.

mod bad_input;
mod binaries;
mod budget;
mod cli;
mod clients;
mod commands;
mod config_file;
mod connections;
mod cow;
mod credentials;
mod daemon;
mod drivers;
mod dumps;
mod external;
mod faults;
mod freshness;
mod full_tmpfs;
mod fuzz;
mod helpers;
mod hostile_sources;
mod integresql;
mod kept;
mod leases;
mod majors;
mod metrics;
mod privileges;
mod proof;
mod register;
mod release;
mod security;
mod snapshots;
mod storage_auto;
mod support;
mod systemd;
mod templates;

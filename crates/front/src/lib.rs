//! pglease-front: the PostgreSQL-protocol front, where connecting to database `<template>`
//! leases a fresh clone of that template. This first part is its codec (`codec.rs`): the
//! messages the front parses and writes as a server.

pub mod codec;
#[cfg(test)]
mod proptest_config;

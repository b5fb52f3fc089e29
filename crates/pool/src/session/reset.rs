//! The proof of a reset (issue 44): when a released clone's holder wrote only rows into
//! tables that are empty in its template, truncating those tables puts the clone back, and
//! this file says when the result is proven equal to the template. It owns the design, the
//! per-template facts the proof compares with (as SQL), and the pure step that reads a
//! clone's changed files into a plan (truncate these tables, compare those catalogs) or a
//! refusal. It is not wired into a release yet: the actor, the flag and the counters are
//! step 3 of the issue, and `bench/ab/reset.py` measured that the reset costs about what a
//! drop and a clone cost for the bench fixture's 12 MB template, and 5 to 9 times less for
//! a 241 MB one (figures in `docs/reuse-unchanged.md`, "A proven reset of a written
//! database").
//!
//! # What is proven, and how
//!
//! The reset runs after the recycle has ended every session of the holder (no temp object,
//! advisory lock or session is left; a prepared transaction refuses, as in `proof.rs`), and
//! the shared catalogs' rows are the stamp's (`proof.rs`'s check, unchanged). Then:
//!
//! 1. `CHECKPOINT`, so that every change of a permanent relation is in its file (as for the
//!    proof of an unchanged clone; a clone with unlogged relations refuses, as their
//!    buffers are not written out by a checkpoint).
//! 2. The clone's changed files — the stamp's listing against a new one, or the names the
//!    watch recorded — are read by [`plan`] through the stamp's map of relfilenodes: each
//!    file belongs to one relation, and that relation to its *owner* (an index, a TOAST
//!    table or its index, an owned sequence belong to their table). A changed file must be
//!    (a) of a table that was empty in the template (no page in its heap or TOAST), which
//!    goes on the list to truncate, or (b) of a non-shared catalog (its heap, index or
//!    TOAST), whose rows are compared in step 4. Any other file — a relation that was not
//!    empty in the template, a file no relation of the stamp had (DDL made it, or the
//!    holder truncated or rewrote a relation), a name that is not a relation file — refuses.
//!    So every relation that was non-empty in the template still has its template's files,
//!    untouched: its contents are the template's.
//! 3. On a connection to the clone, step 4's comparison first (all but `pg_statistic`):
//!    the truncate runs as a superuser, and a holder's `BEFORE TRUNCATE` trigger on a
//!    written table would run with it; its `pg_trigger` row refuses before that. Then
//!    `TRUNCATE <the listed tables> RESTART IDENTITY`, which
//!    gives each its new, empty files and puts its owned sequences back to their start; then
//!    each listed table (and its TOAST table) must have zero bytes. Their rows in
//!    `pg_statistic` are deleted: autovacuum analyzes a table a test filled, a truncate
//!    leaves the statistics, and the template has none of an empty table's.
//! 4. The catalogs equal the template's: for every catalog a changed file belonged to, and
//!    for `pg_class` (which the truncate itself rewrites), a fingerprint (md5 over its rows
//!    as text, sorted) equals the one computed once for the template. `pg_class` is
//!    fingerprinted without the columns a truncate or the statistics change
//!    ([`PG_CLASS_VOLATILE`]); every other catalog with all its columns. This covers DDL,
//!    defaults, constraints, indexes, triggers, functions, types, comments, grants (ACLs
//!    are catalog columns), large objects (`pg_largeobject`, `pg_largeobject_metadata`),
//!    statistics (`pg_statistic`: an `ANALYZE` of a written table refuses) and sequences'
//!    definitions (`pg_sequence`). Catalogs whose files did not change are the template's
//!    by step 2.
//! 5. Every sequence's state (`last_value`, `is_called`) equals the template's: an
//!    `ALTER SEQUENCE … INCREMENT` shows in step 4, a `nextval` of a sequence not owned by a
//!    listed table already refused in step 2 (its file changed).
//! 6. `CHECKPOINT` and a new stamp (the truncated tables have new relfilenodes: the map is
//!    read again), so that the next release's proof starts from the reset clone.
//!
//! Anything unsure refuses, and a refused clone is dropped and cloned again as today.
//!
//! # What it does not cover, found by measuring
//!
//! - A row inserted into an empty table with a foreign key to a filled one locks the
//!   referenced row (`FOR KEY SHARE`), which writes that row's page: step 2 refuses. In the
//!   bench fixture every table references another, so only tables without such keys reset.
//! - The benchmark inserts into `orders`, which the fixture fills: never reset.
//! - The watch (`watch.rs`) keeps a directory's first change, not the names of the changed
//!   files, so step 2 needs a listing of the clone's files (as when no watch could be
//!   added) until the watch records names.

#[cfg(test)]
mod pg_tests;
#[cfg(test)]
mod tests;
mod truncate;

pub(crate) use truncate::{owners, truncate_and_compare, TemplateProof};

use std::collections::{BTreeSet, HashMap};

/// Columns of `pg_class` a `TRUNCATE`, `VACUUM` or `ANALYZE` changes without changing what
/// the relation is: left out of its fingerprint.
pub(crate) const PG_CLASS_VOLATILE: &[&str] = &[
    "relfilenode",
    "relpages",
    "reltuples",
    "relallvisible",
    "relfrozenxid",
    "relminmxid",
];

/// Every relation with a file in the current database: its OID, its relfilenode, and the
/// relation its file is part of (an index's table, a TOAST table's or TOAST index's table,
/// an owned or identity sequence's table; otherwise itself).
pub(crate) const OWNERS_SQL: &str = "\
SELECT c.oid, pg_relation_filenode(c.oid), coalesce(t.oid, i.indrelid, d.refobjid, c.oid) \
  FROM pg_class c \
  LEFT JOIN pg_index i ON i.indexrelid = c.oid \
  LEFT JOIN pg_class t ON t.reltoastrelid = coalesce(i.indrelid, c.oid) \
  LEFT JOIN pg_depend d ON d.objid = c.oid AND d.classid = 'pg_class'::regclass \
        AND d.refclassid = 'pg_class'::regclass AND d.deptype IN ('a', 'i') AND c.relkind = 'S' \
 WHERE pg_relation_filenode(c.oid) IS NOT NULL";

/// The template's tables a reset may truncate: permanent user tables whose heap and TOAST
/// have no page at all. A table whose rows were deleted keeps its pages and is not one.
pub(crate) const EMPTY_TABLES_SQL: &str = "\
SELECT c.oid FROM pg_class c \
 WHERE c.relkind = 'r' AND c.relpersistence = 'p' AND c.oid >= 16384 \
   AND pg_relation_size(c.oid) = 0 \
   AND (c.reltoastrelid = 0 OR pg_relation_size(c.reltoastrelid) = 0)";

/// The database's own catalogs (not the shared ones, which `proof.rs` compares): OID and
/// name.
pub(crate) const CATALOGS_SQL: &str = "\
SELECT c.oid, c.relname::text FROM pg_class c \
 WHERE c.relnamespace = 'pg_catalog'::regnamespace AND c.relkind = 'r' AND NOT c.relisshared";

/// The fingerprint query of one catalog, given its columns in order: md5 over its rows as
/// text, sorted, with [`PG_CLASS_VOLATILE`] left out of `pg_class`'s and the catalogs' own
/// statistics out of `pg_statistic`'s.
pub(crate) fn fingerprint_sql(catalog: &str, columns: &[String]) -> String {
    let kept: Vec<&str> = columns
        .iter()
        .map(String::as_str)
        .filter(|c| catalog != "pg_class" || !PG_CLASS_VOLATILE.contains(c))
        .collect();
    // Autovacuum analyzes the catalogs a reset rewrote (pg_class) whenever it likes: their
    // statistics steer plans, not what a query returns, and are left out.
    let rows = if catalog == "pg_statistic" {
        " WHERE starelid >= 16384"
    } else {
        ""
    };
    format!(
        "SELECT md5(coalesce(string_agg(x::text, E'\\n' ORDER BY x::text), '')) \
           FROM (SELECT {} FROM pg_catalog.{catalog}{rows}) x",
        kept.join(", ")
    )
}

/// What a template's clones are compared with, read once per template.
#[derive(Debug, Clone, Default)]
pub(crate) struct TemplateFacts {
    /// Tables empty in the template ([`EMPTY_TABLES_SQL`]).
    pub(crate) empty_tables: BTreeSet<u32>,
    /// The database's own catalogs, OID → name ([`CATALOGS_SQL`]).
    pub(crate) catalogs: HashMap<u32, String>,
}

/// What the changed files of a clone ask of its reset.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ResetPlan {
    /// Tables empty in the template that were written: truncated by the reset.
    pub(crate) truncate: BTreeSet<u32>,
    /// Catalogs whose rows must equal the template's (always `pg_class`).
    pub(crate) compare_catalogs: BTreeSet<String>,
}

/// Why a clone's changes cannot be reset: it is dropped and cloned instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refusal {
    /// A file whose name is not a relation's (`<relfilenode>[_fork][.segment]`).
    #[error("file {name} is not a relation's file")]
    NotARelationFile {
        /// The file's name in the clone's directory.
        name: String,
    },
    /// A file no relation of the stamp had: made by DDL, or a relation's new file after
    /// the holder truncated or rewrote it.
    #[error("file {name} belongs to no relation of the stamp")]
    NewFile {
        /// The file's name in the clone's directory.
        name: String,
    },
    /// A file of a relation that was not empty in the template.
    #[error("file {name} belongs to relation {owner}, which is not empty in the template")]
    NotEmptyInTemplate {
        /// The file's name in the clone's directory.
        name: String,
        /// The OID of the relation it is part of.
        owner: u32,
    },
    /// A truncated table still has bytes in its heap or TOAST.
    #[error("a truncated table is not empty")]
    NotEmptyAfterTruncate,
    /// A catalog's rows differ from the template's.
    #[error("catalog {catalog} differs from the template's")]
    CatalogDiffers {
        /// The catalog's name.
        catalog: String,
    },
    /// A sequence's `last_value` or `is_called`, or the set of sequences, differs.
    #[error("a sequence differs from the template's")]
    SequencesDiffer,
}

/// The names of the files that differ between two listings of a clone's directory
/// (`proof.rs`'s stamp): changed, new or gone.
pub(crate) fn changed_files(
    before: &[super::proof::FileStamp],
    after: &[super::proof::FileStamp],
) -> BTreeSet<String> {
    let index = |list: &[super::proof::FileStamp]| -> HashMap<String, super::proof::FileStamp> {
        list.iter().map(|f| (f.0.clone(), f.clone())).collect()
    };
    let (before, after) = (index(before), index(after));
    before
        .keys()
        .chain(after.keys())
        .filter(|name| before.get(*name) != after.get(*name))
        .cloned()
        .collect()
}

/// The relfilenode a relation file's name carries: `16384`, `16384_fsm`, `16384_vm`,
/// `16384_init` and `16384.1` are all 16384's.
pub(crate) fn filenode_of(name: &str) -> Option<u32> {
    let base = name.split_once('.').map_or(name, |(base, _segment)| base);
    let base = ["_fsm", "_vm", "_init"]
        .iter()
        .find_map(|fork| base.strip_suffix(fork))
        .unwrap_or(base);
    // Digits only: `parse` would also take a leading `+`.
    if base.is_empty() || !base.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    base.parse().ok()
}

/// Step 2 of the proof: reads the names of a clone's changed files, through the stamp's
/// map of relfilenode → (relation, owner), into the tables to truncate and the catalogs to
/// compare, or the first reason the reset cannot be proven.
pub(crate) fn plan<'a>(
    changed_files: impl IntoIterator<Item = &'a str>,
    owners: &HashMap<u32, (u32, u32)>,
    template: &TemplateFacts,
) -> Result<ResetPlan, Refusal> {
    let mut plan = ResetPlan::default();
    // The truncate rewrites pg_class's rows whether or not a file of it changed before.
    plan.compare_catalogs.insert("pg_class".to_owned());
    for name in changed_files {
        let filenode = filenode_of(name).ok_or_else(|| Refusal::NotARelationFile {
            name: name.to_owned(),
        })?;
        let &(_relation, owner) = owners.get(&filenode).ok_or_else(|| Refusal::NewFile {
            name: name.to_owned(),
        })?;
        if let Some(catalog) = template.catalogs.get(&owner) {
            plan.compare_catalogs.insert(catalog.clone());
        } else if template.empty_tables.contains(&owner) {
            plan.truncate.insert(owner);
        } else {
            return Err(Refusal::NotEmptyInTemplate {
                name: name.to_owned(),
                owner,
            });
        }
    }
    Ok(plan)
}

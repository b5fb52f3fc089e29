//! The SQL steps of the reset's proof (`reset.rs` states the proof): what a template is
//! compared with, read once ([`TemplateFacts::read`], on a connection to the template),
//! and the truncate with its checks ([`truncate_and_compare`], on a connection to the
//! clone, after the holder's sessions ended and a checkpoint). It does not end sessions,
//! list files or decide between a reset and a clone: the recycle, `plan` and the actor do.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use tokio_postgres::Client;

use super::{fingerprint_sql, Refusal, ResetPlan, CATALOGS_SQL, EMPTY_TABLES_SQL, OWNERS_SQL};

/// Why a reset did not happen: the proof refused, or postgres failed (unsure: the clone
/// is dropped all the same).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ResetError {
    /// The proof could not show the clone equal to its template.
    #[error("not proven: {0}")]
    Refused(#[from] Refusal),
    /// A query of the reset failed.
    #[error("{what} failed")]
    Postgres {
        /// Which step.
        what: &'static str,
        /// Postgres' error.
        #[source]
        source: tokio_postgres::Error,
    },
}

/// A step's postgres error, named.
fn failed(what: &'static str) -> impl FnOnce(tokio_postgres::Error) -> ResetError {
    move |source| ResetError::Postgres { what, source }
}

/// relfilenode → (relation, the relation its file is part of), as [`OWNERS_SQL`] reads it.
pub(crate) type Owners = HashMap<u32, (u32, u32)>;

/// Reads the current database's map of relfilenodes ([`OWNERS_SQL`]).
pub(crate) async fn owners(client: &Client) -> Result<Owners, ResetError> {
    let rows = client
        .query(OWNERS_SQL, &[])
        .await
        .map_err(failed("reading the relfilenodes"))?;
    Ok(rows
        .iter()
        .map(|row| {
            let oid: u32 = row.get(0);
            let filenode: u32 = row.get(1);
            let owner: u32 = row.get(2);
            (filenode, (oid, owner))
        })
        .collect())
}

/// Every sequence's `(last_value, is_called)`, by the sequence's OID.
async fn sequence_state(client: &Client) -> Result<BTreeMap<u32, (i64, bool)>, ResetError> {
    let rows = client
        .query(
            "SELECT oid, format('%I.%I', relnamespace::regnamespace::text, relname) \
               FROM pg_class WHERE relkind = 'S'",
            &[],
        )
        .await
        .map_err(failed("listing the sequences"))?;
    let mut state = BTreeMap::new();
    for row in rows {
        let oid: u32 = row.get(0);
        let name: String = row.get(1);
        // The name comes from the catalog and is quoted by format's %I.
        let row = client
            .query_one(&format!("SELECT last_value, is_called FROM {name}"), &[])
            .await
            .map_err(failed("reading a sequence"))?;
        state.insert(oid, (row.get(0), row.get(1)));
    }
    Ok(state)
}

/// The fingerprint query of each of the database's own catalogs, by name.
async fn fingerprint_queries(
    client: &Client,
) -> Result<(HashMap<u32, String>, BTreeMap<String, String>), ResetError> {
    let catalogs: HashMap<u32, String> = client
        .query(CATALOGS_SQL, &[])
        .await
        .map_err(failed("listing the catalogs"))?
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    let mut queries = BTreeMap::new();
    for name in catalogs.values() {
        let columns: Vec<String> = client
            .query(
                "SELECT attname::text FROM pg_attribute \
                  WHERE attrelid = ('pg_catalog.' || $1)::regclass AND attnum > 0 \
                    AND NOT attisdropped ORDER BY attnum",
                &[name],
            )
            .await
            .map_err(failed("reading a catalog's columns"))?
            .iter()
            .map(|row| row.get(0))
            .collect();
        // `oid` is an ordinary column of the catalogs that have one (postgres 12 and later).
        queries.insert(name.clone(), fingerprint_sql(name, &columns));
    }
    Ok((catalogs, queries))
}

/// What a template's clones are compared with: [`super::TemplateFacts`] plus each
/// catalog's fingerprint and the sequences' state, read once on a connection to the
/// template (a clone made with `FILE_COPY` has the same catalog rows, OIDs included).
#[derive(Debug, Clone, Default)]
pub(crate) struct TemplateProof {
    /// What [`super::plan`] needs.
    pub(crate) facts: super::TemplateFacts,
    /// Each catalog's fingerprint query and the template's answer, by catalog name.
    pub(crate) fingerprints: BTreeMap<String, (String, String)>,
    /// Every sequence's state in the template.
    pub(crate) sequences: BTreeMap<u32, (i64, bool)>,
}

impl TemplateProof {
    /// Reads it all from the template.
    pub(crate) async fn read(client: &Client) -> Result<TemplateProof, ResetError> {
        let empty_tables: BTreeSet<u32> = client
            .query(EMPTY_TABLES_SQL, &[])
            .await
            .map_err(failed("listing the empty tables"))?
            .iter()
            .map(|row| row.get(0))
            .collect();
        let (catalogs, queries) = fingerprint_queries(client).await?;
        let mut fingerprints = BTreeMap::new();
        for (name, sql) in queries {
            let print: String = client
                .query_one(&sql, &[])
                .await
                .map_err(failed("fingerprinting a catalog"))?
                .get(0);
            fingerprints.insert(name, (sql, print));
        }
        Ok(TemplateProof {
            facts: super::TemplateFacts {
                empty_tables,
                catalogs,
            },
            fingerprints,
            sequences: sequence_state(client).await?,
        })
    }
}

/// Steps 3 to 5 of the proof on a connection to the clone (as a superuser: the statistics
/// are deleted): truncates `plan.truncate`, checks they are empty, and compares the
/// catalogs `plan` names and every sequence with the template's. Returns the clone's new
/// map of relfilenodes for its next stamp.
pub(crate) async fn truncate_and_compare(
    client: &Client,
    plan: &ResetPlan,
    template: &TemplateProof,
) -> Result<Owners, ResetError> {
    // The catalogs first, before anything runs as this superuser: a holder's trigger on a
    // written table (a TRUNCATE trigger would run in the truncate, as the reset's role)
    // shows in `pg_trigger` and refuses here. Only the statistics wait for the truncate,
    // which deletes a written table's, and `pg_class` is compared again after it.
    let (before, after): (Vec<&String>, Vec<&String>) = plan
        .compare_catalogs
        .iter()
        .partition(|catalog| catalog.as_str() != "pg_statistic");
    compare_catalogs(client, before, template).await?;
    let tables: Vec<u32> = plan.truncate.iter().copied().collect();
    if !tables.is_empty() {
        // NULL when none of the tables is there any more: nothing to truncate is unsure.
        let names: Option<String> = client
            .query_one(
                "SELECT string_agg(oid::regclass::text, ', ') FROM pg_class WHERE oid = ANY($1)",
                &[&tables],
            )
            .await
            .map_err(failed("naming the written tables"))?
            .try_get(0)
            .map_err(failed("naming the written tables"))?;
        let Some(names) = names else {
            return Err(Refusal::NotEmptyAfterTruncate.into());
        };
        // regclass output is quoted as needed. CASCADE is not asked for: a table that a
        // filled one references cannot be truncated alone, and the error refuses.
        client
            .batch_execute(&format!("TRUNCATE {names} RESTART IDENTITY"))
            .await
            .map_err(failed("the truncate"))?;
        let empty: Option<bool> = client
            .query_one(
                "SELECT bool_and(pg_relation_size(oid) = 0 AND (reltoastrelid = 0 \
                    OR pg_relation_size(reltoastrelid) = 0)) FROM pg_class WHERE oid = ANY($1)",
                &[&tables],
            )
            .await
            .map_err(failed("measuring the truncated tables"))?
            .try_get(0)
            .map_err(failed("measuring the truncated tables"))?;
        if empty != Some(true) {
            return Err(Refusal::NotEmptyAfterTruncate.into());
        }
        // Autovacuum analyzes a table a test filled and the truncate leaves its
        // statistics; the template has none of an empty table's.
        client
            .execute(
                "DELETE FROM pg_statistic WHERE starelid = ANY($1)",
                &[&tables],
            )
            .await
            .map_err(failed("deleting the statistics"))?;
    }
    compare_catalogs(
        client,
        after
            .into_iter()
            .chain(plan.compare_catalogs.get("pg_class")),
        template,
    )
    .await?;
    if sequence_state(client).await? != template.sequences {
        return Err(Refusal::SequencesDiffer.into());
    }
    owners(client).await
}

/// Refuses unless each of `catalogs` has the template's fingerprint.
async fn compare_catalogs<'a>(
    client: &Client,
    catalogs: impl IntoIterator<Item = &'a String>,
    template: &TemplateProof,
) -> Result<(), ResetError> {
    for catalog in catalogs {
        let differs = || Refusal::CatalogDiffers {
            catalog: catalog.clone(),
        };
        let Some((sql, expected)) = template.fingerprints.get(catalog) else {
            return Err(differs().into());
        };
        let print: String = client
            .query_one(sql, &[])
            .await
            .map_err(failed("fingerprinting a catalog"))?
            .get(0);
        if &print != expected {
            return Err(differs().into());
        }
    }
    Ok(())
}

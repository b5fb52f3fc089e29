//! The sweep of what earlier runs left on the server (at start, and before a snapshot):
//! which databases and lease roles of ours go, which complete templates stay (configured
//! ones of the current versions, client-built ones by `client_template_marker`), which
//! ready clones a clean stop marked are adopted (`ready_marker`, written by `mark_ready`).
//! It only drops what carries our marker or belongs to our roles; nothing else is touched.
//! Which versions are current, and the relation cache init file of a kept template, are
//! the caller's business (`actor/start.rs`): the session knows no template sources.

use std::collections::HashSet;

use super::{Session, OWNER_ROLE};
use crate::names::{
    quote_ident, quote_literal, DbName, TemplateName, INTEGRESQL_PREFIX, MARKER, PREFIX,
};
use crate::sql_error::{pg_message, SqlError};

/// What a sweep keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sweep {
    /// At start: complete current templates, complete client-built templates, ready clones
    /// marked at a clean stop.
    Start,
    /// Before a snapshot: complete current templates only.
    Snapshot,
}

impl Session {
    /// Drops every database with our prefix and marker except complete templates of the
    /// current configuration, then our lease roles; nothing without the marker is touched.
    /// A template is marked by its comment; a clone by its owner, a role with our prefix
    /// that is a member of the owner role (or carries our comment), created before the
    /// database, so a daemon killed at any point leaves nothing unrecognisable. Failures to
    /// drop one leftover are logged and the sweep goes on.
    ///
    /// [`Sweep::Snapshot`] keeps only the configured templates: client-built templates and
    /// every clone go too.
    /// `current` is the fingerprint of every configured template, by name.
    pub(crate) async fn sweep(
        &mut self,
        current: Vec<(TemplateName, String)>,
        mode: Sweep,
    ) -> Result<(), SqlError> {
        let mut kept = Kept {
            databases: current
                .iter()
                .map(|(name, fingerprint)| DbName::template(name, fingerprint).as_str().to_owned())
                .collect(),
            current,
            adopted: HashSet::new(),
        };
        let leftovers = self.leftover_databases().await?;
        if mode == Sweep::Start {
            self.keep_client_templates(&leftovers, &mut kept).await;
        }
        for leftover in leftovers {
            if leftover.complete && kept.databases.contains(&leftover.name) {
                continue;
            }
            if mode == Sweep::Start && self.adopt_ready_clone(&leftover, &mut kept).await {
                continue;
            }
            self.drop_leftover_database(&leftover, mode).await;
        }
        let client = self.client().await?;
        self.others_integresql_names = others_integresql_names(&client, &kept).await?;
        // Lease roles of earlier runs; their databases are gone by now.
        drop_leftover_roles(&client, mode, &kept.adopted).await
    }

    /// The databases of ours an earlier run (or this one, before a snapshot) left: those
    /// with our prefix, or IntegreSQL's, that carry our marker or belong to one of our
    /// roles.
    async fn leftover_databases(&self) -> Result<Vec<Leftover>, SqlError> {
        let client = self.client().await?;
        // Client-built templates' databases and roles on our own server carry IntegreSQL's
        // names; the marker and the owner role tell ours from anyone else's here too.
        let rows = client
            .query(
                "SELECT datname, datistemplate AND NOT datallowconn, \
                        coalesce(shobj_description(oid, 'pg_database'), '') FROM pg_database \
                 WHERE (datname LIKE $1 OR datname LIKE $4) AND (shobj_description(oid, 'pg_database') LIKE $2 \
                   OR datdba IN (SELECT r.oid FROM pg_roles r WHERE (r.rolname LIKE $1 OR r.rolname LIKE $4) AND r.rolname <> $3 \
                                 AND (shobj_description(r.oid, 'pg_authid') LIKE $2 \
                                      OR r.oid IN (SELECT m.member FROM pg_auth_members m \
                                                   JOIN pg_roles o ON o.oid = m.roleid WHERE o.rolname = $3))))",
                &[&our_pattern(), &format!("{MARKER}%"), &OWNER_ROLE, &integresql_pattern()],
            )
            .await
            .map_err(|e| SqlError::from_pg(&e))?;
        Ok(rows
            .iter()
            .map(|row| Leftover {
                name: row.get(0),
                complete: row.get(1),
                comment: row.get(2),
            })
            .collect())
    }

    /// Keeps the complete client-built templates among `leftovers` (at start only); their
    /// names count as current versions (a client template's fingerprint is its name), so
    /// their ready clones are adopted.
    async fn keep_client_templates(&mut self, leftovers: &[Leftover], kept: &mut Kept) {
        for leftover in leftovers {
            let Some(template) =
                parse_client_template_marker(&leftover.comment).filter(|_| leftover.complete)
            else {
                continue;
            };
            let name = &leftover.name;
            let db = DbName::from_server(name.clone());
            let size = match self.database_size(&db).await {
                Ok(size) => size,
                Err(error) => {
                    // Not kept, then: it is dropped below like any leftover.
                    tracing::warn!(database = %name, %error, "could not size a kept client-built template");
                    continue;
                }
            };
            tracing::info!(database = %name, template = %template, "keeping a client-built template of an earlier run");
            kept.current.push((template.clone(), template.to_string()));
            self.client_templates.push((template, db, size));
            kept.databases.insert(name.clone());
        }
    }

    /// Adopts `leftover` if it is a ready clone a clean shutdown left (at start only), of
    /// a template version still current whose template database is kept; says whether it
    /// did.
    async fn adopt_ready_clone(&mut self, leftover: &Leftover, kept: &mut Kept) -> bool {
        let Some((template, fingerprint)) = parse_ready_marker(&leftover.comment) else {
            return false;
        };
        let current_version = kept
            .current
            .iter()
            .any(|(n, f)| *n == template && *f == fingerprint);
        let template_db_kept = kept
            .databases
            .contains(DbName::template(&template, &fingerprint).as_str())
            || self.client_templates.iter().any(|(t, _, _)| *t == template);
        if !(current_version && template_db_kept) {
            return false;
        }
        let name = &leftover.name;
        tracing::info!(database = %name, template = %template, "adopting a ready clone of an earlier run");
        self.admit_shared_role(&template, name).await;
        self.adoptable
            .push((template, fingerprint, DbName::from_server(name.clone())));
        kept.adopted.insert(name.clone());
        true
    }

    /// Drops a leftover database, saying why; a failure is logged.
    async fn drop_leftover_database(&self, leftover: &Leftover, mode: Sweep) {
        let name = &leftover.name;
        match leftover
            .comment
            .strip_prefix(&format!("{MARKER}; template "))
        {
            // A template built from other sources than the current ones (a snapshot's,
            // a kept data directory's, an external server's): never used.
            Some(template) if leftover.complete => tracing::info!(
                database = %name,
                template,
                "dropping a template database built from other sources than the \
                 template's current ones (or of a template no longer configured)"
            ),
            _ if mode == Sweep::Snapshot => {
                tracing::debug!(database = %name, "dropping before the snapshot");
            }
            _ => tracing::info!(database = %name, "dropping a database left by an earlier run"),
        }
        if let Err(message) = self.drop_database(&DbName::from_server(name.clone())).await {
            tracing::warn!(database = %name, error = %message, "could not drop a leftover database");
        }
    }
}

/// A database of ours the sweep found.
struct Leftover {
    name: String,
    /// A template database that was finished (`datistemplate AND NOT datallowconn`).
    complete: bool,
    /// Its comment (our marker, if it carries one).
    comment: String,
}

/// What a sweep keeps, as it learns it.
struct Kept {
    /// The template databases kept, by name.
    databases: HashSet<String>,
    /// Every current template version: the configured ones, and each kept client-built
    /// template (whose fingerprint is its name).
    current: Vec<(TemplateName, String)>,
    /// The ready clones adopted, by name (their roles stay).
    adopted: HashSet<String>,
}

/// What is left under IntegreSQL's names after the sweep is not ours: a real IntegreSQL's
/// databases, on an external server. New client-built databases take other names than
/// these.
async fn others_integresql_names(
    client: &tokio_postgres::Client,
    kept: &Kept,
) -> Result<Vec<DbName>, SqlError> {
    let others = client
        .query(
            "SELECT datname FROM pg_database WHERE datname LIKE $1",
            &[&integresql_pattern()],
        )
        .await
        .map_err(|e| SqlError::from_pg(&e))?;
    Ok(others
        .iter()
        .map(|row| DbName::from_server(row.get(0)))
        .filter(|name| {
            !kept.databases.contains(name.as_str()) && !kept.adopted.contains(name.as_str())
        })
        .collect())
}

/// Drops the lease roles earlier runs left, save the adopted clones'; a failure to drop one
/// is logged.
async fn drop_leftover_roles(
    client: &tokio_postgres::Client,
    mode: Sweep,
    adopted: &HashSet<String>,
) -> Result<(), SqlError> {
    let roles = client
        .query(
            "SELECT rolname FROM pg_roles r WHERE (rolname LIKE $1 OR rolname LIKE $4) AND rolname <> $2 \
             AND (shobj_description(oid, 'pg_authid') LIKE $3 \
                  OR oid IN (SELECT m.member FROM pg_auth_members m \
                             JOIN pg_roles o ON o.oid = m.roleid WHERE o.rolname = $2))",
            &[&our_pattern(), &OWNER_ROLE, &format!("{MARKER}%"), &integresql_pattern()],
        )
        .await
        .map_err(|e| SqlError::from_pg(&e))?;
    for row in roles {
        let name: String = row.get(0);
        if adopted.contains(&name) {
            continue;
        }
        if mode == Sweep::Start {
            tracing::info!(role = %name, "dropping a role left by an earlier run");
        }
        let dropped = client
            .batch_execute(&format!("DROP ROLE IF EXISTS {}", quote_ident(&name)))
            .await;
        if let Err(error) = dropped {
            tracing::warn!(role = %name, error = %pg_message(&error), "could not drop a leftover role");
        }
    }
    Ok(())
}

/// A LIKE pattern for names with our prefix.
fn our_pattern() -> String {
    format!("{}%", PREFIX.replace('_', "\\_"))
}

/// A LIKE pattern for names with IntegreSQL's prefix.
fn integresql_pattern() -> String {
    format!("{}%", INTEGRESQL_PREFIX.replace('_', "\\_"))
}

impl Session {
    /// Makes the IntegreSQL clients' role a member of an adopted clone's role again when
    /// the clone is of a client-built template, as `clone_database` does for a new one
    /// (the start took back every membership an earlier run left). A failure is logged:
    /// the clone is still a test database, which the shared role then cannot reach.
    async fn admit_shared_role(&self, template: &TemplateName, clone: &str) {
        let Some(shared) = self.integresql_role() else {
            return;
        };
        if !self.client_templates.iter().any(|(t, _, _)| t == template) {
            return;
        }
        let granted = self
            .execute(&format!(
                "GRANT {} TO {}",
                quote_ident(clone),
                quote_ident(shared)
            ))
            .await;
        if let Err(error) = granted {
            tracing::warn!(database = %clone, %error, "could not let the IntegreSQL clients' role into an adopted test database");
        }
    }
}

/// The comment a clean shutdown leaves on a ready clone of a server that outlives us.
pub fn ready_marker(template: &TemplateName, fingerprint: &str) -> String {
    format!("{MARKER}; ready; template={template}; fingerprint={fingerprint}")
}

/// Template and fingerprint of a [`ready_marker`] comment.
fn parse_ready_marker(comment: &str) -> Option<(TemplateName, String)> {
    let rest = comment
        .strip_prefix(MARKER)?
        .strip_prefix("; ready; template=")?;
    let (template, fingerprint) = rest.split_once("; fingerprint=")?;
    // Our SHA-256 fingerprints, or a client-built template's own hash (its fingerprint
    // is its name, whatever digest the client uses).
    let fingerprint_ok = fingerprint == template
        || (fingerprint.len() == 64 && fingerprint.bytes().all(|b| b.is_ascii_hexdigit()));
    Some((TemplateName::new(template).ok()?, fingerprint.to_owned())).filter(|_| fingerprint_ok)
}

/// The comment on a client-built template's database (`template/client.rs` writes it when
/// it opens one); the sweep at start keeps complete ones (see
/// [`parse_client_template_marker`]).
pub(crate) fn client_template_marker(name: &TemplateName) -> String {
    format!("{MARKER}; client template {name}")
}

/// The template name in a [`client_template_marker`].
fn parse_client_template_marker(comment: &str) -> Option<TemplateName> {
    let name = comment.strip_prefix(&format!("{MARKER}; client template "))?;
    TemplateName::new(name).ok()
}

/// Marks a ready clone for the next run to adopt.
pub(crate) async fn mark_ready(
    session: &Session,
    template: &TemplateName,
    fingerprint: &str,
    clone: &DbName,
) -> Result<(), SqlError> {
    session
        .execute(&format!(
            "COMMENT ON DATABASE {} IS {}",
            clone.quoted(),
            quote_literal(&ready_marker(template, fingerprint))
        ))
        .await?;
    Ok(())
}

#[cfg(test)]
mod marker_tests {
    use super::*;

    #[test]
    fn ready_markers_round_trip_for_configured_and_client_built_templates() {
        let configured = TemplateName::new("app").expect("name");
        let fingerprint = "ab".repeat(32);
        let marker = ready_marker(&configured, &fingerprint);
        assert_eq!(
            parse_ready_marker(&marker),
            Some((configured.clone(), fingerprint))
        );
        // A client's md5-sized hash is its own fingerprint.
        let client = TemplateName::new("0123456789abcdef0123456789abcdef").expect("name");
        let marker = ready_marker(&client, client.as_str());
        assert_eq!(
            parse_ready_marker(&marker),
            Some((client.clone(), client.to_string()))
        );
        assert_eq!(
            parse_ready_marker(&ready_marker(&configured, "short")),
            None
        );
        assert_eq!(parse_ready_marker("someone else's comment"), None);
    }

    #[test]
    fn client_template_markers_round_trip() {
        let name = TemplateName::new("0123456789abcdef0123456789abcdef").expect("name");
        assert_eq!(
            parse_client_template_marker(&client_template_marker(&name)),
            Some(name)
        );
        assert_eq!(parse_client_template_marker(MARKER), None);
        assert_eq!(
            parse_client_template_marker(&format!("{MARKER}; client template ../x")),
            None
        );
    }
}

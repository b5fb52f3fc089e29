//! A template's database-level settings (`ALTER DATABASE … SET`), which `CREATE DATABASE`
//! does not copy, re-applied to each of its clones exactly as postgres stores them. It does
//! not touch role-level settings, which belong to roles, not databases.
//!
//! `pg_db_role_setting.setconfig` holds `name=value`, where value is the text postgres
//! flattened from the SET's arguments. Re-applied as one string literal that text comes
//! back unchanged for every setting except those whose elements postgres quotes as
//! identifiers (GUC_LIST_QUOTE, [`LIST_QUOTE`]): their stored text is a list of elements,
//! and one literal would become one element (`app, public` → `"app, public"`). Those are
//! split here into their elements, each given as a literal, which postgres quotes again
//! the same way. Asking postgres instead (`set_config` then `SET … FROM CURRENT`) would
//! run each setting's checks in the admin session's database and role, which fail for
//! legitimate values (a text search configuration that exists only in the template) and
//! would switch the admin session's role for `role`.
//!
//! The first clone of each template version reads its settings back and compares them
//! with the template's, so a setting re-applied differently (an extension's list setting
//! postgres quotes, loaded in the admin session) is a clear error, not a silent change.

use std::sync::Arc;

use super::Session;
use crate::names::{quote_ident, quote_literal, DbName};
use crate::sql_error::SqlError;

/// The settings postgres itself declares GUC_LIST_QUOTE (guc_tables.c); none of them
/// changes flags between versions.
const LIST_QUOTE: &[&str] = &[
    "search_path",
    "temp_tablespaces",
    "session_preload_libraries",
    "local_preload_libraries",
    "shared_preload_libraries",
    "unix_socket_directories",
];

/// The `SET name TO value` clauses that reproduce one template version's settings.
pub(super) type Clauses = Arc<Vec<String>>;

/// A template version's settings, ready to append to a clone's statements.
pub(super) struct TemplateSettings {
    clauses: Clauses,
    /// The template's stored entries, while no clone has shown that the clauses give
    /// them back.
    unverified: Option<Vec<String>>,
}

impl Session {
    /// The settings of `template_db`: cached after the first verified clone (a version
    /// never changes after its build), else read from the server.
    pub(super) async fn template_settings(
        &self,
        client: &tokio_postgres::Client,
        template_db: &DbName,
    ) -> Result<TemplateSettings, SqlError> {
        let cached = self
            .template_settings
            .lock()
            .ok()
            .and_then(|cache| cache.get(template_db).cloned());
        if let Some(clauses) = cached {
            return Ok(TemplateSettings {
                clauses,
                unverified: None,
            });
        }
        let entries = stored_settings(client, template_db).await?;
        Ok(TemplateSettings {
            clauses: Arc::new(entries.iter().map(|entry| clause(entry)).collect()),
            unverified: Some(entries),
        })
    }
}

impl TemplateSettings {
    /// `ALTER DATABASE clone SET …;` for each setting.
    pub(super) fn sql_for(&self, clone: &DbName) -> String {
        self.clauses
            .iter()
            .map(|clause| format!(" ALTER DATABASE {} {clause};", clone.quoted()))
            .collect()
    }

    /// After the first clone of a version: checks that it got exactly the template's
    /// entries, then caches the clauses for later clones.
    pub(super) async fn verify(
        self,
        session: &Session,
        client: &tokio_postgres::Client,
        template_db: &DbName,
        clone: &DbName,
    ) -> Result<(), SqlError> {
        let Some(expected) = self.unverified else {
            return Ok(());
        };
        let got = stored_settings(client, clone).await?;
        if got != expected {
            return Err(SqlError::other(format!(
                "the database-level settings of {template_db} cannot be re-applied exactly: \
                 the template has {expected:?}, its clone got {got:?}"
            )));
        }
        if let Ok(mut cache) = session.template_settings.lock() {
            cache.insert(template_db.clone(), self.clauses);
        }
        Ok(())
    }
}

/// The database-wide entries (`name=value`) stored for `db`, in postgres' order.
async fn stored_settings(
    client: &tokio_postgres::Client,
    db: &DbName,
) -> Result<Vec<String>, SqlError> {
    let row = client
        .query_opt(
            "SELECT s.setconfig FROM pg_db_role_setting s \
             JOIN pg_database d ON d.oid = s.setdatabase WHERE d.datname = $1 AND s.setrole = 0",
            &[&db.as_str()],
        )
        .await
        .map_err(|e| SqlError::from_pg(&e))?;
    Ok(row
        .and_then(|row| row.get::<_, Option<Vec<String>>>(0))
        .unwrap_or_default())
}

/// `SET name TO value` for one stored entry. A name cannot contain '=', so the first one
/// ends it.
fn clause(entry: &str) -> String {
    let (name, value) = entry.split_once('=').unwrap_or((entry, ""));
    let elements = LIST_QUOTE
        .iter()
        .any(|list| list.eq_ignore_ascii_case(name))
        .then(|| split_quoted_list(value))
        .flatten();
    let value = match elements {
        Some(elements) => elements
            .iter()
            .map(|element| quote_literal(element))
            .collect::<Vec<_>>()
            .join(", "),
        // Anything else is stored as given; an unparsable list is caught by `verify`.
        None => quote_literal(value),
    };
    format!("SET {} TO {value}", quote_ident(name))
}

/// The elements of a list as postgres flattens a GUC_LIST_QUOTE setting: separated by
/// commas, each bare or double-quoted with `""` for a quote inside (`a, "b, c", "d""e"`).
/// `None` for text that is not such a list.
fn split_quoted_list(value: &str) -> Option<Vec<String>> {
    let mut chars = value.chars().peekable();
    let mut elements = Vec::new();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut element = String::new();
        if chars.next_if_eq(&'"').is_some() {
            loop {
                match chars.next()? {
                    '"' if chars.next_if_eq(&'"').is_some() => element.push('"'),
                    '"' => break,
                    c => element.push(c),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| *c != ',' && !c.is_whitespace()) {
                element.push(c);
            }
            if element.is_empty() {
                return None;
            }
        }
        elements.push(element);
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        match chars.next() {
            None => return Some(elements),
            Some(',') => continue,
            Some(_) => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoted_lists_split_into_their_elements() {
        assert_eq!(
            split_quoted_list(r#"app, "My Schema", "it's", "we""ird, one", public"#),
            Some(vec![
                "app".to_owned(),
                "My Schema".to_owned(),
                "it's".to_owned(),
                "we\"ird, one".to_owned(),
                "public".to_owned(),
            ])
        );
        assert_eq!(split_quoted_list(r#""""#), Some(vec![String::new()]));
        assert_eq!(
            split_quoted_list(r#""$user""#),
            Some(vec!["$user".to_owned()])
        );
        for broken in ["", "a,", "a b", r#""open"#, r#""a"b"#] {
            assert_eq!(split_quoted_list(broken), None, "{broken}");
        }
    }

    #[test]
    fn only_list_settings_are_split() {
        assert_eq!(
            clause(r#"search_path=app, "My Schema""#),
            r#"SET "search_path" TO 'app', 'My Schema'"#
        );
        assert_eq!(
            clause("DateStyle=ISO, DMY"),
            r#"SET "DateStyle" TO 'ISO, DMY'"#
        );
        assert_eq!(
            clause("app.greeting=it's = here"),
            r#"SET "app.greeting" TO 'it''s = here'"#
        );
    }
}

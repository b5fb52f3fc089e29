//! The reset's proof against a real embedded postgres: a holder writes rows into tables
//! empty in the template, then changes one more thing a reset must notice; the proof
//! (`plan`, then `truncate_and_compare`) must refuse every such change and prove the
//! plain writes, and every database it proves is compared with the template by a
//! catalog+data query of the test's own. The shared catalogs (database and role settings)
//! are `proof.rs`'s check and not repeated here.

use std::path::PathBuf;
use std::time::Duration;

use tokio_postgres::{Client, NoTls};

use super::{changed_files, owners, plan, truncate_and_compare, TemplateProof};
use crate::config::PoolLimits;
use crate::postgres::{Embedded, RunningPostgres};
use crate::session::proof::list_files;
use crate::EmbeddedConfig;

/// A private embedded server for one test.
struct Server {
    embedded: Embedded,
    running: RunningPostgres,
}

impl Server {
    async fn start() -> Server {
        let mut config = EmbeddedConfig::for_limits(&PoolLimits::default(), 1);
        config.bin_dir = std::env::var_os("PGLEASE_PG_BIN_DIR").map(PathBuf::from);
        config.cache_dir = Some(std::env::temp_dir().join("pglease-session-tests-cache"));
        config.shared_buffers = "16MB".into();
        let mut embedded = Embedded::prepare(&config, &[]).await.unwrap_or_else(|e| {
            panic!("prepare failed: {e} (set PGLEASE_PG_BIN_DIR if postgres was not found)")
        });
        let running = embedded
            .start()
            .await
            .unwrap_or_else(|e| panic!("start failed: {e}"));
        Server { embedded, running }
    }

    /// A superuser connection to `db`.
    async fn connect(&self, db: &str) -> Client {
        let mut config = self.running.admin_config();
        config.dbname(db);
        let (client, connection) = config.connect(NoTls).await.expect("connect");
        tokio::spawn(async move {
            let _ = connection.await;
        });
        client
    }

    async fn stop(self) {
        self.running.shutdown(Duration::from_secs(10)).await;
        self.embedded.cleanup();
    }
}

/// The template: two filled tables (one without a sequence, whose truncate no sequence's
/// state would tell), two empty ones (one with an index and a default, one
/// whose rows go to TOAST, with an identity column) and a sequence no table owns; sealed
/// as a build seals one.
const TEMPLATE_SQL: &str = "\
CREATE TABLE filled (id serial PRIMARY KEY, body text NOT NULL); \
INSERT INTO filled (body) SELECT 'row ' || g FROM generate_series(1, 100) g; \
CREATE TABLE plain (k int PRIMARY KEY); INSERT INTO plain SELECT generate_series(1, 50); \
CREATE TABLE empty_a (id bigserial PRIMARY KEY, body text, n int DEFAULT 1); \
CREATE INDEX ON empty_a (n); \
CREATE TABLE empty_b (id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY, doc text); \
CREATE SEQUENCE free_seq; \
ANALYZE; CHECKPOINT;";

/// What every holder writes: rows in both empty tables, one of them TOASTed.
const WRITES: &str = "\
INSERT INTO empty_a (body) SELECT 'x' || g FROM generate_series(1, 10) g; \
INSERT INTO empty_b (doc) SELECT string_agg(md5(g::text), '') FROM generate_series(1, 500) g;";

/// Changes after the writes, and whether a reset can undo them (`true`: the reset must
/// prove the database; `false`: it must refuse).
const CASES: &[(&str, &str, bool)] = &[
    ("rows only", "", true),
    ("rows deleted again", "DELETE FROM empty_a", true),
    ("statistics of a written table", "ANALYZE empty_a", true),
    (
        "a column",
        "ALTER TABLE empty_a ADD COLUMN extra int",
        false,
    ),
    (
        "a column default",
        "ALTER TABLE empty_a ALTER COLUMN n SET DEFAULT 2",
        false,
    ),
    (
        "a trigger",
        "CREATE FUNCTION f() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NEW; END'; \
         CREATE TRIGGER t BEFORE INSERT ON empty_a FOR EACH ROW EXECUTE FUNCTION f()",
        false,
    ),
    (
        "a sequence's increment",
        "ALTER SEQUENCE empty_a_id_seq INCREMENT 5",
        false,
    ),
    (
        "a sequence no table owns",
        "SELECT nextval('free_seq')",
        false,
    ),
    (
        "a row in a filled table",
        "INSERT INTO filled (body) VALUES ('z')",
        false,
    ),
    (
        "a row updated back",
        "UPDATE filled SET body = body WHERE id = 1",
        false,
    ),
    (
        "a row in a filled table without a sequence",
        "INSERT INTO plain VALUES (1000)",
        false,
    ),
    ("a large object", "SELECT lo_create(0)", false),
    ("a grant", "GRANT SELECT ON empty_a TO PUBLIC", false),
    ("an index only", "CREATE INDEX ON empty_a (body)", false),
    (
        "a constraint",
        "ALTER TABLE empty_a ADD CONSTRAINT positive CHECK (n > 0)",
        false,
    ),
    ("a comment", "COMMENT ON TABLE empty_a IS 'x'", false),
    (
        "a view (no file of its own)",
        "CREATE VIEW v AS SELECT 1 AS one",
        false,
    ),
    ("a schema", "CREATE SCHEMA s", false),
    ("a filled table truncated", "TRUNCATE filled CASCADE", false),
    (
        "a table's storage option",
        "ALTER TABLE empty_a SET (fillfactor = 50)",
        false,
    ),
];

/// The test's own comparison, independent of the proof: every user table's rows, the
/// catalog's relations, columns, defaults, constraints, indexes, triggers, functions,
/// views, comments, schemas, grants, sequences' definitions and states and large objects.
const EQUALITY_SQL: &[&str] = &[
    "SELECT md5(coalesce(string_agg(x::text, ',' ORDER BY x::text), '')) FROM filled x",
    "SELECT md5(coalesce(string_agg(x::text, ',' ORDER BY x::text), '')) FROM plain x",
    "SELECT md5(coalesce(string_agg(x::text, ',' ORDER BY x::text), '')) FROM empty_a x",
    "SELECT md5(coalesce(string_agg(x::text, ',' ORDER BY x::text), '')) FROM empty_b x",
    "SELECT string_agg(format('%s %s %s %s %s', oid, relname, relkind, relacl, reloptions), ';' ORDER BY oid) FROM pg_class",
    "SELECT string_agg(format('%s %s %s %s', attrelid, attname, atttypid, attnotnull), ';' ORDER BY attrelid, attnum) FROM pg_attribute",
    "SELECT string_agg(pg_get_expr(adbin, adrelid), ';' ORDER BY oid) FROM pg_attrdef",
    "SELECT string_agg(pg_get_constraintdef(oid), ';' ORDER BY oid) FROM pg_constraint",
    "SELECT string_agg(pg_get_indexdef(indexrelid), ';' ORDER BY indexrelid) FROM pg_index",
    "SELECT string_agg(tgname, ';' ORDER BY oid) FROM pg_trigger",
    "SELECT count(*)::text FROM pg_proc",
    "SELECT string_agg(definition, ';' ORDER BY viewname) FROM pg_views WHERE schemaname = 'public'",
    "SELECT string_agg(format('%s %s', objoid, description), ';' ORDER BY objoid) FROM pg_description WHERE objoid >= 16384",
    "SELECT string_agg(nspname, ';' ORDER BY oid) FROM pg_namespace",
    "SELECT string_agg(format('%s %s %s %s', seqrelid, seqstart, seqincrement, seqmax), ';' ORDER BY seqrelid) FROM pg_sequence",
    "SELECT string_agg(format('%s %s', sequencename, last_value), ';' ORDER BY sequencename) FROM pg_sequences",
    "SELECT count(*)::text FROM pg_largeobject_metadata",
];

/// [`EQUALITY_SQL`]'s answers in `db`.
async fn contents(server: &Server, db: &str) -> Vec<Option<String>> {
    let client = server.connect(db).await;
    let mut out = Vec::new();
    for sql in EQUALITY_SQL {
        let row = client.query_one(*sql, &[]).await.expect(sql);
        out.push(row.get(0));
    }
    out
}

/// Waits until no session is in `db` (a closed client's backend exits after it).
async fn until_no_session(admin: &Client, db: &str) {
    for _ in 0..2_000 {
        let n: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = $1",
                &[&db],
            )
            .await
            .expect("count sessions")
            .get(0);
        if n == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("sessions in {db} did not end");
}

/// One round: a clone, the holder's writes and `change`, then the proof. `Ok` when the
/// reset proved it, with the clone left for the caller to compare.
async fn round(
    server: &Server,
    admin: &Client,
    template: &TemplateProof,
    clone: &str,
    change: &str,
) -> Result<(), String> {
    // One statement each: DROP and CREATE DATABASE refuse a transaction block.
    for sql in [
        format!("DROP DATABASE IF EXISTS {clone}"),
        format!("CREATE DATABASE {clone} TEMPLATE pglease_reset_tpl STRATEGY FILE_COPY"),
        "CHECKPOINT".to_owned(),
    ] {
        admin.batch_execute(&sql).await.expect(&sql);
    }
    let oid: u32 = admin
        .query_one("SELECT oid FROM pg_database WHERE datname = $1", &[&clone])
        .await
        .expect("oid")
        .get(0);
    let dir = server.running.data_dir.join("base").join(oid.to_string());
    let stamp = list_files(&dir).expect("stamp");
    let stamp_owners = owners(&server.connect(clone).await).await.expect("owners");
    until_no_session(admin, clone).await;

    let holder = server.connect(clone).await;
    holder.batch_execute(WRITES).await.expect("writes");
    if !change.is_empty() {
        holder.batch_execute(change).await.expect(change);
    }
    drop(holder);
    until_no_session(admin, clone).await;

    // The proof, as a release would run it.
    admin.batch_execute("CHECKPOINT").await.expect("checkpoint");
    let after = list_files(&dir).expect("listing");
    let changed = changed_files(&stamp, &after);
    let plan = plan(
        changed.iter().map(String::as_str),
        &stamp_owners,
        &template.facts,
    )
    .map_err(|e| e.to_string())?;
    let client = server.connect(clone).await;
    let outcome = truncate_and_compare(&client, &plan, template).await;
    drop(client);
    until_no_session(admin, clone).await;
    outcome.map(|_| ()).map_err(|e| e.to_string())
}

/// Builds and seals the template `pglease_reset_tpl`; its proof's facts and its contents.
async fn template(server: &Server, admin: &Client) -> (TemplateProof, Vec<Option<String>>) {
    admin
        .batch_execute("CREATE DATABASE pglease_reset_tpl")
        .await
        .expect("template");
    let client = server.connect("pglease_reset_tpl").await;
    client.batch_execute(TEMPLATE_SQL).await.expect("build");
    // VACUUM refuses to run in the implicit transaction of several statements.
    client
        .batch_execute("VACUUM (FREEZE)")
        .await
        .expect("freeze");
    let template = TemplateProof::read(&client).await.expect("template facts");
    drop(client);
    let expected = contents(server, "pglease_reset_tpl").await;
    until_no_session(admin, "pglease_reset_tpl").await;
    (template, expected)
}

/// A holder's `BEFORE TRUNCATE` trigger on a table it wrote would run inside the reset's
/// truncate, as the reset's superuser: the catalogs are compared first, so the reset
/// refuses before the trigger can run.
#[tokio::test]
async fn a_holders_truncate_trigger_is_refused_before_it_can_run() {
    let server = Server::start().await;
    let admin = server.connect("postgres").await;
    let (template, _) = template(&server, &admin).await;
    let clone = "pglease_reset_trigger";
    let change = "CREATE FUNCTION witness() RETURNS trigger LANGUAGE plpgsql AS \
                    $$BEGIN INSERT INTO filled (body) VALUES ('ran as ' || current_user); \
                    RETURN NULL; END$$; \
                  CREATE TRIGGER witness BEFORE TRUNCATE ON empty_a \
                    FOR EACH STATEMENT EXECUTE FUNCTION witness()";
    let outcome = round(&server, &admin, &template, clone, change).await;
    let ran: i64 = server
        .connect(clone)
        .await
        .query_one(
            "SELECT count(*) FROM filled WHERE body LIKE 'ran as %'",
            &[],
        )
        .await
        .expect("the witness rows")
        .get(0);
    drop(admin);
    server.stop().await;
    assert!(outcome.is_err(), "a changed pg_trigger must refuse");
    assert_eq!(
        ran, 0,
        "the holder's trigger ran inside the reset ({outcome:?})"
    );
}

#[tokio::test]
async fn a_reset_is_proven_only_when_it_gives_the_template_back() {
    let server = Server::start().await;
    let admin = server.connect("postgres").await;
    let (template, expected) = template(&server, &admin).await;
    assert!(
        template.facts.empty_tables.len() == 2,
        "the template's empty tables: {:?}",
        template.facts.empty_tables
    );

    let mut wrong = Vec::new();
    // Several rounds per case: autovacuum and the checkpointer run when they like.
    // PGLEASE_RESET_ROUNDS asks for more.
    let rounds: u32 = std::env::var("PGLEASE_RESET_ROUNDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(3);
    for round_no in 0..rounds {
        for (name, change, resettable) in CASES {
            let clone = "pglease_reset_clone";
            let outcome = round(&server, &admin, &template, clone, change).await;
            match (&outcome, resettable) {
                (Ok(()), true) => {}
                (Err(_), false) => {}
                (Ok(()), false) => {
                    wrong.push(format!("round {round_no}, {name}: proven, must refuse"));
                }
                (Err(why), true) => {
                    wrong.push(format!("round {round_no}, {name}: refused ({why})"));
                }
            }
            until_no_session(&admin, clone).await;
            if outcome.is_ok() && contents(&server, clone).await != expected {
                wrong.push(format!(
                    "round {round_no}, {name}: proven but unequal to the template"
                ));
            }
            until_no_session(&admin, clone).await;
        }
    }
    drop(admin);
    server.stop().await;
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

//! The pure step of the reset's proof: which changed files a reset may answer, and why it
//! refuses the others.

use std::collections::{BTreeSet, HashMap};

use super::{filenode_of, fingerprint_sql, plan, Refusal, TemplateFacts};

/// pg_class (OID 1259) with file 1259, its index 2662 on file 2662; a table 16400 empty in
/// the template with its index 16405 and owned sequence 16401; a filled table 16500.
fn fixture() -> (HashMap<u32, (u32, u32)>, TemplateFacts) {
    let owners = HashMap::from([
        (1259, (1259, 1259)),
        (2662, (2662, 1259)),
        (16400, (16400, 16400)),
        (16405, (16405, 16400)),
        (16401, (16401, 16400)),
        (16500, (16500, 16500)),
    ]);
    let template = TemplateFacts {
        empty_tables: BTreeSet::from([16400]),
        catalogs: HashMap::from([(1259, "pg_class".to_owned())]),
    };
    (owners, template)
}

#[test]
fn relation_file_names_carry_their_filenode() {
    assert_eq!(filenode_of("16384"), Some(16384));
    assert_eq!(filenode_of("16384_fsm"), Some(16384));
    assert_eq!(filenode_of("16384_vm"), Some(16384));
    assert_eq!(filenode_of("16384_init"), Some(16384));
    assert_eq!(filenode_of("16384.2"), Some(16384));
    assert_eq!(filenode_of("PG_VERSION"), None);
    assert_eq!(filenode_of("pg_filenode.map"), None);
    assert_eq!(filenode_of("+16384"), None);
    assert_eq!(filenode_of("_fsm"), None);
}

#[test]
fn rows_in_a_table_empty_in_the_template_are_truncated_and_pg_class_compared() {
    let (owners, template) = fixture();
    let plan = plan(
        ["16400", "16400_fsm", "16405", "16401", "2662"],
        &owners,
        &template,
    )
    .expect("a reset");
    assert_eq!(plan.truncate, BTreeSet::from([16400]));
    assert_eq!(
        plan.compare_catalogs,
        BTreeSet::from(["pg_class".to_owned()])
    );
}

#[test]
fn a_written_file_of_a_filled_table_refuses() {
    let (owners, template) = fixture();
    assert_eq!(
        plan(["16400", "16500"], &owners, &template),
        Err(Refusal::NotEmptyInTemplate {
            name: "16500".into(),
            owner: 16500
        })
    );
}

#[test]
fn a_file_no_relation_of_the_stamp_had_refuses() {
    let (owners, template) = fixture();
    assert_eq!(
        plan(["16999"], &owners, &template),
        Err(Refusal::NewFile {
            name: "16999".into()
        })
    );
    assert_eq!(
        plan(["pg_filenode.map"], &owners, &template),
        Err(Refusal::NotARelationFile {
            name: "pg_filenode.map".into()
        })
    );
}

#[test]
fn pg_class_is_fingerprinted_without_what_a_truncate_changes() {
    let columns: Vec<String> = ["oid", "relname", "relfilenode", "relpages", "relacl"]
        .map(String::from)
        .to_vec();
    let sql = fingerprint_sql("pg_class", &columns);
    assert!(
        sql.contains("SELECT oid, relname, relacl FROM pg_catalog.pg_class"),
        "{sql}"
    );
    // Any other catalog keeps every column.
    let sql = fingerprint_sql("pg_attrdef", &columns);
    assert!(sql.contains("relfilenode, relpages"), "{sql}");
}

use std::fs;
use std::path::PathBuf;

use super::*;

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pglease-fp-{tag}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).expect("create temp dir");
    dir
}

#[test]
fn fingerprint_follows_file_names_contents_and_the_major_version() {
    let dir = temp_dir("a");
    fs::write(dir.join("001_init.sql"), "CREATE TABLE a (id int);").expect("write");
    fs::write(dir.join("notes.txt"), "ignored").expect("write");
    let source = TemplateSource::Migrations(dir.clone());
    let first = fingerprint(&source, 15).expect("fingerprint");
    assert_eq!(first.len(), 64);
    assert_eq!(
        first,
        fingerprint(&source, 15).expect("fingerprint"),
        "stable"
    );
    assert_ne!(
        first,
        fingerprint(&source, 16).expect("fingerprint"),
        "major version counts"
    );
    fs::write(dir.join("notes.txt"), "changed").expect("write");
    assert_eq!(
        first,
        fingerprint(&source, 15).expect("fingerprint"),
        "non-sql files do not count"
    );
    fs::write(dir.join("001_init.sql"), "CREATE TABLE a (id bigint);").expect("write");
    let changed = fingerprint(&source, 15).expect("fingerprint");
    assert_ne!(first, changed, "contents count");
    fs::rename(dir.join("001_init.sql"), dir.join("002_init.sql")).expect("rename");
    assert_ne!(
        changed,
        fingerprint(&source, 15).expect("fingerprint"),
        "names count"
    );
    assert_ne!(
        fingerprint(&TemplateSource::Empty, 15).expect("fingerprint"),
        changed
    );
    let _ = fs::remove_dir_all(dir);
}

#[test]
fn migrations_apply_in_lexical_order() {
    let dir = temp_dir("b");
    for name in ["10_c.sql", "02_b.sql", "01_a.sql", "readme.md"] {
        fs::write(dir.join(name), "").expect("write");
    }
    let names: Vec<String> = migration_files(&dir)
        .expect("list")
        .iter()
        .map(|p| p.file_name().expect("name").to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["01_a.sql", "02_b.sql", "10_c.sql"]);
    let _ = fs::remove_dir_all(dir);
}

#[test]
fn a_missing_directory_is_a_clear_error() {
    let error = fingerprint(
        &TemplateSource::Migrations("/nonexistent/migrations".into()),
        15,
    )
    .expect_err("missing")
    .to_string();
    assert!(error.contains("/nonexistent/migrations"), "{error}");
}

#[test]
fn error_lines_count_from_one() {
    let sql = "SELECT 1;\nSELECT 2;\nCREAT TABLE x;";
    let position = sql.find("CREAT").expect("found") + 1;
    assert_eq!(line_of(sql, position), 3);
    assert_eq!(line_of(sql, 1), 1);
}

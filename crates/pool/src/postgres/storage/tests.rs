use super::*;

const MB: u64 = 1024 * 1024;

/// A fresh directory on /dev/shm, PostgreSQL 18, root with mkfs.xfs, nothing known.
fn facts(requested: Storage) -> Facts {
    Facts {
        requested,
        major: 18,
        in_memory: true,
        dir_clones: None,
        kept_store: false,
        kept_clusters: false,
        cannot_make: None,
        largest_template: None,
    }
}

fn big() -> Option<(String, u64)> {
    Some(("app".into(), 2048 * MB))
}

#[test]
fn auto_keeps_tmpfs_for_small_or_unknown_templates() {
    let mut f = facts(Storage::Auto);
    assert_eq!(decide(&f).0, Layout::Copy);
    f.largest_template = Some(("app".into(), AUTO_MIN_TEMPLATE_BYTES - 1));
    let (layout, why) = decide(&f);
    assert_eq!(layout, Layout::Copy);
    assert!(why.contains("the largest, app"), "{why}");
}

#[test]
fn auto_makes_a_store_for_a_big_template_and_may_fall_back() {
    let mut f = facts(Storage::Auto);
    f.largest_template = Some(("app".into(), AUTO_MIN_TEMPLATE_BYTES));
    let (layout, why) = decide(&f);
    assert_eq!(layout, Layout::Store { fallback: true });
    assert!(why.contains("template app"), "{why}");
}

#[test]
fn auto_copies_where_cloning_cannot_happen() {
    // Before 18 there is no file_copy_method.
    let mut f = facts(Storage::Auto);
    f.largest_template = big();
    f.major = 17;
    assert_eq!(decide(&f).0, Layout::Copy);
    // No store can be made: said why.
    let mut f = facts(Storage::Auto);
    f.largest_template = big();
    f.cannot_make = Some("the mount needs root".into());
    let (layout, why) = decide(&f);
    assert_eq!(layout, Layout::Copy);
    assert!(why.contains("needs root"), "{why}");
    // A data directory on disk that cannot clone.
    let mut f = facts(Storage::Auto);
    f.largest_template = big();
    f.in_memory = false;
    f.dir_clones = Some(Err("cp failed".into()));
    assert_eq!(decide(&f).0, Layout::Copy);
    // A kept directory's clusters on tmpfs are not moved into a store.
    let mut f = facts(Storage::Auto);
    f.largest_template = big();
    f.kept_clusters = true;
    assert_eq!(decide(&f).0, Layout::Copy);
}

#[test]
fn a_data_directory_that_clones_is_used_by_auto_and_cow() {
    for requested in [Storage::Auto, Storage::Cow] {
        let mut f = facts(requested);
        f.in_memory = false;
        f.dir_clones = Some(Ok(()));
        assert_eq!(decide(&f).0, Layout::DirClones, "{requested:?}");
    }
    // Not before 18 under auto: nothing would clone.
    let mut f = facts(Storage::Auto);
    f.dir_clones = Some(Ok(()));
    f.major = 16;
    assert_eq!(decide(&f).0, Layout::Copy);
}

#[test]
fn cow_makes_its_store_in_a_tmpfs_data_directory_and_copies_on_a_disk_that_cannot_clone() {
    let mut f = facts(Storage::Cow);
    f.dir_clones = Some(Err("tmpfs".into()));
    assert_eq!(decide(&f).0, Layout::Store { fallback: false });
    f.in_memory = false;
    assert_eq!(decide(&f).0, Layout::Copy);
    // Asked for, it is made whatever the templates, and a failure is the user's to see.
    assert_eq!(
        decide(&facts(Storage::Cow)).0,
        Layout::Store { fallback: false }
    );
}

#[test]
fn tmpfs_copies_and_a_kept_store_is_used_whatever_was_asked() {
    let mut f = facts(Storage::Tmpfs);
    f.largest_template = big();
    assert_eq!(decide(&f).0, Layout::Copy);
    for requested in [Storage::Tmpfs, Storage::Cow, Storage::Auto] {
        let mut f = facts(requested);
        f.kept_store = true;
        assert_eq!(decide(&f).0, Layout::Store { fallback: false });
    }
}

fn template(name: &str, source: crate::config::TemplateSource) -> TemplateConfig {
    TemplateConfig {
        name: crate::names::TemplateName::new(name).expect("valid name"),
        source,
        postgres_version: None,
    }
}

#[test]
fn the_largest_template_is_read_from_sources_and_the_snapshot() {
    use crate::config::{DumpSource, TemplateSource};
    let dir = std::env::temp_dir().join(format!("pglease-storage-{}", std::process::id()));
    let migrations = dir.join("migrations");
    std::fs::create_dir_all(&migrations).expect("mkdir");
    std::fs::write(migrations.join("001.sql"), vec![b' '; 3000]).expect("write");
    std::fs::write(migrations.join("002.sql"), vec![b' '; 2000]).expect("write");
    // Sparse: its length is what counts, as with a real dump.
    let dump = dir.join("prod.dump");
    std::fs::File::create(&dump)
        .and_then(|f| f.set_len(300 * MB))
        .expect("dump");
    let mut templates = vec![
        template("empty", TemplateSource::Empty),
        template("app", TemplateSource::Migrations(migrations)),
    ];
    assert_eq!(
        largest_template(&templates, None),
        Some(("app".into(), 5000))
    );
    templates.push(template(
        "prod",
        TemplateSource::Superuser(Box::new(TemplateSource::Dump(DumpSource {
            path: dump,
            jobs: None,
            timeout: std::time::Duration::from_secs(60),
            allow_script: true,
        }))),
    ));
    assert_eq!(
        largest_template(&templates, None),
        Some(("prod".into(), 300 * MB))
    );
    // A snapshot's database sizes count too: a template built from a small command. One
    // no longer configured does not.
    templates.push(template("seeded", TemplateSource::Empty));
    let saved = |name: &str, mb: u64| snapshot::SnapshotTemplate {
        name: name.into(),
        fingerprint: "f".into(),
        size_bytes: (mb * MB) as i64,
    };
    let manifest = snapshot::Manifest::new(
        "18.1",
        &[],
        vec![saved("seeded", 900), saved("retired", 5000)],
    );
    assert_eq!(
        largest_template(&templates, Some(&manifest)),
        Some(("seeded".into(), 900 * MB))
    );
    let _ = std::fs::remove_dir_all(&dir);
}

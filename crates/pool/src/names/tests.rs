use super::*;

#[test]
fn template_names_follow_the_pattern() {
    for good in ["default", "a", "my-app_2", &"x".repeat(64)] {
        assert!(TemplateName::new(good).is_ok(), "{good}");
    }
    for bad in [
        "",
        "Default",
        "a b",
        "a;drop",
        "é",
        "../x",
        "a\"b",
        &"x".repeat(65),
    ] {
        assert!(TemplateName::new(bad).is_err(), "{bad}");
    }
}

#[test]
fn generated_database_names_fit_postgres_identifiers() {
    let name = TemplateName::new(&"z".repeat(64)).expect("valid");
    let fp = "f".repeat(64);
    let tpl = DbName::template(&name, &fp);
    assert!(tpl.as_str().len() <= MAX_IDENT_BYTES);
    assert!(tpl.as_str().starts_with(PREFIX));
    let clone = DbName::clone_db("abcdef", u64::MAX);
    assert!(clone.as_str().len() <= MAX_IDENT_BYTES);
    // Two names with the same source still get different template databases.
    let other = TemplateName::new("other").expect("valid");
    assert_ne!(DbName::template(&name, &fp), DbName::template(&other, &fp));
}

#[test]
fn integresql_names_are_integresqls_when_they_fit_and_none_otherwise() {
    let md5 = TemplateName::new("0123456789abcdef0123456789abcdef").expect("valid");
    let template = DbName::integresql_template(&md5).expect("an md5 hash fits");
    assert_eq!(
        template.as_str(),
        "integresql_template_0123456789abcdef0123456789abcdef"
    );
    assert!(template.is_template());
    let test = DbName::integresql_test(&md5, 12).expect("an md5 hash fits");
    assert_eq!(
        test.as_str(),
        "integresql_test_0123456789abcdef0123456789abcdef_12"
    );
    assert!(!test.is_template());
    // Longer than postgres keeps: no name rather than a truncated one another hash shares.
    let sha256 = TemplateName::new(&"a".repeat(64)).expect("valid");
    assert_eq!(DbName::integresql_template(&sha256), None);
    assert_eq!(DbName::integresql_test(&sha256, 1), None);
    let longest = TemplateName::new(&"b".repeat(63 - "integresql_template_".len())).expect("valid");
    assert!(DbName::integresql_template(&longest).is_some());
    assert_eq!(DbName::integresql_test(&md5, u64::MAX), None);
}

#[test]
fn lease_ids_round_trip_and_reject_garbage() {
    let id = LeaseId::random(0);
    assert_eq!(LeaseId::parse(id.as_str()), Some(id));
    assert_eq!(LeaseId::parse("../../etc"), None);
    assert_eq!(LeaseId::parse(&"A".repeat(32)), None);
}

#[test]
fn a_lease_id_names_its_server_in_its_first_byte() {
    let primary = LeaseId::random(0);
    assert_eq!(primary.first_byte(), 0);
    assert!(primary.as_str().starts_with("00"), "{primary}");
    assert_ne!(LeaseId::random(0), primary, "the rest is random");
    let further = LeaseId::random(18);
    assert_eq!(further.first_byte(), 18);
    assert_eq!(&further.as_str()[..2], "12");
    assert_eq!(LeaseId::parse(further.as_str()), Some(further.clone()));
}

#[test]
fn quoting_doubles_quotes() {
    assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
    assert_eq!(quote_literal("it's"), "'it''s'");
}

#[test]
fn role_names_need_no_quoting_and_are_nobody_elses() {
    for good in ["dbuser", "_x", "ci_user_2"] {
        assert_eq!(check_role_name(good), Ok(()), "{good}");
    }
    let long = "a".repeat(64);
    for bad in [
        "",
        "DbUser",
        "2x",
        "db-user",
        "db user",
        long.as_str(),
        "postgres",
        "public",
        "all",
        "pg_read_all_data",
        "pglease_owner",
        "integresql_test_abc_1",
    ] {
        assert!(check_role_name(bad).is_err(), "{bad:?}");
    }
}

//! Version parsing: requests and what `postgres --version` prints.

use super::*;

fn spec(text: &str) -> VersionSpec {
    text.parse()
        .unwrap_or_else(|e| panic!("{text:?} should parse: {e}"))
}

#[test]
fn a_major_or_a_major_and_minor_parses_and_prints_back() {
    assert_eq!(spec("17"), VersionSpec::Major(17));
    assert_eq!(
        spec("17.6"),
        VersionSpec::Exact {
            major: 17,
            minor: 6
        }
    );
    assert_eq!(spec(" 16 "), VersionSpec::Major(16));
    for text in ["13", "18", "17.6", "16.0"] {
        assert_eq!(spec(text).to_string(), text);
    }
    assert_eq!(spec("13").major(), 13);
}

#[test]
fn unsupported_or_malformed_versions_are_refused_naming_the_supported_majors() {
    for text in [
        "12", "19", "9.6", "17.6.0", "17.", ".6", "17.x", "abc", "", "+17", "-17", "v17", "17 6",
    ] {
        let error = text
            .parse::<VersionSpec>()
            .expect_err(&format!("{text:?} must not parse"));
        assert_eq!(error.given, text);
        let message = error.to_string();
        assert!(message.contains("13 to 18"), "{message}");
        assert!(message.contains("17.6"), "{message}");
    }
}

#[test]
fn a_spec_matches_its_major_or_exact_minor() {
    assert!(spec("17").matches(17, Some(6)));
    assert!(spec("17").matches(17, None));
    assert!(!spec("17").matches(16, Some(6)));
    assert!(spec("17.6").matches(17, Some(6)));
    assert!(!spec("17.6").matches(17, Some(5)));
    assert!(!spec("17.6").matches(17, None));
}

#[test]
fn server_versions_are_read_from_postgres_version_output() {
    assert_eq!(
        parse_server_version("postgres (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)"),
        Some((15, Some(18)))
    );
    assert_eq!(
        parse_server_version("postgres (PostgreSQL) 16.13"),
        Some((16, Some(13)))
    );
    assert_eq!(
        parse_server_version("postgres (PostgreSQL) 18beta1"),
        Some((18, None))
    );
    assert_eq!(
        parse_server_version("postgres (PostgreSQL) 9.6.24"),
        Some((9, Some(6)))
    );
    assert_eq!(parse_server_version("something else 15.1"), None);
}

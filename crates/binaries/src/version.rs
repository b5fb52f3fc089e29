//! Versions: what a user asks for ([`VersionSpec`]), what a server says it is
//! (`postgres --version`), and the releases Maven Central lists (`17.6.0`, whose third part
//! is zonky's build number).
//!
//! Pure parsing and comparison; nothing here runs a process or touches the network.

use std::fmt;
use std::ops::RangeInclusive;
use std::str::FromStr;

/// The majors pglease can be asked for: the ones PostgreSQL still supports, plus 13.
pub const SUPPORTED_MAJORS: RangeInclusive<u32> = 13..=18;

/// The major downloaded when no version is asked for and none is installed or cached.
pub const DEFAULT_MAJOR: u32 = 18;

/// A requested server version: a major (`17`, the newest 17.x) or an exact minor (`17.6`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum VersionSpec {
    /// Any release of this major; the newest one when choosing.
    Major(u32),
    /// Exactly this minor release.
    Exact {
        /// The major, e.g. 17.
        major: u32,
        /// The minor, e.g. 6 for 17.6.
        minor: u32,
    },
}

impl VersionSpec {
    /// The requested major.
    pub fn major(self) -> u32 {
        match self {
            VersionSpec::Major(major) | VersionSpec::Exact { major, .. } => major,
        }
    }

    /// Whether a server of `major` and `minor` (None for a beta, e.g. "18beta1") fits.
    pub fn matches(self, major: u32, minor: Option<u32>) -> bool {
        match self {
            VersionSpec::Major(wanted) => wanted == major,
            VersionSpec::Exact {
                major: wanted_major,
                minor: wanted_minor,
            } => wanted_major == major && Some(wanted_minor) == minor,
        }
    }
}

impl fmt::Display for VersionSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VersionSpec::Major(major) => write!(f, "{major}"),
            VersionSpec::Exact { major, minor } => write!(f, "{major}.{minor}"),
        }
    }
}

/// A version that is not a supported major or major.minor.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unsupported PostgreSQL version {given:?}: give a major from {first} to {last} (e.g. 17) \
     or a major.minor (e.g. 17.6)",
    first = SUPPORTED_MAJORS.start(),
    last = SUPPORTED_MAJORS.end()
)]
pub struct VersionSpecError {
    /// What was given.
    pub given: String,
}

impl FromStr for VersionSpec {
    type Err = VersionSpecError;

    fn from_str(text: &str) -> Result<VersionSpec, VersionSpecError> {
        let error = || VersionSpecError {
            given: text.to_owned(),
        };
        let number = |part: &str| -> Result<u32, VersionSpecError> {
            // Digits only: u32::from_str would also take "+17".
            if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
                return Err(error());
            }
            part.parse().map_err(|_| error())
        };
        let trimmed = text.trim();
        let spec = match trimmed.split_once('.') {
            None => VersionSpec::Major(number(trimmed)?),
            Some((major, minor)) => VersionSpec::Exact {
                major: number(major)?,
                minor: number(minor)?,
            },
        };
        if !SUPPORTED_MAJORS.contains(&spec.major()) {
            return Err(error());
        }
        Ok(spec)
    }
}

/// The major and minor in what `postgres --version` printed, e.g.
/// "postgres (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)" → (15, Some(18)),
/// "postgres (PostgreSQL) 18beta1" → (18, None). Before 10 the major had two parts; 9.6.24
/// gives (9, Some(6)), which no supported major matches anyway.
pub fn parse_server_version(output: &str) -> Option<(u32, Option<u32>)> {
    let (_, rest) = output.split_once("(PostgreSQL)")?;
    parse_version_number(rest.trim_start())
}

/// The major and minor of a version number as a server shows it in its `server_version`
/// setting: "15.18 (Debian 15.18-0+deb12u1)" → (15, Some(18)), "18beta1" → (18, None).
pub fn parse_version_number(rest: &str) -> Option<(u32, Option<u32>)> {
    let digits = |text: &str| -> Option<u32> {
        let end = text
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len());
        text[..end].parse().ok()
    };
    let major = digits(rest)?;
    let after_major = rest.trim_start_matches(|c: char| c.is_ascii_digit());
    let minor = after_major.strip_prefix('.').and_then(digits);
    Some((major, minor))
}

/// One release of zonky's binaries on Maven Central: `17.6.0`, or `13.1.0-1` for a re-release.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Release {
    /// The PostgreSQL major.
    pub major: u32,
    /// The PostgreSQL minor.
    pub minor: u32,
    /// zonky's build of that minor.
    pub build: u32,
    /// The `-N` suffix of a re-release, 0 without one.
    pub revision: u32,
    /// The version as Maven lists it (and as the cache directory names it).
    pub text: String,
}

impl Release {
    /// Parses `17.6.0` or `13.1.0-1`; anything else is not a release.
    pub fn parse(text: &str) -> Option<Release> {
        let (numbers, revision) = match text.split_once('-') {
            Some((numbers, revision)) => (numbers, strict_number(revision)?),
            None => (text, 0),
        };
        let mut parts = numbers.split('.');
        let release = Release {
            major: strict_number(parts.next()?)?,
            minor: strict_number(parts.next()?)?,
            build: strict_number(parts.next()?)?,
            revision,
            text: text.to_owned(),
        };
        parts.next().is_none().then_some(release)
    }

    /// Whether this release is of the requested version (any supported major when None).
    pub fn fits(&self, spec: Option<VersionSpec>) -> bool {
        match spec {
            Some(spec) => spec.matches(self.major, Some(self.minor)),
            None => SUPPORTED_MAJORS.contains(&self.major),
        }
    }

    /// "17.6", the PostgreSQL version this release packages.
    pub fn postgres_version(&self) -> String {
        format!("{}.{}", self.major, self.minor)
    }
}

/// A number of ASCII digits only.
fn strict_number(text: &str) -> Option<u32> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// Every `<version>` listed in a `maven-metadata.xml`. The file is small and regular, so
/// plain string search does; an XML parser would be one more dependency for one element.
pub(crate) fn listed_versions(metadata: &str) -> Vec<&str> {
    const OPEN: &str = "<version>";
    const CLOSE: &str = "</version>";
    let mut versions = Vec::new();
    let mut rest = metadata;
    while let Some(start) = rest.find(OPEN) {
        let after = &rest[start + OPEN.len()..];
        let Some(end) = after.find(CLOSE) else { break };
        versions.push(after[..end].trim());
        rest = &after[end + CLOSE.len()..];
    }
    versions
}

/// The newest listed release that fits `spec`.
pub(crate) fn pick_release(metadata: &str, spec: VersionSpec) -> Option<Release> {
    listed_versions(metadata)
        .into_iter()
        .filter_map(Release::parse)
        .filter(|release| release.fits(Some(spec)))
        .max()
}

/// The PostgreSQL versions listed for `major`, oldest first, for an error message.
pub(crate) fn listed_for_major(metadata: &str, major: u32) -> Vec<String> {
    let mut releases: Vec<Release> = listed_versions(metadata)
        .into_iter()
        .filter_map(Release::parse)
        .filter(|release| release.major == major)
        .collect();
    releases.sort();
    let mut versions: Vec<String> = releases.iter().map(Release::postgres_version).collect();
    versions.dedup();
    versions
}

#[cfg(test)]
mod tests;

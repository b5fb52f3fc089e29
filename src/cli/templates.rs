//! Templates from the command line: `--template NAME=SOURCE` and `--watch NAME=PATH`, and
//! the checks every template meets wherever it comes from.

use std::path::{Path, PathBuf};
use std::time::Duration;

use pglease_pool::config::{
    or_list, CommandSource, DumpSource, DEFAULT_COMMAND_TIMEOUT, SOURCE_KINDS,
};
use pglease_pool::{TemplateConfig, TemplateName, TemplateSource};

pub(super) fn push_template(
    templates: &mut Vec<TemplateConfig>,
    name: &str,
    source: TemplateSource,
    postgres_version: Option<pglease_binaries::VersionSpec>,
) -> Result<(), String> {
    let name = TemplateName::new(name).map_err(|e| e.to_string())?;
    if name == TemplateName::default_name() && source != TemplateSource::Empty {
        // Clients rely on `default` being an empty database.
        return Err("the template name \"default\" is reserved for the empty template".into());
    }
    if name == TemplateName::default_name() && postgres_version.is_some() {
        return Err(
            "the template \"default\" exists on every server; lease it with \
                    {\"postgres_version\": …} instead of naming a version for it"
                .into(),
        );
    }
    templates.push(TemplateConfig {
        name,
        source,
        postgres_version,
    });
    Ok(())
}

/// `--watch NAME=PATH`: one more watched path for the command template NAME.
pub(super) fn add_watch(templates: &mut [TemplateConfig], spec: &str) -> Result<(), String> {
    let (name, path) = spec
        .split_once('=')
        .filter(|(name, path)| !name.is_empty() && !path.is_empty())
        .ok_or_else(|| format!("--watch {spec:?}: expected NAME=PATH"))?;
    let template = templates
        .iter_mut()
        .find(|t| t.name.as_str() == name)
        .ok_or_else(|| {
            format!("--watch {spec:?}: no template {name:?} (define it with --template {name}=command:CMD)")
        })?;
    let mut source = &mut template.source;
    if let TemplateSource::Superuser(inner) = source {
        source = inner;
    }
    let TemplateSource::Command(command) = source else {
        return Err(format!(
            "--watch {spec:?}: template {name:?} is not a command template (its other sources are fingerprinted whole already)"
        ));
    };
    command.watch.push(absolute(Path::new(path))?);
    Ok(())
}

/// A command's timeout: 1 s to a day.
pub(super) fn command_timeout(secs: Option<u64>) -> Result<Duration, String> {
    match secs {
        None => Ok(DEFAULT_COMMAND_TIMEOUT),
        Some(secs @ 1..=86_400) => Ok(Duration::from_secs(secs)),
        Some(secs) => Err(format!("{secs} s: must be between 1 and 86400")),
    }
}

/// `NAME=migrations:DIR`, `NAME=sql:FILE`, `NAME=command:CMD`, `NAME=empty`; `NAME@16=…`
/// puts the template on a PostgreSQL 16 server.
pub(super) fn parse_template_flag(
    spec: &str,
) -> Result<(&str, Option<pglease_binaries::VersionSpec>, TemplateSource), String> {
    let usage = || {
        let forms: Vec<String> = SOURCE_KINDS
            .iter()
            .map(|(kind, value)| format!("NAME={kind}:{value}"))
            .chain(["NAME=empty".to_owned()])
            .collect();
        let forms: Vec<&str> = forms.iter().map(String::as_str).collect();
        format!(
            "--template {spec:?}: expected {} (NAME@16=… for a PostgreSQL 16 server)",
            or_list(&forms)
        )
    };
    let (name, source) = spec.split_once('=').ok_or_else(usage)?;
    let (name, version) = match name.split_once('@') {
        Some((name, version)) => {
            let version = version
                .parse()
                .map_err(|e| format!("--template {spec:?}: {e}"))?;
            (name, Some(version))
        }
        None => (name, None),
    };
    let source = match source.split_once(':') {
        Some(("migrations", dir)) if !dir.is_empty() => {
            TemplateSource::Migrations(absolute(Path::new(dir))?)
        }
        Some(("sql", file)) if !file.is_empty() => {
            TemplateSource::SqlFile(absolute(Path::new(file))?)
        }
        Some(("dump", file)) if !file.is_empty() => TemplateSource::Dump(DumpSource {
            path: absolute(Path::new(file))?,
            jobs: None,
            timeout: pglease_pool::config::DEFAULT_DUMP_TIMEOUT,
            allow_script: true,
        }),
        // Run in the current directory; only the command string enters the fingerprint
        // (`--watch NAME=PATH` or a config file's `watch` add files).
        Some(("command", command)) if !command.trim().is_empty() => {
            TemplateSource::Command(CommandSource {
                command: command.to_owned(),
                workdir: absolute(Path::new("."))?,
                watch: Vec::new(),
                timeout: DEFAULT_COMMAND_TIMEOUT,
            })
        }
        None if source == "empty" => TemplateSource::Empty,
        _ => return Err(usage()),
    };
    Ok((name, version, source))
}

/// Sources are resolved against the current directory now, so the daemon's own working
/// directory never matters.
pub(super) fn absolute(path: &Path) -> Result<PathBuf, String> {
    std::path::absolute(path).map_err(|e| format!("{}: {e}", path.display()))
}

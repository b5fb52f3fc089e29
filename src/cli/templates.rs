//! The templates section of `serve`'s configuration: the config file's `[templates.NAME]`
//! tables, then `--template NAME=SOURCE` and `--watch NAME=PATH`, and the checks every
//! template meets wherever it comes from.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use pglease_binaries::VersionSpec;
use pglease_pool::config::{
    one_source_kind, or_list, CommandOrigin, CommandSource, DumpSource, DEFAULT_COMMAND_TIMEOUT,
    DEFAULT_DUMP_TIMEOUT, SOURCE_KINDS,
};
use pglease_pool::{TemplateConfig, TemplateName, TemplateSource};

use super::file::{file_version, TemplateFile};
use super::serve::ServeArgs;

/// The templates: the config file's, in name order, with sources relative to `file_dir`;
/// then each `--template`, which replaces a file's template of the same name; then each
/// `--watch`, which adds a path to a command template of either kind.
pub(super) fn templates(
    flags: &ServeArgs,
    file: &BTreeMap<String, TemplateFile>,
    file_dir: &Path,
) -> Result<Vec<TemplateConfig>, String> {
    let mut templates = Vec::new();
    for (name, table) in file {
        let (source, version) = file_template(name, table, file_dir)?;
        push_template(&mut templates, name, source, version)?;
    }
    for spec in &flags.templates {
        let (name, version, source) = parse_template_flag(spec)?;
        templates.retain(|t: &TemplateConfig| t.name.as_str() != name);
        push_template(&mut templates, name, source, version)?;
    }
    for spec in &flags.watches {
        add_watch(&mut templates, spec)?;
    }
    Ok(templates)
}

/// A `[templates.NAME]` table: its source, with paths relative to `file_dir`, and the
/// PostgreSQL version it names. Keys that belong to another kind of source are refused,
/// not ignored.
fn file_template(
    name: &str,
    table: &TemplateFile,
    file_dir: &Path,
) -> Result<(TemplateSource, Option<VersionSpec>), String> {
    let version = table
        .postgres_version
        .as_ref()
        .map(file_version)
        .transpose()
        .map_err(|e| format!("template {name:?}: {e}"))?;
    if table.command.is_none() && (table.workdir.is_some() || !table.watch.is_empty()) {
        return Err(format!(
            "template {name:?}: workdir and watch go with command"
        ));
    }
    if table.command.is_none() && table.dump.is_none() && table.timeout_secs.is_some() {
        return Err(format!(
            "template {name:?}: timeout_secs goes with command or dump"
        ));
    }
    if table.dump.is_none() && table.jobs.is_some() {
        return Err(format!("template {name:?}: jobs goes with dump"));
    }
    let plain = match (&table.migrations, &table.sql, &table.command, &table.dump) {
        (None, None, None, Some(dump)) => {
            let timeout = match table.timeout_secs {
                None => DEFAULT_DUMP_TIMEOUT,
                Some(secs) => {
                    command_timeout(Some(secs)).map_err(|e| format!("timeout_secs: {e}"))?
                }
            };
            TemplateSource::Dump(DumpSource {
                path: absolute(&file_dir.join(dump))?,
                jobs: match table.jobs {
                    Some(0) => return Err(format!("template {name:?}: jobs must be at least 1")),
                    jobs => jobs,
                },
                timeout,
                // The operator's own dump: a script is as trusted as a command.
                allow_script: true,
            })
        }
        (Some(dir), None, None, None) => TemplateSource::Migrations(absolute(&file_dir.join(dir))?),
        (None, Some(path), None, None) => TemplateSource::SqlFile(absolute(&file_dir.join(path))?),
        (None, None, Some(command), None) => {
            let workdir =
                absolute(&file_dir.join(table.workdir.as_deref().unwrap_or(Path::new("."))))?;
            TemplateSource::Command(CommandSource {
                command: command.clone(),
                watch: table
                    .watch
                    .iter()
                    .map(|path| absolute(&workdir.join(path)))
                    .collect::<Result<_, _>>()?,
                workdir,
                timeout: command_timeout(table.timeout_secs)
                    .map_err(|e| format!("timeout_secs: {e}"))?,
                origin: CommandOrigin::Operator,
            })
        }
        (None, None, None, None) => TemplateSource::Empty,
        _ => return Err(format!("template {name:?}: {}", one_source_kind())),
    };
    let source = if table.superuser {
        TemplateSource::Superuser(Box::new(plain))
    } else {
        plain
    };
    Ok((source, version))
}

/// Adds a template, after the checks every template meets wherever it comes from: a valid
/// name, and `default` left as the empty template of every server.
fn push_template(
    templates: &mut Vec<TemplateConfig>,
    name: &str,
    source: TemplateSource,
    postgres_version: Option<VersionSpec>,
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
fn add_watch(templates: &mut [TemplateConfig], spec: &str) -> Result<(), String> {
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
fn parse_template_flag(spec: &str) -> Result<(&str, Option<VersionSpec>, TemplateSource), String> {
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
            timeout: DEFAULT_DUMP_TIMEOUT,
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
                origin: CommandOrigin::Operator,
            })
        }
        None if source == "empty" => TemplateSource::Empty,
        _ => return Err(usage()),
    };
    Ok((name, version, source))
}

/// Sources are resolved against the current directory now, so the daemon's own working
/// directory never matters.
fn absolute(path: &Path) -> Result<PathBuf, String> {
    std::path::absolute(path).map_err(|e| format!("{}: {e}", path.display()))
}

//! `GET /templates`, `GET /templates/{name}`, `PUT /templates/{name}`,
//! `POST /templates/{name}/rebuild`: what each template's current version is, registering
//! templates at run time, and forcing a new version. Whether the caller may change a
//! template the operator defined is the pool's decision; these handlers only say whether
//! the request showed the token (`crate::changer`).

use std::path::PathBuf;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use pglease_pool::config::{one_source_kind, CommandOrigin, DEFAULT_COMMAND_TIMEOUT};
use pglease_pool::{
    CommandSource, DumpSource, LeaseError, Registered, TemplateName, TemplateSource, TemplateStatus,
};

use super::leases::rfc3339;
use super::{parse_body, parse_postgres_version};
use crate::error::ApiError;
use crate::wire::{ErrorBody, ProgressJson, TemplateBody, TemplateJson};
use crate::{changer, AppState, TokenShown};

/// `GET /templates`: every template.
#[utoipa::path(get, path = "/templates", responses(
    (status = 200, description = "Every template", body = Vec<TemplateJson>),
    (status = 401, description = "A token is required", body = ErrorBody),
    (status = 503, description = "Stopping", body = ErrorBody),
))]
pub async fn list(State(state): State<AppState>) -> Result<Json<Vec<TemplateJson>>, ApiError> {
    let report = state
        .pool
        .status()
        .await
        .ok_or_else(ApiError::shutting_down)?;
    Ok(Json(
        report.templates.into_iter().map(template_json).collect(),
    ))
}

/// `GET /templates/{name}`: one template, 404 if unknown.
#[utoipa::path(get, path = "/templates/{name}", params(("name" = String, Path, description = "The template name", pattern = "^[a-z0-9_-]{1,64}$")), responses(
    (status = 200, description = "The template", body = TemplateJson),
    (status = 401, description = "A token is required", body = ErrorBody),
    (status = 404, description = "No such template", body = ErrorBody),
    (status = 422, description = "Not a valid template name", body = ErrorBody),
    (status = 503, description = "Stopping", body = ErrorBody),
))]
pub async fn show(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<TemplateJson>, ApiError> {
    let name = parse_name(&name)?;
    let report = state
        .pool
        .status()
        .await
        .ok_or_else(ApiError::shutting_down)?;
    report
        .templates
        .into_iter()
        .find(|t| t.name == name)
        .map(|t| Json(template_json(t)))
        .ok_or_else(|| LeaseError::unknown_template(name).into())
}

/// `POST /templates/{name}/rebuild` → 202: a new version is being built.
#[utoipa::path(post, path = "/templates/{name}/rebuild", params(("name" = String, Path, description = "The template name", pattern = "^[a-z0-9_-]{1,64}$")), responses(
    (status = 202, description = "A new version is being built", body = TemplateJson),
    (status = 401, description = "A token is required", body = ErrorBody),
    (status = 403, description = "template_is_configured: the operator defined the template (--template or the configuration file); only a holder of the API's token may rebuild it", body = ErrorBody),
    (status = 404, description = "No such template", body = ErrorBody),
    (status = 409, description = "The template is built by an IntegreSQL client", body = ErrorBody),
    (status = 422, description = "Not a valid template name", body = ErrorBody),
    (status = 503, description = "Stopping", body = ErrorBody),
))]
pub async fn rebuild(
    State(state): State<AppState>,
    shown: Option<Extension<TokenShown>>,
    Path(name): Path<String>,
) -> Result<(StatusCode, Json<TemplateJson>), ApiError> {
    if state.is_shutting_down() {
        return Err(ApiError::shutting_down());
    }
    let name = parse_name(&name)?;
    let status = state.pool.rebuild(name, changer(shown)).await?;
    Ok((StatusCode::ACCEPTED, Json(template_json(status))))
}

/// `PUT /templates/{name}` → 201 for a new template, 200 when replaced or unchanged.
#[utoipa::path(put, path = "/templates/{name}", params(("name" = String, Path, description = "The template name", pattern = "^[a-z0-9_-]{1,64}$")),
    request_body(content = Option<TemplateBody>, description = "One of migrations, sql or command; empty: an empty database"),
    responses(
        (status = 200, description = "Replaced or unchanged", body = TemplateJson),
        (status = 201, description = "Registered", body = TemplateJson),
        (status = 400, description = "The body is not JSON, or a query string was sent", body = ErrorBody),
        (status = 401, description = "A token is required", body = ErrorBody),
        (status = 403, description = "forbidden: commands over HTTP are not allowed; template_is_configured: the operator defined the template (--template or the configuration file), and only a holder of the API's token may replace it", body = ErrorBody),
        (status = 409, description = "The template is built by an IntegreSQL client", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 422, description = "Invalid name or source", body = ErrorBody),
        (status = 503, description = "Stopping", body = ErrorBody),
    ))]
pub async fn register(
    State(state): State<AppState>,
    shown: Option<Extension<TokenShown>>,
    Path(name): Path<String>,
    query: RawQuery,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<TemplateJson>), ApiError> {
    if state.is_shutting_down() {
        return Err(ApiError::shutting_down());
    }
    let name = parse_name(&name)?;
    if name == TemplateName::default_name() {
        return Err(ApiError::invalid(
            "the template \"default\" is the empty database and cannot be replaced",
        ));
    }
    let body: TemplateBody = parse_body(query, body)?;
    let postgres_version = parse_postgres_version(body.postgres_version.as_deref())?;
    let source = template_source(&state, body)?;
    // Whose the template is, the pool knows; the API says only who asks.
    let (registered, status) = state
        .pool
        .register(name, source, postgres_version, changer(shown))
        .await?;
    let code = match registered {
        Registered::Created => StatusCode::CREATED,
        Registered::Replaced | Registered::Unchanged => StatusCode::OK,
    };
    Ok((code, Json(template_json(status))))
}

/// Checks a source sent over HTTP: exactly one kind, absolute paths without `..`, and
/// commands only where the operator allowed them.
fn template_source(state: &AppState, body: TemplateBody) -> Result<TemplateSource, ApiError> {
    if !body.superuser {
        return plain_source(state, body);
    }
    if !state.config.allow_http_commands {
        return Err(ApiError::forbidden(
            "superuser templates run SQL as postgres' superuser, which can run programs as the server's OS user; this daemon was not started with --allow-http-commands (or set superuser = true in its configuration file)",
        ));
    }
    Ok(TemplateSource::Superuser(Box::new(plain_source(
        state, body,
    )?)))
}

/// A `dump` source: alone, an absolute path, 1 to 64 jobs. A plain-SQL one (a psql script,
/// which can run programs) is restored only where the operator allowed commands; the pool
/// tells the format by the dump's bytes, with the child user's rights.
fn dump_source(
    state: &AppState,
    dump: &str,
    body: &TemplateBody,
) -> Result<TemplateSource, ApiError> {
    if body.migrations.is_some() || body.sql.is_some() || body.command.is_some() {
        return Err(ApiError::invalid(one_source_kind()));
    }
    if body.workdir.is_some() || !body.watch.is_empty() {
        return Err(ApiError::invalid("workdir and watch go with command"));
    }
    let jobs = match body.jobs {
        None => None,
        Some(n @ 1..=64) => Some(n),
        Some(n) => {
            return Err(ApiError::invalid(format!(
                "jobs must be between 1 and 64, got {n}"
            )))
        }
    };
    let timeout = match body.timeout_secs {
        None => pglease_pool::config::DEFAULT_DUMP_TIMEOUT,
        Some(secs @ 1..=86_400) => Duration::from_secs(secs),
        Some(secs) => {
            return Err(ApiError::invalid(format!(
                "timeout_secs must be between 1 and 86400, got {secs}"
            )))
        }
    };
    Ok(TemplateSource::Dump(DumpSource {
        path: checked_path("dump", dump)?,
        jobs,
        timeout,
        allow_script: state.config.allow_http_commands,
    }))
}

/// [`template_source`] without the superuser flag.
fn plain_source(state: &AppState, body: TemplateBody) -> Result<TemplateSource, ApiError> {
    if let Some(dump) = &body.dump {
        return dump_source(state, dump, &body);
    }
    if body.jobs.is_some() {
        return Err(ApiError::invalid("jobs goes with dump"));
    }
    let is_command = body.command.is_some();
    if !is_command
        && (body.workdir.is_some() || !body.watch.is_empty() || body.timeout_secs.is_some())
    {
        return Err(ApiError::invalid(
            "workdir, watch and timeout_secs go with command",
        ));
    }
    match (body.migrations, body.sql, body.command) {
        (None, None, None) => Ok(TemplateSource::Empty),
        (Some(dir), None, None) => Ok(TemplateSource::Migrations(checked_path(
            "migrations",
            &dir,
        )?)),
        (None, Some(file), None) => Ok(TemplateSource::SqlFile(checked_path("sql", &file)?)),
        (None, None, Some(command)) => {
            if !state.config.allow_http_commands {
                return Err(ApiError::forbidden(
                    "command sources run programs (as the child user, --child-user); this daemon was not started with --allow-http-commands",
                ));
            }
            if command.trim().is_empty() {
                return Err(ApiError::invalid("command is empty"));
            }
            let workdir = match body.workdir {
                Some(dir) => checked_path("workdir", &dir)?,
                None => return Err(ApiError::invalid("a command needs an absolute workdir")),
            };
            let timeout = match body.timeout_secs {
                None => DEFAULT_COMMAND_TIMEOUT,
                Some(secs @ 1..=86_400) => Duration::from_secs(secs),
                Some(secs) => {
                    return Err(ApiError::invalid(format!(
                        "timeout_secs must be between 1 and 86400, got {secs}"
                    )))
                }
            };
            let watch = body
                .watch
                .iter()
                .map(|path| checked_path("watch", path))
                .collect::<Result<_, _>>()?;
            Ok(TemplateSource::Command(CommandSource {
                command,
                workdir,
                watch,
                timeout,
                // A caller's command runs as the child user, whoever owns its workdir.
                origin: CommandOrigin::Caller,
            }))
        }
        _ => Err(ApiError::invalid(one_source_kind())),
    }
}

/// An absolute path with no `..` component (the daemon's working directory must not
/// matter, and a source must say plainly what it reads).
fn checked_path(field: &str, text: &str) -> Result<PathBuf, ApiError> {
    let path = PathBuf::from(text);
    let plain = path.is_absolute()
        && !text.contains('\0')
        && path
            .components()
            .all(|c| !matches!(c, std::path::Component::ParentDir));
    if plain {
        Ok(path)
    } else {
        Err(ApiError::invalid(format!(
            "{field} must be an absolute path without '..', got {text:?}"
        )))
    }
}

fn parse_name(name: &str) -> Result<TemplateName, ApiError> {
    TemplateName::new(name).map_err(|e| ApiError::invalid(e.to_string()))
}

/// The JSON of one template (also used by `/status`).
pub(crate) fn template_json(t: TemplateStatus) -> TemplateJson {
    TemplateJson {
        name: t.name.to_string(),
        fingerprint: t.fingerprint,
        version: t.version,
        state: t.state.into(),
        build_ms: t.build_ms,
        size_bytes: t.size_bytes,
        built_at: t.built_at.map(rfc3339),
        ready: t.ready,
        leased: t.leased,
        in_progress: t.in_progress,
        waiting: t.waiting,
        blocked_by: t.blocked_by.map(Into::into),
        last_error: t.last_error,
        unwatched: t.unwatched,
        postgres_version: t.postgres_version,
        progress: t.progress.map(|p| ProgressJson {
            step: p.step,
            done: p.done,
            total: p.total,
            percent: p.percent,
            elapsed_secs: p.elapsed_secs,
            eta_secs: p.eta_secs,
        }),
    }
}

//! What `pglease status` and `pglease kept` show a person on a terminal: the daemon's JSON
//! laid out as aligned tables. Scripts get the JSON itself (`--json`, or any pipe).

use pglease_api::wire::{
    FrontJson, KeptJson, KeptResponse, PostgresJson, RefusedJson, StatusResponse, TemplateJson,
};

/// `GET /status` as tables: servers, templates, leases, the PostgreSQL front when it is on,
/// then one line of limits.
pub(super) fn status(status: &StatusResponse) -> String {
    let mut out = String::new();
    let servers: Vec<&PostgresJson> = match status.servers.as_slice() {
        // Never empty from a daemon (the primary is always there); the primary then.
        [] => vec![&status.postgres],
        servers => servers.iter().map(|s| &s.postgres).collect(),
    };
    out.push_str("PostgreSQL servers\n");
    out.push_str(&table(
        &["VERSION", "STATE", "PORT", "RESTARTS", "DATA DIR"],
        servers
            .iter()
            .map(|pg| {
                vec![
                    cell(pg.version.as_ref()),
                    pg.state.to_string(),
                    cell(pg.port),
                    pg.restarts.to_string(),
                    cell(pg.data_dir.as_ref()),
                ]
            })
            .collect(),
    ));
    out.push_str("\nTemplates\n");
    out.push_str(&table(
        &[
            "NAME",
            "SERVER",
            "STATE",
            "READY",
            "LEASED",
            "MAKING",
            "WAITING",
            "SIZE",
            "LAST ERROR",
        ],
        status
            .templates
            .iter()
            .map(|t| {
                vec![
                    t.name.clone(),
                    major(t.postgres_version.as_deref().unwrap_or_default()),
                    state_cell(t),
                    t.ready.to_string(),
                    t.leased.to_string(),
                    t.in_progress.to_string(),
                    t.waiting.to_string(),
                    t.size_bytes
                        .and_then(|n| u64::try_from(n).ok())
                        .map(bytes)
                        .unwrap_or_default(),
                    first_line(t.last_error.as_deref().unwrap_or_default(), ERROR_CHARS),
                ]
            })
            .collect(),
    ));
    if status.templates.iter().any(|t| {
        first_line(t.last_error.as_deref().unwrap_or_default(), ERROR_CHARS).ends_with('…')
    }) {
        out.push_str("  (… an error cut short: `pglease status --json` has all of it)\n");
    }
    out.push_str(&format!("\nLeases ({})\n", status.leases.len()));
    if !status.leases.is_empty() {
        out.push_str(&table(
            &["ID", "TEMPLATE", "DATABASE", "EXPIRES", "LABEL"],
            status
                .leases
                .iter()
                .map(|l| {
                    vec![
                        cell(l.id.as_ref()),
                        l.template.clone(),
                        l.database.clone(),
                        l.expires_at.clone(),
                        shorten(l.label.as_deref().unwrap_or_default(), 60),
                    ]
                })
                .collect(),
        ));
    }
    if let Some(front) = &status.front {
        out.push_str(&front_tables(front));
    }
    let limits = &status.limits;
    out.push_str(&format!(
        "\nConnections {} of {} · drops pending {} · kept {} · expired {} · refused {}\n",
        limits.connections_in_use,
        limits.connection_budget,
        status.drops.pending,
        limits.kept,
        limits.expired,
        refused(&limits.refused),
    ));
    out
}

/// The PostgreSQL front: its TLS and connections, then the leases shared by key.
fn front_tables(front: &FrontJson) -> String {
    let mut tls = match (front.tls.mode.as_str(), &front.tls.cert_file) {
        ("certificate", Some(file)) => format!("TLS with the certificate {file}"),
        (mode, _) => format!("TLS {mode}"),
    };
    if front.tls.required {
        tls.push_str(", required");
    }
    let over_tls = front.connections.iter().filter(|c| c.tls).count();
    let over_tls = match over_tls {
        0 => String::new(),
        n => format!(" ({n} over TLS)"),
    };
    let mut out = format!(
        "\nPostgreSQL front: {} connections open{over_tls}, {} accepted; {tls}\n",
        front.connections.len(),
        front.accepted
    );
    if !front.connections.is_empty() {
        out.push_str(&table(
            &["PEER", "STAGE", "DATABASE", "KEY", "LEASE", "SINCE"],
            front
                .connections
                .iter()
                .map(|c| {
                    vec![
                        c.peer.clone(),
                        c.stage.clone(),
                        cell(c.database.as_ref().or(c.template.as_ref())),
                        shorten(c.key.as_deref().unwrap_or_default(), 40),
                        cell(c.lease_id.as_ref()),
                        c.since.clone(),
                    ]
                })
                .collect(),
        ));
    }
    if !front.keys.is_empty() {
        out.push_str(&format!("\nKeys ({})\n", front.keys.len()));
        out.push_str(&table(
            &["KEY", "DATABASE", "CONNECTIONS", "RELEASED AT", "LEASE"],
            front
                .keys
                .iter()
                .map(|k| {
                    vec![
                        shorten(&k.name, 40),
                        cell(k.database.as_ref()),
                        k.connections.to_string(),
                        cell(k.release_at.as_ref()),
                        cell(k.lease_id.as_ref()),
                    ]
                })
                .collect(),
        ));
    }
    out
}

/// Requests refused or timed out, whatever the limit.
fn refused(refused: &RefusedJson) -> u64 {
    // Taken apart field by field, so that a new limit cannot be left out of the sum.
    let RefusedJson {
        connection_budget,
        max_total,
        byte_budget,
        max_waiting,
        making,
    } = refused;
    connection_budget + max_total + byte_budget + max_waiting + making
}

/// `GET /kept` as a table, with each database's URL on a line of its own (it is long, and
/// it is what one copies) where the daemon shows them: only with a token.
pub(super) fn kept(kept: &KeptResponse) -> String {
    if kept.kept.is_empty() {
        return "no kept databases (release with --keep SECS, or run --keep-on-failure)\n".into();
    }
    let mut out = table(
        &["DATABASE", "TEMPLATE", "KEPT UNTIL", "SIZE", "LABEL"],
        kept.kept
            .iter()
            .map(|k| {
                vec![
                    k.database.clone(),
                    k.template.clone().unwrap_or_default(),
                    k.expires_at.clone(),
                    bytes(k.size_bytes),
                    shorten(k.label.as_deref().unwrap_or_default(), 60),
                ]
            })
            .collect(),
    );
    let with_urls: Vec<(&KeptJson, &str)> = kept
        .kept
        .iter()
        .filter_map(|k| Some((k, k.url.as_deref()?)))
        .collect();
    if with_urls.is_empty() {
        out.push_str(
            "\nURLs and ids are shown to token holders only; the lease answer (or the test's log) has yours\n",
        );
    } else {
        out.push('\n');
        for (k, url) in with_urls {
            out.push_str(&format!(
                "{}  {}  {url}\n",
                k.database,
                k.id.as_deref().unwrap_or_default(),
            ));
        }
    }
    out
}

/// An optional value as a cell: empty when absent.
fn cell(value: Option<impl ToString>) -> String {
    value.map(|value| value.to_string()).unwrap_or_default()
}

/// "15" of "15.14 (Debian 15.14-0+deb12u1)".
fn major(version: &str) -> String {
    version
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap_or_default()
        .to_owned()
}

fn bytes(n: u64) -> String {
    const MB: u64 = 1024 * 1024;
    if n >= 10 * MB {
        format!("{} MB", n / MB)
    } else {
        format!("{:.1} MB", n as f64 / MB as f64)
    }
}

/// Characters of an error shown in a table cell.
const ERROR_CHARS: usize = 72;

/// An error as a cell: its first line, at most `max` characters, ending in `…` when cut
/// short (postgres' errors go on for lines: `LINE 3: …`, a caret, the output of a command).
fn first_line(text: &str, max: usize) -> String {
    let mut lines = text.lines();
    let first = lines.next().unwrap_or_default().trim_end();
    let more = lines.any(|line| !line.trim().is_empty());
    if first.chars().count() <= max && !more {
        return first.to_owned();
    }
    let kept: String = first.chars().take(max.saturating_sub(1)).collect();
    format!("{}…", kept.trim_end())
}

/// At most `max` characters, the end kept (a test id's end names the test).
fn shorten(text: &str, max: usize) -> String {
    let count = text.chars().count();
    if count <= max {
        return text.to_owned();
    }
    let tail: String = text.chars().skip(count - (max - 1)).collect();
    format!("…{tail}")
}

/// `cell` with each control character escaped (`\n`, `\t`, `\u{1b}`).
fn escape_controls(cell: &str) -> String {
    cell.chars()
        .flat_map(|c| {
            let escaped: Vec<char> = if c.is_control() {
                c.escape_default().collect()
            } else {
                vec![c]
            };
            escaped
        })
        .collect()
}

/// Columns padded to their widest cell, two spaces apart, the header first.
fn table(headers: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    // A control character left in a cell (a newline, a tab) would break its row: shown
    // escaped, each row stays one line.
    let rows: Vec<Vec<String>> = rows
        .into_iter()
        .map(|row| row.iter().map(|cell| escape_controls(cell)).collect())
        .collect();
    let line = |cells: Vec<String>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        format!("  {}\n", padded.join("  ").trim_end())
    };
    let mut out = line(headers.iter().map(|h| (*h).to_owned()).collect());
    for row in rows {
        out.push_str(&line(row));
    }
    out
}

/// A template's state; while a build reports progress, a bar with the share done and the
/// estimated time left (`building ███░░░░░░░ 31% 12s left`).
fn state_cell(template: &TemplateJson) -> String {
    let mut state = template.state.to_string();
    // A command template that watches no file: its edits go unseen (docs/configuration.md).
    if template.unwatched {
        state.push_str(" (unwatched)");
    }
    let Some(progress) = &template.progress else {
        return state;
    };
    match progress.percent {
        Some(percent) => {
            const WIDTH: u64 = 10;
            let full = (percent.min(100) * WIDTH / 100) as usize;
            let bar = format!("{}{}", "█".repeat(full), "░".repeat(WIDTH as usize - full));
            let left = progress
                .eta_secs
                .map(|s| format!(" {s}s left"))
                .unwrap_or_default();
            format!("{state} {bar} {percent}%{left}")
        }
        None => format!("{state} ({}s)", progress.elapsed_secs),
    }
}

#[cfg(test)]
mod tests {
    use pglease_api::wire::{KeptJson, KeptResponse, StatusResponse};
    use serde_json::{json, Value};

    /// `partial` over `defaults`, key by key.
    fn over(defaults: Value, partial: &Value) -> Value {
        let mut merged = defaults;
        if let (Some(merged), Some(partial)) = (merged.as_object_mut(), partial.as_object()) {
            for (key, value) in partial {
                merged.insert(key.clone(), value.clone());
            }
        }
        merged
    }

    /// A `/status` answer: what a test writes, every other field zero, empty or absent.
    fn status_of(partial: Value) -> StatusResponse {
        let postgres = |partial: &Value| {
            over(
                json!({"state": "running", "external": false, "settings": {}, "restarts": 0, "admin_timeouts": 0}),
                partial,
            )
        };
        let drops = |partial: &Value| over(json!({"pending": 0, "failed": 0}), partial);
        let limits = |partial: &Value| {
            let mut limits = over(
                json!({"connection_budget": 0, "connections_in_use": 0, "kept": 0, "reclaimed": 0,
                       "abandoned": 0, "expired": 0, "exceeded_max_bytes": 0, "reused_unchanged": 0, "replaced_changed": 0, "replaced_unstamped": 0,
                       "logical_bytes": 0}),
                partial,
            );
            limits["refused"] = over(
                json!({"connection_budget": 0, "max_total": 0, "byte_budget": 0, "max_waiting": 0, "making": 0}),
                &partial["refused"],
            );
            limits
        };
        let mut status = partial;
        status["postgres"] = postgres(&status["postgres"]);
        status["drops"] = drops(&status["drops"]);
        status["limits"] = limits(&status["limits"]);
        for key in ["templates", "leases", "servers"] {
            if status[key].is_null() {
                status[key] = json!([]);
            }
        }
        for server in status["servers"].as_array_mut().into_iter().flatten() {
            *server = over(json!({"major": 0, "templates": []}), server);
            server["postgres"] = postgres(&server["postgres"]);
            server["drops"] = drops(&server["drops"]);
            server["limits"] = limits(&server["limits"]);
        }
        for template in status["templates"].as_array_mut().into_iter().flatten() {
            *template = over(json!({"version": 1, "unwatched": false}), template);
        }
        serde_json::from_value(status).expect("a status answer")
    }

    #[test]
    fn status_lays_out_servers_templates_and_leases() {
        let status = json!({
            "postgres": {"version": "15.14", "state": "running", "port": 40213},
            "servers": [
                {"major": 15, "postgres": {"version": "15.14 (Debian)", "state": "running", "port": 40213, "restarts": 0, "data_dir": "/dev/shm/a"}},
                {"major": 18, "postgres": {"version": "18.6", "state": "running", "port": 40999, "restarts": 1, "data_dir": "/dev/shm/b"}},
            ],
            "templates": [
                {"name": "default", "postgres_version": "15.14 (Debian)", "state": "ready", "ready": 4, "leased": 1, "in_progress": 0, "waiting": 0, "size_bytes": 7_500_000, "last_error": null},
                {"name": "cmd", "postgres_version": "15.14 (Debian)", "state": "ready", "ready": 1, "leased": 0, "in_progress": 0, "waiting": 0, "size_bytes": null, "last_error": null, "unwatched": true},
                {"name": "app18", "postgres_version": "18.6", "state": "failed", "ready": 0, "leased": 0, "in_progress": 0, "waiting": 2, "size_bytes": null, "last_error": "syntax error"},
                {"name": "big", "postgres_version": "15.14 (Debian)", "state": "building", "ready": 0, "leased": 0, "in_progress": 0, "waiting": 1, "size_bytes": null, "last_error": null,
                 "progress": {"step": "restoring /d/big.dump", "done": 31, "total": 100, "percent": 31, "elapsed_secs": 5, "eta_secs": 12}},
            ],
            "leases": [{"id": "abc", "template": "default", "database": "pglease_x_1", "expires_at": "2026-11-23T06:00:00Z", "label": "tests/test_a.py::test_one"}],
            "drops": {"pending": 2},
            "limits": {"connections_in_use": 10, "connection_budget": 350, "kept": 1, "expired": 3, "refused": {"max_total": 2, "making": 1}},
        });
        let out = super::status(&status_of(status));
        assert!(
            out.lines().any(|l| l.trim_start().starts_with("18.6")
                && l.contains("running")
                && l.contains("40999")),
            "{out}"
        );
        assert!(
            out.lines().any(|l| l.trim_start().starts_with("app18")
                && l.contains("18")
                && l.contains("syntax error")),
            "{out}"
        );
        assert!(out.contains("7.2 MB"), "{out}");
        assert!(
            out.lines()
                .any(|l| l.trim_start().starts_with("cmd") && l.contains("ready (unwatched)")),
            "{out}"
        );
        assert!(out.contains("building ███░░░░░░░ 31% 12s left"), "{out}");
        assert!(
            out.contains("Leases (1)") && out.contains("tests/test_a.py::test_one"),
            "{out}"
        );
        assert!(
            out.contains(
                "Connections 10 of 350 · drops pending 2 · kept 1 · expired 3 · refused 3"
            ),
            "{out}"
        );
    }

    #[test]
    fn the_front_shows_its_connections_and_keys_and_nothing_when_off() {
        let front = json!({
            "accepted": 7,
            "connections": [
                {"peer": "127.0.0.1:50000", "stage": "relaying", "since": "2026-11-26T22:00:00Z", "template": "app", "key": "app.t1", "database": "pglease_app_3"},
                {"peer": "127.0.0.1:50001", "stage": "leasing", "since": "2026-11-26T22:00:01Z", "template": "app"},
            ],
            "keys": [{"name": "app.t1", "database": "pglease_app_3", "connections": 1}],
        });
        let out = super::status(&status_of(json!({ "front": front })));
        assert!(
            out.contains("PostgreSQL front: 2 connections open, 7 accepted; TLS off"),
            "a daemon that predates TLS at the front has none: {out}"
        );
        assert!(
            out.lines().any(|l| l.contains("127.0.0.1:50000")
                && l.contains("relaying")
                && l.contains("pglease_app_3")
                && l.contains("app.t1")),
            "{out}"
        );
        assert!(
            out.lines().any(|l| l.contains("127.0.0.1:50001")
                && l.contains("leasing")
                && l.contains("app")),
            "{out}"
        );
        assert!(
            out.contains("Keys (1)") && out.lines().any(|l| l.trim_start().starts_with("app.t1")),
            "{out}"
        );
        let out = super::status(&status_of(json!({})));
        assert!(!out.contains("PostgreSQL front"), "{out}");
    }

    #[test]
    fn the_front_says_how_it_serves_tls() {
        let front = |tls: serde_json::Value| {
            json!({
                "accepted": 3,
                "connections": [
                    {"peer": "127.0.0.1:50000", "stage": "relaying", "since": "2026-11-26T22:00:00Z", "tls": true},
                    {"peer": "127.0.0.1:50001", "stage": "starting", "since": "2026-11-26T22:00:01Z"},
                ],
                "keys": [],
                "tls": tls,
            })
        };
        let out = super::status(&status_of(json!({
            "front": front(json!({"mode": "self-signed"}))
        })));
        assert!(
            out.contains("2 connections open (1 over TLS), 3 accepted; TLS self-signed"),
            "{out}"
        );
        let out = super::status(&status_of(json!({
            "front": front(json!({"mode": "certificate", "cert_file": "/etc/pglease/front.pem"}))
        })));
        assert!(
            out.contains("; TLS with the certificate /etc/pglease/front.pem"),
            "{out}"
        );
    }

    #[test]
    fn a_multi_line_error_keeps_its_row_on_one_line() {
        let error = "/m/0002_users.sql: ERROR: syntax error at or near \"CREAT\" (line 3)\nLINE 3: CREAT TABLE users (\n        ^";
        let status = json!({
            "servers": [{"postgres": {"version": "17.6", "state": "running", "port": 1, "restarts": 0, "data_dir": "/d"}}],
            "templates": [
                {"name": "app", "postgres_version": "17.6", "state": "failed", "ready": 0, "leased": 0, "in_progress": 0, "waiting": 0, "size_bytes": null, "last_error": error},
                {"name": "tabbed", "postgres_version": "17.6", "state": "ready", "ready": 1, "leased": 0, "in_progress": 0, "waiting": 0, "size_bytes": null, "last_error": null},
            ],
            "leases": [{"id": "abc", "template": "app", "database": "d", "expires_at": "x", "label": "a\tb"}],
            "limits": {},
        });
        let out = super::status(&status_of(status));
        let row = out
            .lines()
            .find(|l| l.trim_start().starts_with("app "))
            .unwrap_or_else(|| panic!("the row of app in:\n{out}"));
        assert!(
            row.ends_with("ERROR: syntax error at or near \"CREAT\" (line 3)…"),
            "{out}"
        );
        assert!(
            !out.contains("LINE 3") && !out.lines().any(|l| l.trim() == "^"),
            "{out}"
        );
        assert!(
            out.contains("`pglease status --json` has all of it"),
            "{out}"
        );
        // Any other cell with a control character is escaped, not broken across lines.
        assert!(out.contains("a\\tb"), "{out}");
        // A long first line is cut at its end, a short one-line error left as it is.
        assert_eq!(
            super::first_line(&"x".repeat(100), 10),
            format!("{}…", "x".repeat(9))
        );
        assert_eq!(super::first_line("short\n", 10), "short");
    }

    #[test]
    fn kept_lists_each_url_on_its_own_line() {
        let entry = |label: Option<String>, size_bytes: u64, token: bool| KeptJson {
            id: token.then(|| "abc".to_owned()),
            template: Some("app".into()),
            database: "pglease_d".into(),
            label,
            host: "h".into(),
            port: 1,
            user: "u".into(),
            password: token.then(|| "p".to_owned()),
            url: token.then(|| "postgres://u:p@h:1/d".to_owned()),
            kept_at: "2026-11-23T06:00:00Z".into(),
            expires_at: "2026-11-23T07:00:00Z".into(),
            size_bytes,
        };
        let kept = KeptResponse {
            kept: vec![entry(Some("x".repeat(100)), 20_000_000, true)],
        };
        let out = super::kept(&kept);
        assert!(
            out.contains("pglease_d  abc  postgres://u:p@h:1/d"),
            "{out}"
        );
        assert!(out.contains("19 MB"), "{out}");
        assert!(out.contains(&format!("…{}", "x".repeat(59))), "{out}");
        assert!(super::kept(&KeptResponse { kept: vec![] }).starts_with("no kept databases"));
        // Without a token the daemon shows neither ids nor URLs: the table says why.
        let bare = KeptResponse {
            kept: vec![entry(None, 1, false)],
        };
        let out = super::kept(&bare);
        assert!(
            out.contains("pglease_d") && out.contains("token holders only"),
            "{out}"
        );
    }
}

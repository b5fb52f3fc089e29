//! What `pglease kept` shows a person: the daemon's JSON laid out as an aligned table.
//! Scripts get the JSON itself (`--json`).

use serde_json::Value;

/// `GET /kept` as a table, with each database's URL on a line of its own (it is long, and
/// it is what one copies).
pub(super) fn kept(kept: &Value) -> String {
    let entries: Vec<&Value> = list(&kept["kept"]).collect();
    if entries.is_empty() {
        return "no kept databases (release with --keep SECS, or run --keep-on-failure)\n".into();
    }
    let mut out = table(
        &["ID", "TEMPLATE", "KEPT UNTIL", "SIZE", "LABEL"],
        entries
            .iter()
            .map(|k| {
                vec![
                    text(&k["id"]),
                    text(&k["template"]),
                    text(&k["expires_at"]),
                    k["size_bytes"].as_u64().map(bytes).unwrap_or_default(),
                    shorten(&text(&k["label"]), 60),
                ]
            })
            .collect(),
    );
    out.push('\n');
    for k in entries {
        out.push_str(&format!("{}  {}\n", text(&k["id"]), text(&k["url"])));
    }
    out
}

fn list(value: &Value) -> impl Iterator<Item = &Value> {
    value.as_array().into_iter().flatten()
}

/// A JSON scalar as a cell: strings bare, null empty.
fn text(value: &Value) -> String {
    match value {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn bytes(n: u64) -> String {
    const MB: u64 = 1024 * 1024;
    if n >= 10 * MB {
        format!("{} MB", n / MB)
    } else {
        format!("{:.1} MB", n as f64 / MB as f64)
    }
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

/// Columns padded to their widest cell, two spaces apart, the header first.
fn table(headers: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn kept_lists_each_url_on_its_own_line() {
        let kept = json!({"kept": [{"id": "abc", "template": "app", "expires_at": "2026-11-23T07:00:00Z", "size_bytes": 20_000_000, "label": "x".repeat(100), "url": "postgres://u:p@h:1/d"}]});
        let out = super::kept(&kept);
        assert!(out.contains("abc  postgres://u:p@h:1/d"), "{out}");
        assert!(out.contains("19 MB"), "{out}");
        assert!(out.contains(&format!("…{}", "x".repeat(59))), "{out}");
        assert!(super::kept(&json!({"kept": []})).starts_with("no kept databases"));
    }
}

//! Who gets in: a bearer token when one is set (always when listening beyond loopback),
//! compared in constant time; health checks stay open; no CORS headers; a cap on waiting
//! requests; the operator's templates change only for the token's holders.

use std::time::Duration;

use serde_json::json;

use crate::support::{binary, connect, scratch_dir, TestDaemon};

#[tokio::test]
async fn a_token_guards_every_route_but_health_checks() {
    let daemon = TestDaemon::builder()
        .args(["--token", "s3cret-token"])
        .start()
        .await;
    let lease = |auth: Option<&str>| {
        let mut request = daemon
            .http
            .post(format!("{}/lease", daemon.base))
            .json(&json!({}));
        if let Some(auth) = auth {
            request = request.header("authorization", auth);
        }
        request
    };
    for auth in [
        None,
        Some("Bearer wrong"),
        Some("Bearer s3cret-token-but-longer"),
        Some("s3cret-token"),
        Some("Basic czNjcmV0"),
    ] {
        let response = lease(auth).send().await.expect("request");
        assert_eq!(response.status().as_u16(), 401, "{auth:?}");
        assert_eq!(
            response
                .headers()
                .get("www-authenticate")
                .map(|v| v.to_str().unwrap_or("")),
            Some("Bearer")
        );
        let body: serde_json::Value = response.json().await.expect("json");
        assert_eq!(body["error"]["code"], "unauthorized");
    }
    let (status, _) = daemon.send(lease(Some("Bearer s3cret-token"))).await;
    assert_eq!(status, 201);
    for path in ["/status", "/templates"] {
        let (status, _) = daemon.get(path).await;
        assert_eq!(status, 401, "{path}");
    }
    for path in ["/healthz", "/readyz"] {
        let (status, _) = daemon.get(path).await;
        assert_eq!(status, 200, "{path} stays open for probes");
    }
    // The CLI sends the token from PGLEASE_TOKEN.
    let base = daemon.base.clone();
    let out = tokio::task::spawn_blocking(move || {
        binary()
            .arg("lease")
            .env("PGLEASE_URL", &base)
            .env("PGLEASE_TOKEN", "s3cret-token")
            .output()
            .expect("run")
    })
    .await
    .expect("join");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The token never shows in the log.
    assert!(!daemon.log().contains("s3cret-token"));
}

#[tokio::test]
async fn listening_beyond_loopback_requires_a_token() {
    let out = binary()
        .args(["serve", "--listen", "0.0.0.0:0"])
        .env_remove("PGLEASE_TOKEN")
        .output()
        .expect("run");
    let log = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{log}");
    assert!(log.contains("--token"), "{log}");
}

#[tokio::test]
async fn no_cors_headers_are_sent() {
    let daemon = TestDaemon::start().await;
    for method in ["GET", "OPTIONS"] {
        let response = daemon
            .http
            .request(
                method.parse().expect("method"),
                format!("{}/status", daemon.base),
            )
            .header("origin", "https://evil.example")
            .header("access-control-request-method", "POST")
            .send()
            .await
            .expect("request");
        let cors: Vec<_> = response
            .headers()
            .keys()
            .filter(|name| name.as_str().starts_with("access-control-"))
            .collect();
        assert!(cors.is_empty(), "{method}: {cors:?}");
    }
}

#[tokio::test]
async fn too_many_waiting_requests_get_429() {
    let daemon = TestDaemon::builder()
        .args(["--max-waiting", "1", "--max-total", "1", "--min-ready", "1"])
        .start()
        .await;
    let _held = daemon.lease_ok("default").await;
    let waiter = daemon.lease_in_background(json!({ "wait_ms": 3000 }));
    daemon.wait_for_waiting("default", 1).await;
    let response = daemon
        .http
        .post(format!("{}/lease", daemon.base))
        .json(&json!({ "wait_ms": 3000 }))
        .send()
        .await
        .expect("request");
    assert_eq!(response.status().as_u16(), 429);
    assert!(response.headers().contains_key("retry-after"));
    let answer = waiter.await.expect("waiter");
    assert_eq!(
        answer.status, 504,
        "the waiting one still times out normally"
    );
}

#[tokio::test]
async fn the_token_can_come_from_a_file() {
    let file = crate::support::scratch_dir("token-file").join("token");
    std::fs::write(&file, "from-a-file\n").expect("write");
    let daemon = TestDaemon::builder()
        .args(["--token-file", file.to_str().expect("utf8")])
        .start()
        .await;
    let (status, _) = daemon.lease(json!({})).await;
    assert_eq!(status, 401);
    let request = daemon
        .http
        .post(format!("{}/lease", daemon.base))
        .header("authorization", "Bearer from-a-file")
        .json(&json!({}));
    let (status, body) = daemon.send(request).await;
    assert_eq!(
        status, 201,
        "the file's content, without its newline: {body}"
    );
    assert!(daemon.stop().await.success());
}

/// Issue 25, row 9: without a token anybody on loopback reads `/status` and `/kept`, and a
/// lease id releases (or drops) its lease: neither shows ids or passwords then. Each holder
/// has its own from the lease answer, which is all it needs. With a token they show.
#[tokio::test]
async fn without_a_token_no_answer_carries_another_leases_id_or_password() {
    use crate::support::{connect, id_of};
    let daemon = TestDaemon::start().await;
    let lease = daemon.lease_ok("default").await;
    let id = id_of(&lease);
    let password = lease["password"].as_str().expect("password").to_owned();
    let (status, listed) = daemon.get("/status").await;
    assert_eq!(status, 200);
    let entry = &listed["leases"][0];
    assert_eq!(entry["database"], lease["database"]);
    assert!(entry.get("id").is_none(), "{entry}");
    let (status, body) = daemon
        .send(
            daemon
                .http
                .delete(format!("{}/leases/{id}?keep=60", daemon.base)),
        )
        .await;
    assert_eq!(status, 204, "{body}");
    let (status, kept) = daemon.get("/kept").await;
    assert_eq!(status, 200);
    let entry = &kept["kept"][0];
    assert_eq!(entry["database"], lease["database"]);
    for secret in ["id", "password", "url"] {
        assert!(entry.get(secret).is_none(), "{secret} in {entry}");
    }
    for (path, body) in [("/status", &listed), ("/kept", &kept)] {
        let text = body.to_string();
        assert!(
            !text.contains(&id) && !text.contains(&password),
            "{path}: {text}"
        );
    }
    // The holder, who has its lease answer, still opens and drops its kept database.
    connect(&lease).await.expect("the lease's own URL opens it");
    let (status, body) = daemon
        .send(daemon.http.delete(format!("{}/kept/{id}", daemon.base)))
        .await;
    assert_eq!(status, 204, "{body}");
    assert!(daemon.stop().await.success());

    // A token holder is trusted with every lease: it sees them.
    let daemon = TestDaemon::builder().token("s3cret").start().await;
    let lease = daemon.lease_ok("default").await;
    let (_, listed) = daemon.get("/status").await;
    assert_eq!(listed["leases"][0]["id"], lease["id"]);
    let (status, _) = daemon
        .send(
            daemon
                .http
                .delete(format!("{}/leases/{}?keep=60", daemon.base, id_of(&lease))),
        )
        .await;
    assert_eq!(status, 204);
    let (_, kept) = daemon.get("/kept").await;
    assert_eq!(kept["kept"][0]["password"], lease["password"]);
    assert!(daemon.stop().await.success());
}

/// Issue 25, row 9: an anonymous `POST /lease {"postgres_version": "16"}` made the daemon
/// download binaries and start a second postmaster. Without a token a request gets the
/// majors the operator chose — the primary's and those its templates name — no more.
#[tokio::test]
async fn without_a_token_no_request_starts_a_server_of_another_major() {
    let daemon = TestDaemon::builder()
        .args([
            // Were a download tried, nothing answers there: it would fail with 503.
            "--postgres-repository",
            "http://127.0.0.1:9/maven2",
        ])
        .start()
        .await;
    let primary: u32 = daemon.status().await["postgres"]["version"]
        .as_str()
        .and_then(|v| v.split('.').next())
        .and_then(|major| major.parse().ok())
        .expect("the primary's major");
    let other = if primary == 14 { "13" } else { "14" };
    let started = std::time::Instant::now();
    for body in [
        json!({"postgres_version": other}),
        json!({"template": "default", "postgres_version": other, "wait_ms": 30000}),
    ] {
        let (status, answer) = daemon.lease(body.clone()).await;
        assert_eq!(status, 422, "{body}: {answer}");
        assert_eq!(answer["error"]["code"], "postgres_version_not_served");
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("--token"), "{message}");
    }
    let (status, answer) = daemon
        .put_template("app", json!({"postgres_version": other}))
        .await;
    assert_eq!(status, 422, "{answer}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "answered at once"
    );
    // Nothing was started or fetched: one server, and no download in the log.
    assert_eq!(
        daemon.status().await["servers"].as_array().map(Vec::len),
        Some(1)
    );
    assert!(!daemon.log().contains("127.0.0.1:9"), "{}", daemon.log());
    daemon.lease_ok("default").await;
    assert!(daemon.stop().await.success());
}

/// Issue 25, row 9: a client sending its request a byte at a time (or not at all) held a
/// connection and a task without end. Headers and bodies must now arrive within 10 s each.
#[tokio::test]
async fn a_client_that_stalls_its_request_is_cut_off() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let daemon = TestDaemon::start().await;
    let address = daemon.base.trim_start_matches("http://").to_owned();
    let stalled = |request: &'static str| {
        let address = address.clone();
        tokio::spawn(async move {
            let mut stream = tokio::net::TcpStream::connect(&address)
                .await
                .expect("connect");
            stream.write_all(request.as_bytes()).await.expect("send");
            let started = std::time::Instant::now();
            let mut answer = Vec::new();
            // Until the server answers and closes, or hangs up; far longer than its bound.
            let read =
                tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut answer))
                    .await;
            (
                read.is_ok(),
                started.elapsed(),
                String::from_utf8_lossy(&answer).into_owned(),
            )
        })
    };
    let headers = stalled("GET /status HTTP/1.1\r\nHost: pglease\r\n");
    let body = stalled(
        "PUT /templates/x HTTP/1.1\r\nHost: pglease\r\nContent-Type: application/json\r\n\
         Content-Length: 100\r\nConnection: close\r\n\r\n{\"sql\"",
    );
    // Everyone else is served meanwhile.
    daemon.lease_ok("default").await;
    for (what, task) in [("headers", headers), ("body", body)] {
        let (closed, after, answer) = task.await.expect("join");
        assert!(closed, "a stalled {what} held its connection for {after:?}");
        assert!(
            after < Duration::from_secs(20),
            "{what}: cut off only after {after:?}"
        );
        if what == "body" {
            assert!(answer.starts_with("HTTP/1.1 4"), "{what}: {answer}");
        }
    }
    assert!(daemon.stop().await.success());
}

/// The operator's schema: a table whose quantities stay as written.
const OPERATOR_SQL: &str = "CREATE TABLE items (id int PRIMARY KEY, qty int NOT NULL);";

/// Issue 41's attacker: the same table, with a trigger that sets every quantity to 0.
const EVIL_SQL: &str = "CREATE TABLE items (id int PRIMARY KEY, qty int NOT NULL);
CREATE FUNCTION zero() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN NEW.qty := 0; RETURN NEW; END $$;
CREATE TRIGGER zero BEFORE INSERT OR UPDATE ON items FOR EACH ROW EXECUTE FUNCTION zero();";

/// Writes the operator's and the attacker's SQL files; returns their paths.
fn schema_files(name: &str) -> (String, String) {
    let dir = scratch_dir(name);
    let operator = dir.join("app.sql");
    let evil = dir.join("evil.sql");
    std::fs::write(&operator, OPERATOR_SQL).expect("write app.sql");
    std::fs::write(&evil, EVIL_SQL).expect("write evil.sql");
    (operator.display().to_string(), evil.display().to_string())
}

/// Leases `template`, stores a quantity of 5 in its clone and reads it back: 5 with the
/// operator's schema, 0 with the attacker's trigger. Also answers how many triggers the
/// clone has. The lease is released.
async fn stored_quantity(daemon: &TestDaemon, template: &str) -> (i32, i64) {
    let lease = daemon.lease_ok(template).await;
    let client = connect(&lease).await.expect("connect to the clone");
    client
        .execute("INSERT INTO items VALUES (1, 5)", &[])
        .await
        .expect("insert");
    let qty: i32 = client
        .query_one("SELECT qty FROM items WHERE id = 1", &[])
        .await
        .expect("select")
        .get(0);
    let triggers: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_trigger WHERE NOT tgisinternal",
            &[],
        )
        .await
        .expect("count triggers")
        .get(0);
    drop(client);
    let (status, body) = daemon.release(&crate::support::id_of(&lease), false).await;
    assert_eq!(status, 204, "{body}");
    (qty, triggers)
}

/// Issue 41, row 5: without a token anybody on loopback is a caller, and nobody may change
/// a template the command line defined — not replace it (`PUT`, even with its own source),
/// rebuild it, delete it, nor touch it through the IntegreSQL API — so every later lease
/// still has the operator's schema. A template registered over HTTP stays anybody's.
#[tokio::test]
async fn without_a_token_nobody_changes_a_configured_template() {
    let (operator, evil) = schema_files("configured-no-token");
    let daemon = TestDaemon::builder()
        .args(["--template", &format!("app=sql:{operator}")])
        .start()
        .await;
    assert_eq!(stored_quantity(&daemon, "app").await, (5, 0));

    for source in [&evil, &operator] {
        let (status, body) = daemon.put_template("app", json!({ "sql": source })).await;
        assert_eq!(status, 403, "PUT {source}: {body}");
        assert_eq!(body["error"]["code"], "template_is_configured", "{body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("configuration") && message.contains("token"),
            "{message}"
        );
    }
    let (status, body) = daemon
        .send(
            daemon
                .http
                .post(format!("{}/templates/app/rebuild", daemon.base)),
        )
        .await;
    assert_eq!(status, 403, "rebuild: {body}");
    assert_eq!(body["error"]["code"], "template_is_configured", "{body}");
    // No route deletes a template; the IntegreSQL API's discard, reset and initialize act
    // on client-built templates only.
    let (status, body) = daemon
        .send(daemon.http.delete(format!("{}/templates/app", daemon.base)))
        .await;
    assert_eq!(status, 405, "DELETE /templates/app: {body}");
    for (request, expected) in [
        (
            daemon
                .http
                .delete(format!("{}/api/v1/templates/app", daemon.base)),
            409,
        ),
        (
            daemon
                .http
                .put(format!("{}/api/v1/templates/app", daemon.base)),
            409,
        ),
        (
            daemon
                .http
                .post(format!("{}/api/v1/templates", daemon.base))
                .json(&json!({"hash": "app"})),
            423,
        ),
        (
            daemon
                .http
                .delete(format!("{}/api/v1/admin/templates", daemon.base)),
            204,
        ),
    ] {
        let (status, body) = daemon.send(request).await;
        assert_eq!(status, expected, "{body}");
    }
    let app = daemon.template_status("app").await;
    assert_eq!(app["version"], 1, "no new version was built: {app}");
    assert_eq!(
        stored_quantity(&daemon, "app").await,
        (5, 0),
        "the operator's schema, without the attacker's trigger"
    );

    // A template registered over HTTP is anybody's to replace.
    let (status, body) = daemon
        .put_template("adhoc", json!({ "sql": operator }))
        .await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = daemon.put_template("adhoc", json!({ "sql": evil })).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(stored_quantity(&daemon, "adhoc").await, (0, 1));
}

/// With a token, its holders may change a configured template; a caller without it is 401.
#[tokio::test]
async fn with_a_token_its_holders_change_a_configured_template() {
    let (operator, evil) = schema_files("configured-token");
    let daemon = TestDaemon::builder()
        .token("s3cret-token")
        .args(["--template", &format!("app=sql:{operator}")])
        .start()
        .await;
    let (status, _) = daemon
        .send(
            reqwest::Client::new()
                .put(format!("{}/templates/app", daemon.base))
                .json(&json!({ "sql": evil })),
        )
        .await;
    assert_eq!(status, 401);
    assert_eq!(stored_quantity(&daemon, "app").await, (5, 0));

    // `daemon.http` sends the token.
    let (status, body) = daemon.put_template("app", json!({ "sql": evil })).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(stored_quantity(&daemon, "app").await, (0, 1));
    let (status, body) = daemon
        .send(
            daemon
                .http
                .post(format!("{}/templates/app/rebuild", daemon.base)),
        )
        .await;
    assert_eq!(status, 202, "{body}");
}

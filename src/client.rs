//! Client commands: `lease`, `release`, `renew`, `status`, `kept`, `ready`, `run`. They talk to
//! a running daemon over HTTP and print what a shell script needs (tables for a person on a
//! terminal: `tables.rs`); they never touch postgres.

mod tables;

use std::process::ExitCode;
use std::time::Duration;

use pglease_api::wire::{
    ErrorBody, KeptResponse, LeaseBody, LeaseResponse, ReadyResponse, ReleaseQuery, RenewBody,
    RenewResponse, StatusResponse,
};
use reqwest::StatusCode;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::cli::{
    ClientArgs, KeptArgs, LeaseArgs, ReadyArgs, ReleaseArgs, RenewArgs, RunArgs, StatusArgs,
};

/// A failed client command: a message for stderr.
pub struct ClientError(pub String);

type Result<T> = std::result::Result<T, ClientError>;

#[derive(Clone)]
struct Client {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
}

/// An answer as it came: its status and its body, not yet read as JSON.
struct Answer {
    status: StatusCode,
    body: String,
}

impl Client {
    fn new(args: &ClientArgs) -> Result<Self> {
        let http = reqwest::Client::builder()
            .build()
            .map_err(|e| ClientError(format!("cannot build an HTTP client: {e}")))?;
        Ok(Client {
            http,
            base: args.server.trim_end_matches('/').to_owned(),
            token: args.token.clone(),
        })
    }

    /// Sends a request and reads the body of a 2xx answer as `T` (the API's wire type of
    /// that answer); an error status, or a body that is not a `T`, is an error.
    async fn call<T: DeserializeOwned>(&self, request: reqwest::RequestBuilder) -> Result<T> {
        let answer = self.succeeded(request).await?;
        self.read(&answer)
    }

    /// Sends a request whose 2xx answer carries nothing to read (204 No Content).
    async fn call_for_nothing(&self, request: reqwest::RequestBuilder) -> Result<()> {
        self.succeeded(request).await.map(|_| ())
    }

    /// Sends a request; an answer with an error status becomes an error naming the status
    /// and the daemon's message.
    async fn succeeded(&self, request: reqwest::RequestBuilder) -> Result<Answer> {
        let answer = self.send(request).await?;
        if answer.status.is_success() {
            return Ok(answer);
        }
        Err(ClientError(refused(
            answer.status,
            &error_message(&answer.body),
        )))
    }

    /// Sends a request and returns any answer, whatever its status.
    async fn send(&self, request: reqwest::RequestBuilder) -> Result<Answer> {
        let request = match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        };
        let response = request.send().await.map_err(|e| {
            if e.is_connect() {
                ClientError(format!(
                    "no pglease daemon answers at {}: start one with `pglease serve`, or point --server / PGLEASE_URL at it",
                    self.base
                ))
            } else {
                ClientError(format!("request to {} failed: {e}", self.base))
            }
        })?;
        let status = response.status();
        let body = response
            .text()
            .await
            .map_err(|e| ClientError(format!("reading the answer from {}: {e}", self.base)))?;
        Ok(Answer { status, body })
    }

    /// The body of `answer` as `T`, or an error that says what came instead (something
    /// else listening at --server, a proxy's page, a daemon of another version).
    fn read<T: DeserializeOwned>(&self, answer: &Answer) -> Result<T> {
        serde_json::from_str(&answer.body).map_err(|e| {
            ClientError(format!(
                "unexpected answer from {} ({}): {e}; it read: {}",
                self.base,
                answer.status,
                shown(&answer.body)
            ))
        })
    }

    async fn lease(&self, template: &str, options: LeaseOptions<'_>) -> Result<LeaseResponse> {
        let body = lease_body(template, options);
        self.call(self.http.post(format!("{}/lease", self.base)).json(&body))
            .await
    }

    async fn release(&self, id: &str, ending: Ending) -> Result<()> {
        let url = format!("{}/leases/{id}", self.base);
        self.call_for_nothing(self.http.delete(url).query(&ending.query()))
            .await
    }

    async fn renew(&self, id: &str, ttl: Option<u64>) -> Result<RenewResponse> {
        let body = RenewBody { ttl_secs: ttl };
        self.call(
            self.http
                .post(format!("{}/leases/{id}/renew", self.base))
                .json(&body),
        )
        .await
    }
}

/// The `POST /lease` body: the template, and of the options those given.
fn lease_body(template: &str, options: LeaseOptions<'_>) -> LeaseBody {
    LeaseBody {
        template: Some(template.to_owned()),
        ttl_secs: options.ttl,
        wait_ms: options.wait_ms,
        postgres_version: options.postgres_version.map(|v| v.to_string()),
        label: options.label.map(str::to_owned),
        ..LeaseBody::default()
    }
}

/// The daemon's own message in an error answer (`{"error": {"code", "message"}}`); an
/// answer of another shape (a proxy's page) as it came, cut short; empty for none (the
/// status then says it all).
fn error_message(body: &str) -> String {
    match serde_json::from_str::<ErrorBody>(body) {
        Ok(error) => error.error.message,
        Err(_) => excerpt(body),
    }
}

/// At most the first 200 characters of a body, for an error message (empty for none).
fn excerpt(body: &str) -> String {
    const MAX: usize = 200;
    let body = body.trim();
    if body.chars().count() <= MAX {
        return body.to_owned();
    }
    let kept: String = body.chars().take(MAX).collect();
    format!("{kept}…")
}

/// A body that should have been something else, as an error message shows it.
fn shown(body: &str) -> String {
    match excerpt(body) {
        body if body.is_empty() => "nothing".to_owned(),
        body => body,
    }
}

/// A wire type as this command has always printed it: compact JSON with its keys sorted
/// (through `serde_json::Value`, whose maps are sorted).
fn printable(value: &impl Serialize) -> Result<String> {
    serde_json::to_value(value)
        .map(|value| value.to_string())
        .map_err(|e| ClientError(format!("cannot print the answer as JSON: {e}")))
}

/// `pglease lease`: prints the URL, or the whole lease with --json.
pub async fn lease(args: LeaseArgs) -> Result<()> {
    let client = Client::new(&args.client)?;
    let lease = client
        .lease(
            &args.template,
            LeaseOptions {
                ttl: args.ttl,
                wait_ms: args.wait_ms,
                postgres_version: args.postgres_version,
                label: args.label.as_deref(),
            },
        )
        .await?;
    if args.json {
        println!("{}", printable(&lease)?);
    } else {
        println!("{}", lease.url);
        eprintln!(
            "lease {}; release it with: pglease release {}",
            lease.id, lease.id
        );
    }
    Ok(())
}

/// `pglease release`.
pub async fn release(args: ReleaseArgs) -> Result<()> {
    let ending = match (args.keep, args.reuse) {
        (Some(secs), _) => Ending::Keep(secs),
        (None, true) => Ending::Reuse,
        (None, false) => Ending::Drop,
    };
    Client::new(&args.client)?.release(&args.id, ending).await?;
    if let Some(secs) = args.keep {
        eprintln!(
            "database kept for up to {secs} s: it opens with the lease's URL (`pglease kept` lists it, with its URL where the daemon has a token)"
        );
    }
    Ok(())
}

/// How a lease ends.
#[derive(Debug, Clone, Copy)]
enum Ending {
    /// Dropped and replaced.
    Drop,
    /// Unchanged: recycled as is.
    Reuse,
    /// Kept as it is for this many seconds, to look at.
    Keep(u64),
}

impl Ending {
    /// The `DELETE /leases/{id}` query that asks for it.
    fn query(self) -> ReleaseQuery {
        match self {
            Ending::Drop => ReleaseQuery {
                reuse: Some(false),
                keep: None,
            },
            Ending::Reuse => ReleaseQuery {
                reuse: Some(true),
                keep: None,
            },
            Ending::Keep(secs) => ReleaseQuery {
                reuse: None,
                keep: Some(secs),
            },
        }
    }
}

/// `pglease renew`: prints the new expiry.
pub async fn renew(args: RenewArgs) -> Result<()> {
    let answer = Client::new(&args.client)?.renew(&args.id, args.ttl).await?;
    println!("{}", answer.expires_at);
    Ok(())
}

/// `pglease ready`: asks `/readyz` every 100 ms until it answers 200 or `--timeout` is up;
/// a daemon not listening yet, or answering 503 while postgres starts and templates build,
/// is asked again. A configured template that cannot be built (`failed_templates`) ends
/// it at once with the daemon's reason: waiting would not mend it.
pub async fn ready(args: ReadyArgs) -> Result<()> {
    let client = Client::new(&args.client)?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(args.timeout);
    loop {
        let request = client
            .http
            .get(format!("{}/readyz", client.base))
            // A daemon that accepts but does not answer must not outlast the deadline.
            .timeout(
                deadline
                    .saturating_duration_since(tokio::time::Instant::now())
                    .max(Duration::from_millis(200)),
            );
        let not_yet = match client.send(request).await {
            Ok(answer) if answer.status.is_success() => return Ok(()),
            Ok(answer) => {
                // The daemon's readiness; another answer (a proxy's page) says no more
                // than itself, and cannot say that a template failed.
                let (reason, failed) = match serde_json::from_str::<ReadyResponse>(&answer.body) {
                    Ok(ready) => (
                        ready.reason.unwrap_or_else(|| "no reason given".into()),
                        !ready.failed_templates.is_empty(),
                    ),
                    Err(_) => (shown(&answer.body), false),
                };
                if failed {
                    return Err(ClientError(format!(
                        "pglease at {} is not ready: {reason}",
                        client.base
                    )));
                }
                format!("it answers {}: {reason}", answer.status)
            }
            Err(ClientError(message)) => message,
        };
        if tokio::time::Instant::now() >= deadline {
            return Err(ClientError(format!(
                "pglease at {} is not ready after {} s: {not_yet}",
                client.base, args.timeout
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `pglease status`: a table on a terminal, JSON when piped or with --json. The JSON is
/// the daemon's as it came (every field, pretty); the tables read it as the API's
/// `StatusResponse`.
pub async fn status(args: StatusArgs) -> Result<()> {
    let client = Client::new(&args.client)?;
    let answer = client
        .succeeded(client.http.get(format!("{}/status", client.base)))
        .await?;
    if args.json || !std::io::IsTerminal::is_terminal(&std::io::stdout()) {
        let status: serde_json::Value = client.read(&answer)?;
        let pretty = serde_json::to_string_pretty(&status)
            .map_err(|e| ClientError(format!("cannot print the status as JSON: {e}")))?;
        println!("{pretty}");
    } else {
        let status: StatusResponse = client.read(&answer)?;
        print!("{}", tables::status(&status));
    }
    Ok(())
}

/// `pglease kept`: the databases kept after failed tests, with their URLs; `--drop ID`
/// drops one now.
pub async fn kept(args: KeptArgs) -> Result<()> {
    let client = Client::new(&args.client)?;
    if let Some(id) = &args.drop {
        client
            .call_for_nothing(client.http.delete(format!("{}/kept/{id}", client.base)))
            .await?;
        eprintln!("kept database {id} dropped");
        return Ok(());
    }
    let kept: KeptResponse = client
        .call(client.http.get(format!("{}/kept", client.base)))
        .await?;
    if args.json {
        println!("{}", printable(&kept)?);
    } else {
        print!("{}", tables::kept(&kept));
    }
    Ok(())
}

/// How long a command may take to exit after a passed-on SIGTERM/SIGINT before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// Bounds on the renewals and the final release, so a daemon that hangs cannot hold
/// `pglease run` after its command has exited.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the lease is renewed while the command runs.
const RENEW_EVERY: Duration = Duration::from_secs(60);

/// `pglease run`: lease, run the command with the database in its environment, release,
/// and exit with the command's status (128+N when signal N killed it, as shells report it).
/// The lease is renewed while the command runs. SIGTERM and SIGINT are passed on to the
/// command, which is SIGKILLed if it has not exited `STOP_GRACE` later; the lease is
/// released in every case.
pub async fn run(args: RunArgs) -> Result<ExitCode> {
    let client = Client::new(&args.client)?;
    let Some((program, rest)) = args.command.split_first() else {
        return Err(ClientError("no command given after --".into()));
    };
    // Installed before leasing: from here on these signals cannot kill us between taking
    // the lease and releasing it.
    let mut signals = crate::signal::ShutdownSignal::install()
        .map_err(|e| ClientError(format!("cannot install signal handlers: {e}")))?;
    let lease = tokio::select! {
        lease = client.lease(&args.template, LeaseOptions {
            postgres_version: args.postgres_version,
            label: args.label.as_deref(),
            ..LeaseOptions::default()
        }) => lease?,
        // Dropping the request is enough: the daemon hands back a database whose requester
        // has gone.
        signal = signals.next() => return Ok(exit_code(128 + signal as i32)),
    };
    let id = lease.id.clone();
    let mut command = tokio::process::Command::new(program);
    command
        .args(rest)
        .env("DATABASE_URL", &lease.url)
        .env("PGHOST", &lease.host)
        .env("PGPORT", lease.port.to_string())
        .env("PGUSER", &lease.user)
        .env("PGPASSWORD", &lease.password)
        .env("PGDATABASE", &lease.database);
    let outcome = match command.spawn() {
        Ok(child) => {
            let renewer = tokio::spawn(keep_renewing(client.clone(), id.clone()));
            let status = supervise(child, program, &mut signals).await;
            renewer.abort();
            status
        }
        Err(e) => Err(format!("cannot run {program}: {e}")),
    };
    let failed = !matches!(&outcome, Ok(status) if status.success());
    let ending = match args.keep_on_failure {
        Some(secs) if failed => Ending::Keep(secs),
        _ => Ending::Drop,
    };
    match tokio::time::timeout(REQUEST_TIMEOUT, client.release(&id, ending)).await {
        Ok(Ok(())) => {
            if let Ending::Keep(secs) = ending {
                eprintln!(
                    "pglease: the command failed; its database is kept for up to {secs} s: {}",
                    lease.url
                );
            }
        }
        Ok(Err(ClientError(message))) => {
            eprintln!("pglease: could not release lease {id}: {message}");
        }
        Err(_) => eprintln!(
            "pglease: could not release lease {id}: no answer within {} s; it ends at its expiry",
            REQUEST_TIMEOUT.as_secs()
        ),
    }
    let status = outcome.map_err(ClientError)?;
    let code = match (
        status.code(),
        std::os::unix::process::ExitStatusExt::signal(&status),
    ) {
        (Some(code), _) => code,
        (None, Some(signal)) => 128 + signal,
        (None, None) => 1,
    };
    Ok(exit_code(code))
}

/// Waits for the command, passing SIGTERM and SIGINT on to it, and SIGKILLs it when it is
/// still running `STOP_GRACE` after the first of them. Only the command is signalled, not
/// its process group: it shares ours (so it can use the terminal), and a group signal would
/// reach `pglease run` itself and whatever else runs in that group (`pglease run … | tee`).
async fn supervise(
    mut child: tokio::process::Child,
    program: &str,
    signals: &mut crate::signal::ShutdownSignal,
) -> std::result::Result<std::process::ExitStatus, String> {
    // The pid stays ours until `wait` below has reaped the child, so it cannot be reused.
    let pid = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(nix::unistd::Pid::from_raw);
    let mut kill_at: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            status = child.wait() => return status.map_err(|e| format!("waiting for {program}: {e}")),
            signal = signals.next() => {
                let Some(pid) = pid else { continue };
                if signal == nix::sys::signal::Signal::SIGINT
                    && crate::signal::terminal_already_interrupted(pid)
                {
                    // Ctrl-C: the command has it already and decides for itself (psql, for
                    // one, only cancels its query).
                    continue;
                }
                // A command that exited but is not reaped yet takes the signal harmlessly.
                let _ = nix::sys::signal::kill(pid, signal);
                kill_at.get_or_insert_with(|| tokio::time::Instant::now() + STOP_GRACE);
            }
            () = tokio::time::sleep_until(kill_at.unwrap_or_else(tokio::time::Instant::now)), if kill_at.is_some() => {
                eprintln!(
                    "pglease: {program} is still running {} s after the signal; killing it",
                    STOP_GRACE.as_secs()
                );
                kill_at = None;
                let _ = child.start_kill();
            }
        }
    }
}

/// Renews the lease every `RENEW_EVERY` until aborted.
async fn keep_renewing(client: Client, id: String) {
    let mut renew = tokio::time::interval(RENEW_EVERY);
    // The first tick is immediate, and the lease is fresh.
    renew.tick().await;
    loop {
        renew.tick().await;
        match tokio::time::timeout(REQUEST_TIMEOUT, client.renew(&id, None)).await {
            Ok(Ok(_)) => {}
            Ok(Err(ClientError(message))) => {
                eprintln!("pglease: could not renew lease {id}: {message}");
            }
            Err(_) => eprintln!(
                "pglease: could not renew lease {id}: no answer within {} s",
                REQUEST_TIMEOUT.as_secs()
            ),
        }
    }
}

/// An exit code from a status number; numbers beyond 255 become 1.
fn exit_code(code: i32) -> ExitCode {
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

/// A request the daemon answered with an error status, in words: who said no, the status,
/// and the daemon's own message (`the daemon refused the request (422 Unprocessable
/// Entity): …`), which main prefixes with `pglease: `.
fn refused(status: reqwest::StatusCode, message: &str) -> String {
    let what = if status.is_server_error() {
        "the daemon could not carry out the request"
    } else {
        "the daemon refused the request"
    };
    if message.is_empty() {
        format!("{what} ({status})")
    } else {
        format!("{what} ({status}): {message}")
    }
}

/// The optional fields of a `POST /lease` body.
#[derive(Debug, Default)]
struct LeaseOptions<'a> {
    ttl: Option<u64>,
    wait_ms: Option<u64>,
    postgres_version: Option<pglease_binaries::VersionSpec>,
    label: Option<&'a str>,
}

#[cfg(test)]
mod tests;

//! A small client of the daemon's HTTP API: lease, release, status. It times nothing
//! itself (callers time the calls they measure) and knows only the fields the benchmark
//! reads; unknown fields in answers are ignored.

use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;

use crate::error::{BenchError, Result};

/// Ceiling on one HTTP call: longer than the longest `wait_ms` the benchmark sends.
const HTTP_TIMEOUT: Duration = Duration::from_secs(700);

/// A granted lease, as `POST /lease` answers it.
#[derive(Debug, Clone, Deserialize)]
pub struct Lease {
    /// Lease id, for release.
    pub id: String,
    /// Database name.
    pub database: String,
    /// Host to connect to.
    pub host: String,
    /// Port to connect to.
    pub port: u16,
    /// Role to log in as.
    pub user: String,
    /// The role's password.
    pub password: String,
    /// A ready `postgres://` URL with the lease's credentials.
    pub url: String,
}

/// `GET /status`, the parts the benchmark reads.
#[derive(Debug, Clone, Deserialize)]
pub struct Status {
    /// The server.
    pub postgres: PostgresStatus,
    /// Each template.
    #[serde(default)]
    pub templates: Vec<TemplateStatus>,
    /// The limits requests meet (absent in older daemons).
    #[serde(default)]
    pub limits: Option<LimitStatus>,
}

/// The limits in `/status`.
#[derive(Debug, Clone, Deserialize)]
pub struct LimitStatus {
    /// IntegreSQL test databases recreated to make room.
    #[serde(default)]
    pub reclaimed: u64,
    /// Released databases proven unchanged (`--reuse-unchanged`).
    #[serde(default)]
    pub reused_unchanged: u64,
    /// Released databases the proof found changed.
    #[serde(default)]
    pub replaced_changed: u64,
}

/// The server in `/status`.
#[derive(Debug, Clone, Deserialize)]
pub struct PostgresStatus {
    /// `server_version`.
    pub version: Option<String>,
    /// The cluster's data directory; its parent is the instance directory.
    pub data_dir: Option<String>,
    /// Port.
    pub port: Option<u16>,
    /// Settings as the server reports them.
    #[serde(default)]
    pub settings: serde_json::Map<String, serde_json::Value>,
}

/// A template in `/status`.
#[derive(Debug, Clone, Deserialize)]
pub struct TemplateStatus {
    /// Name.
    pub name: String,
    /// idle, building, ready, failed, …
    #[serde(default)]
    pub state: Option<String>,
    /// How long the last build took.
    #[serde(default)]
    pub build_ms: Option<u64>,
    /// The current version's size.
    #[serde(default)]
    pub size_bytes: Option<i64>,
    /// The last build or clone error.
    #[serde(default)]
    pub last_error: Option<String>,
    /// Fingerprint of the built version.
    pub fingerprint: Option<String>,
    /// Ready clones.
    pub ready: usize,
    /// Leased clones.
    pub leased: usize,
    /// Clones being made.
    pub in_progress: usize,
    /// Requests waiting.
    pub waiting: usize,
}

impl Status {
    /// The named template's entry.
    pub fn template(&self, name: &str) -> Option<&TemplateStatus> {
        self.templates.iter().find(|t| t.name == name)
    }
}

/// What a lease request came back with, when the caller wants to tell failures apart.
#[derive(Debug)]
pub enum LeaseAnswer {
    /// 201: a database.
    Granted(Lease),
    /// Any other status, with the body (an `{"error": …}` object).
    Refused {
        /// The HTTP status.
        status: u16,
        /// The body.
        body: String,
    },
}

/// A client of one daemon.
#[derive(Debug, Clone)]
pub struct Api {
    http: reqwest::Client,
    base: String,
}

impl Api {
    /// A client of the daemon listening on `addr`. Keep-alive connections are reused, as a
    /// test harness would, so the figures are the daemon's latency, not TCP set-up.
    pub fn new(addr: SocketAddr) -> Result<Api> {
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(HTTP_TIMEOUT)
            .tcp_nodelay(true)
            .build()
            .map_err(|e| BenchError::http("cannot build the HTTP client", e))?;
        Ok(Api {
            http,
            base: format!("http://{addr}"),
        })
    }

    /// `POST /lease` and the raw outcome.
    pub async fn try_lease(&self, template: &str, wait_ms: u64) -> Result<LeaseAnswer> {
        let body = serde_json::json!({ "template": template, "wait_ms": wait_ms });
        let response = self
            .http
            .post(format!("{}/lease", self.base))
            .json(&body)
            .send()
            .await
            .map_err(|e| BenchError::http("POST /lease", e))?;
        let status = response.status().as_u16();
        if status == 201 {
            let lease = response
                .json::<Lease>()
                .await
                .map_err(|e| BenchError::http("POST /lease: reading the lease", e))?;
            Ok(LeaseAnswer::Granted(lease))
        } else {
            let body = response.text().await.unwrap_or_default();
            Ok(LeaseAnswer::Refused { status, body })
        }
    }

    /// `POST /lease`; anything but 201 is an error.
    pub async fn lease(&self, template: &str, wait_ms: u64) -> Result<Lease> {
        match self.try_lease(template, wait_ms).await? {
            LeaseAnswer::Granted(lease) => Ok(lease),
            LeaseAnswer::Refused { status, body } => Err(BenchError::Status {
                context: format!("POST /lease (template {template})"),
                status,
                body,
            }),
        }
    }

    /// `DELETE /leases/{id}?reuse=…`; anything but 204 is an error.
    pub async fn release(&self, id: &str, reuse: bool) -> Result<()> {
        let response = self
            .http
            .delete(format!("{}/leases/{id}?reuse={reuse}", self.base))
            .send()
            .await
            .map_err(|e| BenchError::http("DELETE /leases/{id}", e))?;
        let status = response.status().as_u16();
        if status == 204 {
            Ok(())
        } else {
            let body = response.text().await.unwrap_or_default();
            Err(BenchError::Status {
                context: format!("DELETE /leases/{id}?reuse={reuse}"),
                status,
                body,
            })
        }
    }

    /// `GET /status`.
    pub async fn status(&self) -> Result<Status> {
        let response = self
            .http
            .get(format!("{}/status", self.base))
            .send()
            .await
            .map_err(|e| BenchError::http("GET /status", e))?;
        let status = response.status().as_u16();
        if status != 200 {
            let body = response.text().await.unwrap_or_default();
            return Err(BenchError::Status {
                context: "GET /status".into(),
                status,
                body,
            });
        }
        response
            .json::<Status>()
            .await
            .map_err(|e| BenchError::http("GET /status: reading the body", e))
    }
}

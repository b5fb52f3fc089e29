//! A small client of the daemon's HTTP API: lease, release, status. It times nothing
//! itself (callers time the calls they measure). The bodies are the API's own wire types
//! (`pglease_api::wire`), so the benchmark reads exactly what the daemon writes.

use std::net::SocketAddr;
use std::time::Duration;

use pglease_api::wire::{LeaseBody, LeaseResponse, StatusResponse, TemplateJson};

use crate::error::{BenchError, Result};

/// Ceiling on one HTTP call: longer than the longest `wait_ms` the benchmark sends.
const HTTP_TIMEOUT: Duration = Duration::from_secs(700);

/// The named template's entry in a `/status` answer.
pub fn template<'a>(status: &'a StatusResponse, name: &str) -> Option<&'a TemplateJson> {
    status.templates.iter().find(|t| t.name == name)
}

/// What a lease request came back with, when the caller wants to tell failures apart.
#[derive(Debug)]
pub enum LeaseAnswer {
    /// 201: a database (boxed: the answer is much larger than a refusal).
    Granted(Box<LeaseResponse>),
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
        let body = LeaseBody {
            template: Some(template.to_owned()),
            wait_ms: Some(wait_ms),
            ..LeaseBody::default()
        };
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
                .json::<LeaseResponse>()
                .await
                .map_err(|e| BenchError::http("POST /lease: reading the lease", e))?;
            Ok(LeaseAnswer::Granted(Box::new(lease)))
        } else {
            let body = response.text().await.unwrap_or_default();
            Ok(LeaseAnswer::Refused { status, body })
        }
    }

    /// `POST /lease`; anything but 201 is an error.
    pub async fn lease(&self, template: &str, wait_ms: u64) -> Result<LeaseResponse> {
        match self.try_lease(template, wait_ms).await? {
            LeaseAnswer::Granted(lease) => Ok(*lease),
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
    pub async fn status(&self) -> Result<StatusResponse> {
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
            .json::<StatusResponse>()
            .await
            .map_err(|e| BenchError::http("GET /status: reading the body", e))
    }
}

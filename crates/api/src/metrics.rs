//! `GET /metrics` in the OpenMetrics text format, with `prometheus-client`. Two kinds of
//! figures:
//! - what only the API sees, kept here for the daemon's life: lease requests by outcome
//!   with how long each took to answer, and releases;
//! - the pool's state and its event counts, read from the same report as `/status` at each
//!   scrape, so that no figure is kept twice;
//! - the PostgreSQL front's connections and keys, from its own report, likewise.
//!
//! It does not decide what a lease's outcome is: handlers report it.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use pglease_front::{FrontReport, Stage};
use pglease_pool::StatusReport;

/// The content type of the OpenMetrics text format.
pub(crate) const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    /// `granted`, or the error code the request got.
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReuseLabel {
    reuse: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TemplateLabel {
    template: String,
    /// The major of the server the template lives on (`default` is on every server).
    postgres: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DatabaseLabel {
    template: String,
    postgres: String,
    /// `ready`, `leased` or `making`.
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StageLabel {
    /// `starting`, `leasing` or `relaying`.
    stage: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LimitLabel {
    limit: &'static str,
}

/// Lease answers from 1 ms to about 65 s, doubling.
fn wait_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// The API's own figures (cheap to clone: the families share their values).
#[derive(Debug, Clone)]
pub(crate) struct Metrics {
    lease_wait: Family<OutcomeLabel, Histogram>,
    releases: Family<ReuseLabel, Counter>,
}

impl Metrics {
    pub(crate) fn new() -> Self {
        Metrics {
            lease_wait: Family::new_with_constructor(wait_histogram),
            releases: Family::default(),
        }
    }

    /// A `POST /lease` was answered, with a database or with error `code`.
    pub(crate) fn lease_answered(&self, outcome: &str, took: Duration) {
        self.lease_wait
            .get_or_create(&OutcomeLabel {
                outcome: outcome.to_owned(),
            })
            .observe(took.as_secs_f64());
    }

    /// A lease was released.
    pub(crate) fn released(&self, reuse: bool) {
        self.releases
            .get_or_create(&ReuseLabel {
                reuse: reuse.to_string(),
            })
            .inc();
    }

    /// Everything, in the OpenMetrics text format, with the pool's figures from `report`.
    pub(crate) fn render(
        &self,
        report: &StatusReport,
        front: Option<&FrontReport>,
    ) -> Result<String, std::fmt::Error> {
        let mut registry = Registry::with_prefix("pglease");
        registry.register(
            "lease_wait_seconds",
            "How long POST /lease took to answer, by outcome (granted, or the error code)",
            self.lease_wait.clone(),
        );
        registry.register(
            "releases",
            "Leases released, by whether the database was kept for reuse",
            self.releases.clone(),
        );
        register_pool(&mut registry, report);
        if let Some(front) = front {
            register_front(&mut registry, front);
        }
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry)?;
        Ok(text)
    }
}

/// The pool's figures from one status report: gauges set, and counters standing at the
/// totals the pool keeps.
///
/// Long on purpose: it is the table of every metric the pool exports, each registered
/// next to the figure it reads; split, the table would be harder to check against
/// `docs/`.
fn register_pool(registry: &mut Registry, report: &StatusReport) {
    let databases = Family::<DatabaseLabel, Gauge>::default();
    let waiting = Family::<TemplateLabel, Gauge>::default();
    let size = Family::<TemplateLabel, Gauge>::default();
    for template in &report.templates {
        let name = template.name.to_string();
        let postgres = template
            .postgres_version
            .as_deref()
            .and_then(pglease_pool::parse_version_number)
            .map_or_else(String::new, |(major, _)| major.to_string());
        for (state, count) in [
            ("ready", template.ready),
            ("leased", template.leased),
            ("making", template.in_progress),
        ] {
            databases
                .get_or_create(&DatabaseLabel {
                    template: name.clone(),
                    postgres: postgres.clone(),
                    state,
                })
                .set(gauge_value(count as u64));
        }
        let label = TemplateLabel {
            template: name,
            postgres,
        };
        waiting
            .get_or_create(&label)
            .set(gauge_value(template.waiting as u64));
        if let Some(bytes) = template.size_bytes {
            size.get_or_create(&label).set(bytes);
        }
    }
    registry.register(
        "databases",
        "Clone databases by template and state",
        databases,
    );
    registry.register("waiting_requests", "Lease requests waiting", waiting);
    registry.register(
        "template_size_bytes",
        "Size of each template's current version",
        size,
    );
    let refused = Family::<LimitLabel, Counter>::default();
    let totals = &report.limits.refused;
    for (limit, count) in [
        ("connection_budget", totals.connection_budget),
        ("max_total", totals.max_total),
        ("byte_budget", totals.byte_budget),
        ("max_waiting", totals.max_waiting),
        ("making", totals.making),
    ] {
        refused.get_or_create(&LimitLabel { limit }).inc_by(count);
    }
    registry.register(
        "refused",
        "Lease requests refused or timed out, by the limit that stopped them",
        refused,
    );
    let counter = |total: u64| {
        let counter = Counter::<u64>::default();
        counter.inc_by(total);
        counter
    };
    registry.register(
        "leases_expired",
        "Leases ended by their time to live",
        counter(report.limits.expired),
    );
    registry.register(
        "leases_exceeded_max_bytes",
        "Leases ended because their database grew past --lease-max-bytes",
        counter(report.limits.exceeded_max_bytes),
    );
    registry.register(
        "releases_reused_unchanged",
        "Released databases the server proved unchanged, put back without a new clone",
        counter(report.limits.reused_unchanged),
    );
    registry.register(
        "releases_replaced_changed",
        "Released databases the proof found changed, dropped and made again",
        counter(report.limits.replaced_changed),
    );
    registry.register(
        "releases_replaced_unstamped",
        "Released databases made without a stamp (their template's tests all wrote lately), dropped and made again unproven",
        counter(report.limits.replaced_unstamped),
    );
    registry.register(
        "leases_reclaimed",
        "IntegreSQL test databases ended to make room for a waiting request",
        counter(report.limits.reclaimed),
    );
    registry.register(
        "postgres_restarts",
        "Times postgres was brought back after it went away",
        counter(u64::from(report.postgres.restarts)),
    );
    let gauge = |value: u64| {
        let gauge = Gauge::<i64>::default();
        gauge.set(gauge_value(value));
        gauge
    };
    registry.register(
        "postgres_up",
        "1 while postgres is running",
        gauge(u64::from(report.postgres.state == "running")),
    );
    registry.register(
        "connections_in_use",
        "Connections the open leases may hold (their limits, summed)",
        gauge(u64::from(report.limits.connections_in_use)),
    );
    registry.register(
        "connection_budget",
        "Connections postgres has for lease holders in all",
        gauge(u64::from(report.limits.connection_budget)),
    );
    registry.register(
        "drops_pending",
        "Databases waiting to be dropped",
        gauge(report.drops.pending as u64),
    );
    registry.register(
        "drops_failing",
        "Databases whose drop failed and is retried with back-off (/status says why)",
        gauge(report.drops.failed as u64),
    );
    // Every server's, where the report has several.
    let kept = match report.servers.as_slice() {
        [] => report.limits.kept,
        servers => servers.iter().map(|s| s.limits.kept).sum(),
    };
    registry.register(
        "kept_databases",
        "Databases kept after failed tests (DELETE /leases/{id}?keep=SECS)",
        gauge(kept as u64),
    );
}

/// The PostgreSQL front's figures, from its report at this scrape.
fn register_front(registry: &mut Registry, front: &FrontReport) {
    let connections = Family::<StageLabel, Gauge>::default();
    for stage in Stage::ALL {
        let count = front
            .connections
            .iter()
            .filter(|c| c.stage == stage)
            .count();
        connections
            .get_or_create(&StageLabel {
                stage: stage.name(),
            })
            .set(gauge_value(count as u64));
    }
    registry.register(
        "front_connections",
        "Connections open at the PostgreSQL front, by stage (starting, leasing, relaying)",
        connections,
    );
    let accepted = Counter::<u64>::default();
    accepted.inc_by(front.accepted);
    registry.register(
        "front_connections_accepted",
        "Connections the PostgreSQL front accepted since the start",
        accepted,
    );
    let keys = Gauge::<i64>::default();
    keys.set(gauge_value(front.keys.len() as u64));
    registry.register(
        "front_keys",
        "Leases shared by key at the PostgreSQL front (database <template>.<key>)",
        keys,
    );
}

fn gauge_value(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

//! The router over fake pools (`crate::testing`): start failures, and registrations racing
//! each other. No postgres: each fake plays one pool.

use std::collections::HashSet;

use tokio::sync::oneshot;

use super::registry::Slot;
use super::*;
use crate::config::{CloneStrategy, EmbeddedConfig, LeaseAuth, PoolLimits};
use crate::testing::{fake_pool, FakeActor, FakeCommand};
use crate::types::{DropStatus, LimitStatus, PostgresStatus};

fn name(text: &str) -> TemplateName {
    TemplateName::new(text).expect("a valid template name")
}

fn base_config() -> PoolConfig {
    let limits = PoolLimits::default();
    PoolConfig {
        server: ServerConfig::Embedded(Box::new(EmbeddedConfig::for_limits(&limits, 1))),
        templates: Vec::new(),
        limits,
        clone_strategy: CloneStrategy::default(),
        prebuild: false,
        lease_auth: LeaseAuth::default(),
        lease_superuser: false,
        verify_templates: false,
        majors_on_request: false,
        child_user: None,
        integresql_role: None,
    }
}

/// A router whose primary is PostgreSQL 15 on `primary`, with the further servers
/// `further` already running and the templates `placed` on them.
fn servers_with(
    primary: PoolHandle,
    further: Vec<(u32, PoolHandle)>,
    placed: &[(&str, u32)],
) -> Servers {
    let slots = further
        .into_iter()
        .map(|(major, handle)| {
            let server = Server {
                major,
                version: format!("{major}.1"),
                handle,
            };
            (major, Slot::Running(server))
        })
        .collect();
    let placed = placed
        .iter()
        .map(|(template, major)| (name(template), *major))
        .collect();
    Servers::new(Inner {
        primary: Server {
            major: 15,
            version: "15.4".into(),
            handle: primary,
        },
        base: Some(base_config()),
        registry: Mutex::new(Registry {
            slots,
            placed,
            ..Registry::default()
        }),
        configured_majors: [15, 16, 17].into_iter().collect(),
        child_user: None,
    })
}

fn lease_request(template: &str) -> LeaseRequest {
    LeaseRequest {
        template: name(template),
        ttl: None,
        wait: Duration::from_secs(5),
        connections: None,
        reclaimable: false,
        postgres_version: None,
        label: None,
    }
}

fn template_status(name: TemplateName) -> TemplateStatus {
    TemplateStatus {
        name,
        fingerprint: None,
        version: 0,
        build_ms: None,
        size_bytes: None,
        built_at: None,
        state: "idle",
        ready: 0,
        leased: 0,
        in_progress: 0,
        waiting: 0,
        blocked_by: None,
        last_error: None,
        unwatched: false,
        postgres_version: None,
        progress: None,
    }
}

fn report(version: &str, templates: &HashSet<TemplateName>) -> StatusReport {
    StatusReport {
        postgres: PostgresStatus {
            storage: None,
            state: "running",
            external: false,
            version: Some(version.into()),
            pid: None,
            data_dir: None,
            host: None,
            port: None,
            settings: Vec::new(),
            restarts: 0,
            last_error: None,
            admin_timeouts: 0,
            databases_space: None,
        },
        templates: templates.iter().cloned().map(template_status).collect(),
        leases: Vec::new(),
        drops: DropStatus::default(),
        limits: LimitStatus::default(),
        servers: Vec::new(),
    }
}

#[tokio::test]
async fn a_failed_start_answers_with_its_cause() {
    let (primary, _primary_actor) = fake_pool();
    let servers = servers_with(primary, Vec::new(), &[]);
    servers.inner.registry.lock().await.slots.insert(
        16,
        Slot::Failed {
            at: Instant::now(),
            error: Arc::new(StartError::StoppedDuringStart),
        },
    );
    let mut request = lease_request("default");
    request.postgres_version = Some(VersionSpec::Major(16));
    let error = servers.lease(request).await.expect_err("not started");
    assert!(
        matches!(&error, LeaseError::ServerStart { major: 16, source }
            if matches!(**source, StartError::StoppedDuringStart)),
        "{error:?}"
    );
    assert_eq!(
        error.to_string(),
        "postgres is unavailable: the PostgreSQL 16 server cannot start: \
         the pool stopped during start-up"
    );
}

/// Plays a pool that registers whatever it is asked to and then lists it in its status.
/// A status request is held until a second one comes (or 200 ms pass): two registrations
/// that both look at the primary before either acts are then both in flight at once, as
/// they were before registrations took turns. Returns the templates it registered.
async fn play_pool(version: &'static str, mut actor: FakeActor) -> Vec<TemplateName> {
    let mut registered: Vec<TemplateName> = Vec::new();
    let mut held: Vec<oneshot::Sender<StatusReport>> = Vec::new();
    let answer = |held: &mut Vec<oneshot::Sender<StatusReport>>, registered: &[TemplateName]| {
        let known: HashSet<TemplateName> = registered.iter().cloned().collect();
        for reply in held.drain(..) {
            let _ = reply.send(report(version, &known));
        }
    };
    loop {
        let next = if held.is_empty() {
            actor.recv().await
        } else {
            match tokio::time::timeout(Duration::from_millis(200), actor.recv()).await {
                Ok(next) => next,
                Err(_) => {
                    answer(&mut held, &registered);
                    continue;
                }
            }
        };
        let Some(command) = next else {
            return registered;
        };
        match command {
            FakeCommand::Status { reply } => {
                held.push(reply);
                if held.len() == 2 {
                    answer(&mut held, &registered);
                }
            }
            FakeCommand::Register { name, reply, .. } => {
                registered.push(name.clone());
                let _ = reply.send(Ok((Registered::Created, template_status(name))));
            }
            other => panic!("unexpected command {other:?}"),
        }
    }
}

/// Two registrations of one name, run together against pools that keep both in flight;
/// returns both outcomes and what each pool registered (primary, 16, 17).
async fn race(
    first: Option<VersionSpec>,
    second: Option<VersionSpec>,
) -> (
    [Result<(Registered, TemplateStatus), LeaseError>; 2],
    [Vec<TemplateName>; 3],
) {
    let (primary, primary_actor) = fake_pool();
    let (pg16, actor16) = fake_pool();
    let (pg17, actor17) = fake_pool();
    let pools = tokio::spawn(async move {
        tokio::join!(
            play_pool("15.4", primary_actor),
            play_pool("16.1", actor16),
            play_pool("17.1", actor17)
        )
    });
    let servers = servers_with(primary, vec![(16, pg16), (17, pg17)], &[]);
    let (a, b) = tokio::join!(
        servers.register(name("app"), TemplateSource::Empty, first),
        servers.register(name("app"), TemplateSource::Empty, second),
    );
    drop(servers);
    let (on_primary, on_16, on_17) = pools.await.expect("the fakes");
    ([a, b], [on_primary, on_16, on_17])
}

/// Exactly one of two outcomes is a registration, the other a 409.
fn one_wins(outcomes: &[Result<(Registered, TemplateStatus), LeaseError>; 2]) {
    let wins = outcomes.iter().filter(|r| r.is_ok()).count();
    assert_eq!(wins, 1, "{outcomes:?}");
    assert!(
        outcomes
            .iter()
            .any(|r| matches!(r, Err(LeaseError::OnOtherServer { .. }))),
        "{outcomes:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn two_registrations_of_one_name_for_two_majors_place_it_once() {
    let (outcomes, registered) =
        race(Some(VersionSpec::Major(16)), Some(VersionSpec::Major(17))).await;
    one_wins(&outcomes);
    let pools_with_app = registered.iter().filter(|names| !names.is_empty()).count();
    assert_eq!(pools_with_app, 1, "{registered:?}");
}

#[tokio::test(start_paused = true)]
async fn a_registration_for_the_primary_and_one_for_another_major_place_it_once() {
    let (outcomes, registered) = race(None, Some(VersionSpec::Major(16))).await;
    one_wins(&outcomes);
    assert_eq!(registered[0], [name("app")], "{registered:?}");
    assert!(registered[1].is_empty(), "{registered:?}");
}

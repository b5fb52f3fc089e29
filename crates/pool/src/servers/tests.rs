//! The router over fake pools (`crate::testing`): routing by lease id, unknown ids, start
//! failures, and registrations racing each other. No postgres: each fake plays one pool.

use std::collections::HashSet;

use tokio::sync::oneshot;

use super::registry::Slot;
use super::*;
use crate::testing::{fake_pool, FakeActor, FakeCommand};
use crate::types::{ConnectInfo, DropStatus, LeaseSummary, LimitStatus, PostgresStatus};

/// An id the primary minted (first byte zero).
const ON_PRIMARY: &str = "00112233445566778899aabbccddeeff";
/// An id the PostgreSQL 16 server's pool minted (first byte 16).
const ON_16: &str = "10112233445566778899aabbccddeeff";

/// How long a test waits for a fake to be asked before it fails instead of hanging.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);

fn id(text: &str) -> LeaseId {
    LeaseId::parse(text).expect("a valid lease id")
}

fn name(text: &str) -> TemplateName {
    TemplateName::new(text).expect("a valid template name")
}

fn base_config() -> PoolConfig {
    PoolConfig::embedded_for_tests()
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
                stamp: ids::stamp_of(major).expect("a major that fits a byte"),
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
            stamp: ids::PRIMARY,
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

/// The next command `actor` gets.
async fn next(actor: &mut FakeActor) -> FakeCommand {
    tokio::time::timeout(COMMAND_TIMEOUT, actor.recv())
        .await
        .expect("no command in time")
        .expect("every handle was dropped")
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

fn connect() -> ConnectInfo {
    ConnectInfo {
        host: "127.0.0.1".into(),
        port: 54321,
        user: "pglease_user".into(),
        password: "pw".into(),
        database: crate::names::DbName::from_server("pglease_abc_1".into()),
        ssl: false,
    }
}

fn expiry() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000)
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
async fn a_lease_of_a_further_server_carries_its_stamp_and_goes_back_there_alone() {
    let (primary, mut primary_actor) = fake_pool();
    let (pg16, mut actor16) = fake_pool();
    let servers = servers_with(primary, vec![(16, pg16)], &[("app", 16)]);

    let granting = async {
        match next(&mut actor16).await {
            FakeCommand::Lease { request, reply } => {
                assert_eq!(request.template, name("app"));
                let lease = Lease {
                    id: id(ON_16),
                    template: request.template,
                    fingerprint: "f00d".repeat(16),
                    connect: connect(),
                    expires_at: expiry(),
                    number: 0,
                    local_socket: None,
                };
                let _ = reply.send(Ok(lease));
            }
            other => panic!("expected a lease, got {other:?}"),
        }
    };
    let (lease, ()) = tokio::join!(servers.lease(lease_request("app")), granting);
    let lease = lease.expect("leased");
    assert_eq!(lease.id, id(ON_16), "the client's id names the 16 server");

    // Release, renew, keep and drop: each reaches the 16 pool alone.
    let answering = async {
        for _ in 0..4 {
            match next(&mut actor16).await {
                FakeCommand::Release { id: got, reply, .. } => {
                    assert_eq!(got, id(ON_16));
                    let _ = reply.send(Ok(()));
                }
                FakeCommand::Renew { id: got, reply, .. } => {
                    assert_eq!(got, id(ON_16));
                    let _ = reply.send(Ok(expiry()));
                }
                FakeCommand::Keep { id: got, reply, .. } => {
                    assert_eq!(got, id(ON_16));
                    let _ = reply.send(Ok(expiry()));
                }
                FakeCommand::DropKept { id: got, reply } => {
                    assert_eq!(got, id(ON_16));
                    let _ = reply.send(Ok(()));
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    };
    let asking = async {
        servers.renew(id(ON_16), None).await.expect("renewed");
        servers
            .keep(id(ON_16), Duration::from_secs(60))
            .await
            .expect("kept");
        servers.drop_kept(id(ON_16)).await.expect("dropped");
        servers.release(id(ON_16), false).await.expect("released");
    };
    tokio::join!(asking, answering);
    assert!(primary_actor.try_recv().is_none(), "the primary was asked");
}

#[tokio::test]
async fn a_primary_id_goes_to_the_primary_alone_as_it_is() {
    let (primary, mut primary_actor) = fake_pool();
    let (pg16, mut actor16) = fake_pool();
    let servers = servers_with(primary, vec![(16, pg16)], &[]);
    let answering = async {
        match next(&mut primary_actor).await {
            FakeCommand::Release {
                id: got,
                reuse,
                reply,
            } => {
                assert_eq!(got, id(ON_PRIMARY));
                assert!(reuse);
                let _ = reply.send(Ok(()));
            }
            other => panic!("unexpected {other:?}"),
        }
    };
    let (released, ()) = tokio::join!(servers.release(id(ON_PRIMARY), true), answering);
    released.expect("released");
    assert!(actor16.try_recv().is_none(), "the 16 server was asked");
}

#[tokio::test]
async fn unknown_and_lost_ids_are_answered_with_the_id_the_client_sent() {
    let (primary, mut primary_actor) = fake_pool();
    let (pg16, mut actor16) = fake_pool();
    let servers = servers_with(primary, vec![(16, pg16)], &[]);

    // The 16 pool knows no such lease: 404 naming the client's id.
    let answering = async {
        match next(&mut actor16).await {
            FakeCommand::Renew { id: got, reply, .. } => {
                let _ = reply.send(Err(LeaseOpError::NotFound(got.to_string())));
            }
            other => panic!("unexpected {other:?}"),
        }
    };
    let (renewed, ()) = tokio::join!(servers.renew(id(ON_16), None), answering);
    match renewed {
        Err(LeaseOpError::NotFound(text)) => assert_eq!(text, ON_16),
        other => panic!("expected not found, got {other:?}"),
    }

    // Lost with its server: 410, naming the client's id.
    let answering = async {
        match next(&mut actor16).await {
            FakeCommand::Release { id: got, reply, .. } => {
                let _ = reply.send(Err(LeaseOpError::Lost(got.to_string())));
            }
            other => panic!("unexpected {other:?}"),
        }
    };
    let (released, ()) = tokio::join!(servers.release(id(ON_16), false), answering);
    let error = released.expect_err("lost");
    assert!(matches!(&error, LeaseOpError::Lost(text) if text == ON_16));
    assert!(error.to_string().contains(ON_16), "{error}");

    // An id stamped for a server that does not run (17) is the primary's to answer, as
    // any id it does not know.
    let on_17 = "11112233445566778899aabbccddeeff";
    let answering = async {
        match next(&mut primary_actor).await {
            FakeCommand::DropKept { id: got, reply } => {
                assert_eq!(got, id(on_17));
                let _ = reply.send(Err(LeaseOpError::NotKept(got.to_string())));
            }
            other => panic!("unexpected {other:?}"),
        }
    };
    let (dropped, ()) = tokio::join!(servers.drop_kept(id(on_17)), answering);
    assert!(matches!(dropped, Err(LeaseOpError::NotKept(text)) if text == on_17));
    assert!(actor16.try_recv().is_none(), "the 16 server was asked");
}

#[tokio::test]
async fn kept_databases_and_status_gather_every_servers() {
    let (primary, mut primary_actor) = fake_pool();
    let (pg16, mut actor16) = fake_pool();
    let servers = servers_with(primary, vec![(16, pg16)], &[]);
    let kept = |lease: &str| KeptDatabase {
        id: id(lease),
        template: TemplateName::default_name(),
        connect: connect(),
        label: None,
        kept_at: expiry(),
        expires_at: expiry(),
        size_bytes: 0,
    };
    let answering = async {
        match next(&mut primary_actor).await {
            FakeCommand::Kept { reply } => {
                let _ = reply.send(vec![kept("00aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa")]);
            }
            other => panic!("unexpected {other:?}"),
        }
        match next(&mut actor16).await {
            FakeCommand::Kept { reply } => {
                let _ = reply.send(vec![kept(ON_16)]);
            }
            other => panic!("unexpected {other:?}"),
        }
    };
    let (listed, ()) = tokio::join!(servers.kept(), answering);
    let ids: Vec<&str> = listed.iter().map(|k| k.id.as_str()).collect();
    assert_eq!(ids, ["00aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", ON_16]);

    let answering = async {
        match next(&mut primary_actor).await {
            FakeCommand::Status { reply } => {
                let _ = reply.send(report("15.4", &HashSet::new()));
            }
            other => panic!("unexpected {other:?}"),
        }
        match next(&mut actor16).await {
            FakeCommand::Status { reply } => {
                let mut report = report("16.1", &HashSet::new());
                report.leases.push(LeaseSummary {
                    id: id(ON_16),
                    template: TemplateName::default_name(),
                    database: crate::names::DbName::from_server("pglease_abc_1".into()),
                    expires_at: expiry(),
                    label: None,
                });
                let _ = reply.send(report);
            }
            other => panic!("unexpected {other:?}"),
        }
    };
    let (status, ()) = tokio::join!(servers.status(), answering);
    let status = status.expect("a report");
    let ids: Vec<&str> = status.leases.iter().map(|l| l.id.as_str()).collect();
    assert_eq!(ids, [ON_16]);
    assert_eq!(status.servers.len(), 2);
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
        servers.register(name("app"), TemplateSource::Empty, first, Changer::Anyone),
        servers.register(name("app"), TemplateSource::Empty, second, Changer::Anyone),
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

/// Plays a pool whose actor is stuck: it takes every command and answers none, keeping the
/// reply senders (a dropped one would tell the caller the pool went away).
async fn play_stuck_pool(mut actor: FakeActor) {
    let mut held = Vec::new();
    while let Some(command) = actor.recv().await {
        held.push(command);
    }
}

#[tokio::test(start_paused = true)]
async fn a_pool_that_never_answers_a_registration_fails_it_and_frees_the_registry() {
    let (primary, primary_actor) = fake_pool();
    let (pg16, actor16) = fake_pool();
    let primary_plays = tokio::spawn(play_pool("15.4", primary_actor));
    let stuck = tokio::spawn(play_stuck_pool(actor16));
    let servers = servers_with(primary, vec![(16, pg16)], &[]);

    let started = Instant::now();
    let registering = servers.register(
        name("app"),
        TemplateSource::Empty,
        Some(VersionSpec::Major(16)),
        Changer::Anyone,
    );
    // Time is paused: a registration that waited for ever would end only at this guard.
    let error = tokio::time::timeout(Duration::from_secs(3600), registering)
        .await
        .expect("the registration hung on a pool that never answers")
        .expect_err("nothing answered it");
    let waited = started.elapsed();
    assert!(
        matches!(&error, LeaseError::PostgresDown(message)
            if message.contains("PostgreSQL 16") && message.contains("did not answer")),
        "{error:?}"
    );
    assert!(
        waited >= POOL_ANSWER_WAIT && waited < POOL_ANSWER_WAIT + Duration::from_secs(1),
        "waited {waited:?}"
    );
    assert!(
        servers.inner.registry.try_lock().is_ok(),
        "the registry lock is free again"
    );
    // Whether the stuck pool registered it is unknown: the template stays placed there, so
    // that a retry goes to the same server instead of splitting it over two.
    assert_eq!(servers.placement(&name("app")).await, Some(16));

    // The next registration is not held up by the stuck pool.
    let (registered, status) = tokio::time::timeout(
        Duration::from_secs(5),
        servers.register(name("other"), TemplateSource::Empty, None, Changer::Anyone),
    )
    .await
    .expect("a registration after the stuck one hung")
    .expect("registered on the primary");
    assert_eq!(registered, Registered::Created);
    assert_eq!(status.postgres_version.as_deref(), Some("15.4"));

    drop(servers);
    assert_eq!(primary_plays.await.expect("the primary"), [name("other")]);
    stuck.await.expect("the stuck pool");
}

#[tokio::test(start_paused = true)]
async fn a_primary_that_never_answers_fails_a_registration_that_must_ask_it() {
    let (primary, primary_actor) = fake_pool();
    let (pg16, actor16) = fake_pool();
    let stuck = tokio::spawn(play_stuck_pool(primary_actor));
    let pool16 = tokio::spawn(play_pool("16.1", actor16));
    let servers = servers_with(primary, vec![(16, pg16)], &[]);
    // A template placed nowhere yet that asks for 16 is first looked for on the primary.
    let error = tokio::time::timeout(
        Duration::from_secs(3600),
        servers.register(
            name("app"),
            TemplateSource::Empty,
            Some(VersionSpec::Major(16)),
            Changer::Anyone,
        ),
    )
    .await
    .expect("the registration hung on a primary that never answers")
    .expect_err("the primary did not say whether it has the template");
    assert!(
        matches!(&error, LeaseError::PostgresDown(message)
            if message.contains("PostgreSQL 15") && message.contains("did not answer")),
        "{error:?}"
    );
    assert_eq!(
        servers.placement(&name("app")).await,
        None,
        "nothing placed"
    );
    drop(servers);
    assert!(
        pool16.await.expect("the 16 pool").is_empty(),
        "16 never asked"
    );
    stuck.await.expect("the stuck primary");
}

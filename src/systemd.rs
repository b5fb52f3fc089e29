//! systemd integration for `Type=notify` units: READY=1 once postgres is up and the
//! default template is built (not waiting on configured templates, unlike `/readyz`: a
//! broken migration must not fail the unit's start), STOPPING=1 when shutdown begins, and watchdog pings for as
//! long as the pool actor answers. Everything is a no-op when systemd did not start us
//! (no `NOTIFY_SOCKET`).

use std::time::Duration;

use pglease_pool::PoolHandle;
use sd_notify::NotifyState;

/// How often readiness is polled before READY=1.
const READY_POLL: Duration = Duration::from_millis(50);

/// Sends READY=1 when the pool is ready, then keeps the watchdog fed if one is set.
pub fn spawn(pool: PoolHandle) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    tokio::spawn(async move {
        loop {
            let readiness = pool.readiness().await;
            if readiness.is_serving() {
                break;
            }
            tokio::time::sleep(READY_POLL).await;
        }
        if let Err(error) = sd_notify::notify(false, &[NotifyState::Ready]) {
            tracing::warn!(%error, "could not tell systemd we are ready");
            return;
        }
        tracing::info!("told systemd we are ready");
        let Some(usec) = watchdog_usec() else {
            return;
        };
        // Ping at half the interval, and only while the actor answers: a wedged pool stops
        // the pings and systemd restarts us.
        let period = Duration::from_micros(usec / 2);
        loop {
            tokio::time::sleep(period).await;
            if tokio::time::timeout(period, pool.readiness()).await.is_ok() {
                let _ = sd_notify::notify(false, &[NotifyState::Watchdog]);
            }
        }
    });
}

/// The watchdog interval, as libsystemd's `sd_watchdog_enabled` reads it: `WATCHDOG_USEC`,
/// unless `WATCHDOG_PID` names another process.
fn watchdog_usec() -> Option<u64> {
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
    let for_us = std::env::var("WATCHDOG_PID")
        .ok()
        .and_then(|pid| pid.parse::<u32>().ok())
        .is_none_or(|pid| pid == std::process::id());
    (usec > 0 && for_us).then_some(usec)
}

/// Tells systemd that shutdown has begun.
pub fn stopping() {
    if std::env::var_os("NOTIFY_SOCKET").is_some() {
        let _ = sd_notify::notify(false, &[NotifyState::Stopping]);
    }
}

//! idem through a PostgreSQL failover: a primary with a synchronous standby
//! (`.ci/start-pg-standby`, run by the test itself since a failover uses the pair up).
//! The store connects through a TCP forwarder standing for the address a service
//! reaches its database at (a virtual IP, a proxy, a DNS name); the failover crashes
//! the primary mid-storm, promotes the standby and points that address at it.
//!
//! What it shows: every call that got `Ok` has its `SUCCESS` record, with the same
//! answer, on the new primary; every call that got an error could be retried, and was;
//! no body that finished ran again for its key.

use idem_testkit::conformance;
use idem_testkit::harness;
#[path = "../../tests/support/ci.rs"]
mod ci;

use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use harness::failover::Storm;
use idem::Idempotent;

const KEYS: usize = 1500;
const TASKS: usize = 8;

/// `.ci/start-pg-standby [command]`; what it printed.
fn pair(command: &str) -> String {
    let args: &[&str] = if command.is_empty() { &[] } else { &[command] };
    ci::ci_script("start-pg-standby", args)
}

fn port_of(exports: &str, var: &str) -> u16 {
    harness::url_port(exports.lines().find(|line| line.contains(var)).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_storm_through_a_failover_loses_no_answer_and_runs_nothing_twice() {
    // The PostgreSQL binaries that run the suite run the pair.
    if conformance::server_url("IDEM_TEST_POSTGRES_URL", "PostgreSQL").is_none() {
        return;
    }
    let exports = tokio::task::spawn_blocking(|| pair("")).await.unwrap();
    let (primary, standby) = (
        port_of(&exports, "IDEM_PG_PRIMARY_URL"),
        port_of(&exports, "IDEM_PG_STANDBY_URL"),
    );
    let target = Arc::new(AtomicU16::new(primary));
    let address = harness::forwarder(target.clone()).await;
    let url = format!("postgres://postgres@127.0.0.1:{address}/postgres");
    let store = harness::postgres_store_across_restarts(&url).await;
    let started = Instant::now();
    // Each task on a handle of its own: the callers of a key claim at the server.
    let (storm, tasks) = Storm::start_apart(&store, TASKS, KEYS, |handle| {
        Idempotent::new("failover").store(handle).lease(Duration::from_secs(6))
    });

    // Mid-storm: the standby stops receiving, then the primary crashes: what the
    // primary wrote in between never reaches the standby. With a synchronous standby
    // none of it was acknowledged; with an asynchronous one it would have been, and
    // lost. Then the standby is promoted and the address follows it.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    tokio::task::spawn_blocking(|| pair("pause-standby")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let done_before = storm.answered();
    tokio::task::spawn_blocking(|| pair("crash-primary")).await.unwrap();
    let crashed_at = started.elapsed();
    tokio::time::sleep(Duration::from_millis(300)).await;
    tokio::task::spawn_blocking(|| pair("promote-standby")).await.unwrap();
    target.store(standby, Ordering::SeqCst);
    let switched_at = started.elapsed();
    // A commit waiting for a standby that is gone would hang the storm: fail instead.
    Storm::join(tasks, Duration::from_secs(180)).await;
    let elapsed = started.elapsed();
    assert!(
        done_before > 0 && done_before < KEYS * TASKS,
        "the failover came mid-storm ({done_before} answers before it)"
    );
    // Every answer is recorded on the new primary, the address's server now.
    let in_recovery: bool = idem::sqlx::query_scalar("SELECT pg_is_in_recovery()")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert!(!in_recovery, "the store talks to the promoted standby");
    storm.check(TASKS, KEYS, "failover", &store).await;
    tokio::task::spawn_blocking(|| pair("stop")).await.unwrap();
    harness::say(&format!(
        "pg failover: {TASKS} tasks x {KEYS} keys in {elapsed:.1?}; primary crashed at {crashed_at:.1?} \
         ({done_before} answers before), standby promoted and addressed at {switched_at:.1?}; {} errors \
         retried; every answer SUCCESS on the new primary; every body finished once",
        storm.errors.load(Ordering::SeqCst)
    ));
}

//! idem through a PostgreSQL failover: a primary with a synchronous standby
//! (`.ci/start-pg-standby`, run by the test itself since a failover uses the pair up).
//! The store connects through a TCP forwarder standing for the address a service
//! reaches its database at (a virtual IP, a proxy, a DNS name); the failover crashes
//! the primary mid-storm, promotes the standby and points that address at it.
//!
//! What it shows: every call that got `Ok` has its `SUCCESS` record, with the same
//! answer, on the new primary; every call that got an error could be retried, and was;
//! no body that finished ran again for its key.

mod conformance;
mod harness;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem::{IdempotencyStore, Idempotent, PostgresStore};
use tokio::net::{TcpListener, TcpStream};

const KEYS: usize = 1500;
const TASKS: usize = 8;

/// The database's address: connections to it are forwarded to the port in `target`,
/// as a virtual IP or a proxy forwards them to the current primary.
async fn forwarder(target: Arc<AtomicU16>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((mut client, _)) = listener.accept().await else {
                continue;
            };
            let target = target.load(Ordering::SeqCst);
            tokio::spawn(async move {
                if let Ok(mut server) = TcpStream::connect(("127.0.0.1", target)).await {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                }
            });
        }
    });
    port
}

/// `.ci/start-pg-standby [command]`; what it printed.
fn pair(command: &str) -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/.ci/start-pg-standby");
    let output = std::process::Command::new("bash")
        .arg(script)
        .args((!command.is_empty()).then_some(command))
        .stderr(std::process::Stdio::inherit())
        .output()
        .unwrap();
    assert!(output.status.success(), "start-pg-standby {command}");
    String::from_utf8(output.stdout).unwrap()
}

fn port_of(exports: &str, var: &str) -> u16 {
    let line = exports.lines().find(|line| line.contains(var)).unwrap();
    line.rsplit(':')
        .next()
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .parse()
        .unwrap()
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
    let address = forwarder(target.clone()).await;
    let url = format!("postgres://postgres@127.0.0.1:{address}/postgres");
    let pool = idem::sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(Duration::from_secs(2))
        .connect(&url)
        .await
        .unwrap();
    let store = PostgresStore::new(pool);
    store.migrate().await.unwrap();
    let shared: Arc<dyn IdempotencyStore> = Arc::new(store.clone());
    let op = Arc::new(Idempotent::new("failover").store(shared).lease(Duration::from_secs(6)));

    // Bodies that finished, by key; answers callers got, by key.
    let finished: Arc<Mutex<HashMap<usize, Vec<String>>>> = Arc::default();
    let answers: Arc<Mutex<Vec<(usize, String)>>> = Arc::default();
    let errors = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let (op, finished, answers, errors) = (op.clone(), finished.clone(), answers.clone(), errors.clone());
            tokio::spawn(async move {
                for i in 0..KEYS {
                    // Two tasks start on each key at once, the others meet it later.
                    let k = (i + task / 2 * KEYS / (TASKS / 2)) % KEYS;
                    let token = format!("{task}.{k}");
                    let since = Instant::now();
                    loop {
                        let finished = finished.clone();
                        let token = token.clone();
                        let outcome: Result<String, idem::Error> = op
                            .execute(&format!("k{k}"), async move {
                                tokio::time::sleep(Duration::from_millis(2)).await;
                                finished.lock().unwrap().entry(k).or_default().push(token.clone());
                                Ok(token)
                            })
                            .await;
                        match outcome {
                            Ok(answer) => {
                                answers.lock().unwrap().push((k, answer));
                                break;
                            }
                            Err(idem::Error::InProgress { .. }) => {}
                            Err(error) => {
                                errors.fetch_add(1, Ordering::SeqCst);
                                assert!(since.elapsed() < Duration::from_secs(60), "key {k}: {error}");
                            }
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            })
        })
        .collect();

    // Mid-storm: the standby stops receiving, then the primary crashes: what the
    // primary wrote in between never reaches the standby. With a synchronous standby
    // none of it was acknowledged; with an asynchronous one it would have been, and
    // lost. Then the standby is promoted and the address follows it.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    tokio::task::spawn_blocking(|| pair("pause-standby")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let done_before = answers.lock().unwrap().len();
    tokio::task::spawn_blocking(|| pair("crash-primary")).await.unwrap();
    let crashed_at = started.elapsed();
    tokio::time::sleep(Duration::from_millis(300)).await;
    tokio::task::spawn_blocking(|| pair("promote-standby")).await.unwrap();
    target.store(standby, Ordering::SeqCst);
    let switched_at = started.elapsed();
    // A commit waiting for a standby that is gone would hang the storm: fail instead.
    tokio::time::timeout(Duration::from_secs(180), async {
        for task in tasks {
            task.await.unwrap();
        }
    })
    .await
    .expect("the storm ended within 3 minutes");
    let elapsed = started.elapsed();

    let finished = finished.lock().unwrap().clone();
    let answers = answers.lock().unwrap().clone();
    assert!(
        done_before > 0 && done_before < KEYS * TASKS,
        "the failover came mid-storm ({done_before} answers before it)"
    );
    assert_eq!(answers.len(), KEYS * TASKS, "every call was answered in the end");
    for k in 0..KEYS {
        let runs = finished.get(&k).map(Vec::as_slice).unwrap_or_default();
        assert_eq!(
            runs.len(),
            1,
            "key {k}: the body finished {} times: {runs:?}",
            runs.len()
        );
    }
    for (k, answer) in &answers {
        assert_eq!(
            answer, &finished[k][0],
            "key {k}: a caller got another answer than the body's"
        );
    }
    // Every answer is recorded on the new primary, the address's server now.
    let in_recovery: bool = idem::sqlx::query_scalar("SELECT pg_is_in_recovery()")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert!(!in_recovery, "the store talks to the promoted standby");
    for k in 0..KEYS {
        let record = store
            .get("failover", &format!("k{k}"))
            .await
            .unwrap()
            .expect("record kept");
        assert_eq!(record.status, idem::Status::Succeeded, "key {k}");
        assert_eq!(
            record.response_body,
            Some(format!("\"{}\"", finished[&k][0])),
            "key {k}"
        );
    }
    tokio::task::spawn_blocking(|| pair("stop")).await.unwrap();
    harness::say(&format!(
        "pg failover: {TASKS} tasks x {KEYS} keys in {elapsed:.1?}; primary crashed at {crashed_at:.1?} \
         ({done_before} answers before), standby promoted and addressed at {switched_at:.1?}; {} errors \
         retried; every answer SUCCESS on the new primary; every body finished once",
        errors.load(Ordering::SeqCst)
    ));
}

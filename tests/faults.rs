//! The database server stopped and started again in the middle of a run: a real
//! server stop (`pg_ctl stop`, `mariadb-admin shutdown`) through `.ci/start-databases`.
//! While it is down, calls fail closed with `Error::Store` and no body runs; after it
//! is back, calls succeed and nothing recorded before is lost or run twice. The lease
//! is 60 s, so a body that finished while the server was down keeps trying to record
//! its result for 30 s — longer than any outage here, even on a loaded CI machine.

use idem_testkit::conformance;
use idem_testkit::harness;

use std::collections::HashMap;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use harness::{AppError, Effects};
use idem::{idempotent, IdempotencyStore};

type Store = Arc<dyn IdempotencyStore>;

/// Concurrent streams of calls during an outage.
const STREAMS: usize = 4;

#[idempotent(key = key, biz = "faults", store = store, lease = "60s", wait = "120s")]
async fn settle(
    store: &Store,
    effects: &Effects,
    run: &str,
    key: &str,
    entered: &AtomicBool,
) -> Result<String, AppError> {
    entered.store(true, Ordering::SeqCst);
    effects.record(run, key, key).await?;
    Ok(key.to_owned())
}

/// A body that finishes while the server is down: claimed before the stop, it returns
/// once `stopped` is set, so its `complete` meets the stopped server and is retried.
#[idempotent(key = key, biz = "faults", store = store, lease = "60s")]
async fn straddle(store: &Store, key: &str, stopped: &AtomicBool, runs: &AtomicUsize) -> Result<String, AppError> {
    runs.fetch_add(1, Ordering::SeqCst);
    while !stopped.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(format!("{key}-done"))
}

/// Stop or start one server with the project's script.
fn server(command: &str) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/.ci/start-databases");
    let status = Command::new("bash")
        .args([script, command])
        .status()
        .expect("run .ci/start-databases");
    assert!(status.success(), ".ci/start-databases {command} failed");
}

/// What one call came to.
#[derive(Debug)]
enum Outcome {
    Ok(String),
    /// Claim failed: the store was down before the body could start.
    RefusedAtClaim {
        body_ran: bool,
    },
    /// Anything else the outage can cause (the body's own write failing, a record that
    /// could not be written after the body).
    Failed(String),
}

fn outage(backend: &str, server_name: &str) {
    let Some(url) = harness::backend_url(backend, "faults") else {
        return;
    };
    let run = conformance::unique("fault");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (store, effects) = runtime.block_on(async {
        idem::sql::open(&url).await.unwrap(); // migrate
        let store: Store = match backend {
            "postgres" => Arc::new(idem::PostgresStore::new(
                idem::sqlx::postgres::PgPoolOptions::new()
                    .acquire_timeout(Duration::from_secs(1))
                    .connect_lazy(&url)
                    .unwrap(),
            )),
            _ => Arc::new(idem::MySqlStore::new(
                idem::sqlx::mysql::MySqlPoolOptions::new()
                    .acquire_timeout(Duration::from_secs(1))
                    .connect_lazy(&url)
                    .unwrap(),
            )),
        };
        (store, Effects::open_waiting(&url, Duration::from_secs(1)).await)
    });
    let keys: Vec<String> = (0..160).map(|k| format!("{run}-{k}")).collect();
    // Counts the store's answers (no fault is injected: the outage is the server's).
    let counted = conformance::faulty::FaultyStore::new(&store);
    let stopped = Arc::new(AtomicBool::new(false));
    let straddle_runs = Arc::new(AtomicUsize::new(0));
    let straddler = {
        let (store, key) = (counted.shared(), format!("{run}-straddle"));
        let (stopped, runs) = (stopped.clone(), straddle_runs.clone());
        runtime.spawn(async move { straddle(&store, &key, &stopped, &runs).await })
    };

    // Four steady streams of calls (so that one of them is always between bodies),
    // while the server goes down and comes back.
    let refusals = Arc::new(AtomicUsize::new(0));
    let streams: Vec<_> = keys
        .chunks(keys.len() / STREAMS)
        .enumerate()
        .map(|(stream, keys)| {
            let (store, effects, run, keys) = (store.clone(), effects.clone(), run.clone(), keys.to_vec());
            let refusals = refusals.clone();
            runtime.spawn(async move {
                tokio::time::sleep(Duration::from_millis(10 * stream as u64)).await;
                let mut outcomes = Vec::new();
                for key in keys {
                    let entered = AtomicBool::new(false);
                    let outcome = match settle(&store, &effects, &run, &key, &entered).await {
                        Ok(token) => Outcome::Ok(token),
                        Err(AppError::Idem(idem::Error::Store { operation: "claim", .. })) => {
                            refusals.fetch_add(1, Ordering::SeqCst);
                            Outcome::RefusedAtClaim {
                                body_ran: entered.load(Ordering::SeqCst),
                            }
                        }
                        Err(error) => Outcome::Failed(error.to_string()),
                    };
                    outcomes.push((key, outcome));
                    tokio::time::sleep(Duration::from_millis(150)).await;
                }
                outcomes
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    let down = Instant::now();
    server(&format!("stop-{server_name}"));
    stopped.store(true, Ordering::SeqCst);
    // Down for at least 2 s, and until a stream has met the stopped server — but never
    // near the 30 s a finished body keeps trying to record its result.
    std::thread::sleep(Duration::from_secs(2));
    let give_up = Instant::now() + Duration::from_secs(10);
    while refusals.load(Ordering::SeqCst) == 0 && Instant::now() < give_up {
        std::thread::sleep(Duration::from_millis(100));
    }
    server(&format!("start-{server_name}"));
    let downtime = down.elapsed();
    let outcomes: Vec<(String, Outcome)> = runtime.block_on(async {
        let mut all = Vec::new();
        for stream in streams {
            all.extend(stream.await.unwrap());
        }
        all
    });

    let straddled = runtime
        .block_on(straddler)
        .unwrap()
        .expect("recorded once the server was back");
    assert!(
        counted.errors(conformance::faulty::Op::Complete) >= 1 && counted.calls(conformance::faulty::Op::Complete) >= 2,
        "the finished body's complete met the stopped server and was retried ({} tries, {} failed)",
        counted.calls(conformance::faulty::Op::Complete),
        counted.errors(conformance::faulty::Op::Complete)
    );
    let replay = runtime.block_on(straddle(&store, &format!("{run}-straddle"), &stopped, &straddle_runs));
    assert_eq!(replay.unwrap(), straddled, "its result replays after the outage");
    assert_eq!(straddle_runs.load(Ordering::SeqCst), 1, "and its body ran once");

    let refused = outcomes
        .iter()
        .filter(|(_, o)| matches!(o, Outcome::RefusedAtClaim { .. }))
        .count();
    assert!(refused > 0, "some calls met the stopped server: {outcomes:?}");
    for (key, outcome) in &outcomes {
        if let Outcome::RefusedAtClaim { body_ran } = outcome {
            assert!(!body_ran, "{key}: the claim failed but the body ran (fail open)");
        }
    }
    let failed: Vec<&str> = outcomes
        .iter()
        .filter_map(|(_, o)| match o {
            Outcome::Failed(error) => Some(error.as_str()),
            _ => None,
        })
        .collect();

    // With the server back, every key once more: exactly one execution each, and every
    // result given before the outage replayed.
    let (replayed, rows) = runtime.block_on(async {
        let mut replayed = HashMap::new();
        for key in &keys {
            let token = settle(&store, &effects, &run, key, &AtomicBool::new(false))
                .await
                .expect("after the outage");
            replayed.insert(key.clone(), token);
        }
        (replayed, effects.tokens(&run).await)
    });
    let mut ambiguous = 0;
    for (key, outcome) in &outcomes {
        let ran = rows.get(key).map_or(0, Vec::len);
        match outcome {
            Outcome::Ok(token) => {
                assert_eq!(ran, 1, "{key}: answered Ok, then ran again ({ran} executions)");
                assert_eq!(
                    &replayed[key], token,
                    "{key}: the result given before the outage was lost"
                );
            }
            Outcome::RefusedAtClaim { .. } => assert_eq!(ran, 1, "{key}: refused at claim, then ran {ran} times"),
            // The body's own write was cut off by the stop: the server may or may not have
            // committed it, the caller got the body's error and `on_error = Release` lets
            // the retry run, as designed. Idem cannot know about a business write it does
            // not hold; one more execution than the business saw succeed is the limit.
            Outcome::Failed(error) => {
                assert!(
                    error.contains("business write failed"),
                    "{key}: idem itself failed: {error}"
                );
                assert!(
                    (1..=2).contains(&ran),
                    "{key}: ran {ran} times after a failed business write"
                );
                ambiguous += usize::from(ran == 2);
            }
        }
    }
    harness::say(&format!(
        "outage on {backend}: server down {downtime:.1?} during {} calls; {refused} refused at claim (no body ran), \
         {} failed otherwise {:?} ({ambiguous} of them had committed before the stop cut them off); a body that \
         finished during the outage recorded its result after {} tries of complete; afterwards every key answered \
         Ok or refused ran exactly once and every earlier result replayed ({} keys)",
        outcomes.len(),
        failed.len(),
        failed,
        counted.calls(conformance::faulty::Op::Complete),
        keys.len()
    ));
}

#[test]
fn postgres_stopped_and_restarted() {
    outage("postgres", "postgres");
}

#[test]
fn mariadb_stopped_and_restarted() {
    outage("mysql", "mariadb");
}

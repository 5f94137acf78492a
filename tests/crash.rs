//! A holder killed (SIGKILL) or paused (SIGSTOP past its lease) in the middle of the
//! body, as a real OS process, on every database.

use idem_testkit::conformance;
use idem_testkit::harness;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::Duration;

use harness::{AppError, Effects};
use idem::{idempotent, IdempotencyStore, Status};

type Store = Arc<dyn IdempotencyStore>;

/// The body: one business row, then `hang` (long enough to be killed or paused in).
#[idempotent(key = key, biz = "crash", store = store, lease = "2s", wait = "20s")]
async fn settle(
    store: &Store,
    effects: &Effects,
    run: &str,
    key: &str,
    token: String,
    hang: Duration,
) -> Result<String, AppError> {
    effects.record(run, key, &token).await?;
    if !hang.is_zero() {
        harness::report("BODY_STARTED");
        tokio::time::sleep(hang).await;
    }
    Ok(token)
}

/// The holder process: settles two keys, then hangs in the body of a third.
#[test]
fn holder_worker() {
    let Some(_) = harness::worker_settings("crash") else {
        return;
    };
    let (url, run, hang_ms) = (
        harness::setting("CRASH_URL"),
        harness::setting("CRASH_RUN"),
        harness::setting("CRASH_HANG_MS"),
    );
    harness::worker_runtime().block_on(async {
        let store = harness::open_store(&url).await;
        let effects = Effects::open(&url).await;
        for done in ["a", "b"] {
            let key = format!("{run}-{done}");
            let token = settle(&store, &effects, &run, &key, format!("holder-{done}"), Duration::ZERO)
                .await
                .unwrap();
            harness::report(&format!("DONE {done} {token}"));
        }
        let key = format!("{run}-c");
        let hang = Duration::from_millis(hang_ms.parse().unwrap());
        let outcome = settle(&store, &effects, &run, &key, "holder-c".into(), hang).await;
        harness::report(&match outcome {
            Ok(token) => format!("RESULT OK {token}"),
            Err(AppError::Idem(idem::Error::LeaseLost { fence, operation, .. })) => {
                format!("RESULT LEASE_LOST fence={fence} operation={operation}")
            }
            Err(error) => format!("RESULT ERR {error}"),
        });
    });
}

/// Start the holder and wait until it is inside the body of key `c`.
fn start_holder(url: &str, run: &str, hang: Duration) -> (Child, BufReader<std::process::ChildStdout>) {
    let settings = [
        ("CRASH_URL", url.to_owned()),
        ("CRASH_RUN", run.to_owned()),
        ("CRASH_HANG_MS", hang.as_millis().to_string()),
    ];
    let (child, out, _) = harness::start_worker("crash", "holder_worker", &settings, "BODY_STARTED");
    (child, out)
}

fn signal(child: &Child, name: &str) {
    let status = Command::new("kill")
        .args([name, &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill {name} failed");
}

fn crash_recovery(backend: &str) {
    let Some(url) = harness::backend_url(backend, "crash") else {
        return;
    };
    let run = conformance::unique("kill");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (store, effects) = runtime.block_on(async { (harness::open_store(&url).await, Effects::open(&url).await) });
    let (mut holder, _) = start_holder(&url, &run, Duration::from_secs(600));
    holder.kill().unwrap(); // SIGKILL
    holder.wait().unwrap();

    runtime.block_on(async {
        let key = |k: &str| format!("{run}-{k}");
        // Before the lease lapses: the dead holder's claim still stands.
        let settle_fast = idem::Idempotent::new("crash")
            .lease(Duration::from_secs(2))
            .store(store.clone());
        let early: Result<String, AppError> = settle_fast
            .execute(key("c"), async { Ok("must-not-run".to_owned()) })
            .await;
        assert!(
            matches!(early, Err(AppError::Idem(idem::Error::InProgress { .. }))),
            "{early:?}"
        );

        tokio::time::sleep(Duration::from_millis(2500)).await;
        // After it: eight retries race; one takes over and finishes, the others wait for it.
        let retries: Vec<_> = (0..8)
            .map(|i| {
                let (store, effects, run, key) = (store.clone(), effects.clone(), run.clone(), key("c"));
                tokio::spawn(
                    async move { settle(&store, &effects, &run, &key, format!("retry-{i}"), Duration::ZERO).await },
                )
            })
            .collect();
        let mut results = Vec::new();
        for retry in retries {
            results.push(retry.await.unwrap().unwrap());
        }
        assert!(results.iter().all(|token| token == &results[0]), "{results:?}");
        let record = store.get("crash", &key("c")).await.unwrap().unwrap();
        assert_eq!(
            (record.status, record.fence),
            (Status::Succeeded, conformance::first_fence(&record) + 1),
            "taken over once, with the next fence"
        );

        let rows = effects.tokens(&run).await;
        assert_eq!(
            rows[&key("c")].len(),
            2,
            "the killed body's row and one retry's: {:?}",
            rows[&key("c")]
        );
        // What the holder finished before it was killed is kept and replayed.
        for done in ["a", "b"] {
            let token = settle(&store, &effects, &run, &key(done), "late".into(), Duration::ZERO)
                .await
                .unwrap();
            assert_eq!(token, format!("holder-{done}"));
            assert_eq!(rows[&key(done)], vec![format!("holder-{done}")]);
        }
    });
    harness::say(&format!("crash on {backend}: SIGKILL mid-body; InProgress before the 2 s lease, one takeover of 8 racing retries after it, 2 settled records kept"));
}

fn pause_recovery(backend: &str) {
    let Some(url) = harness::backend_url(backend, "pause") else {
        return;
    };
    let run = conformance::unique("stop");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (store, effects) = runtime.block_on(async { (harness::open_store(&url).await, Effects::open(&url).await) });
    let (mut holder, mut out) = start_holder(&url, &run, Duration::from_secs(3));
    signal(&holder, "-STOP");
    std::thread::sleep(Duration::from_millis(3000)); // past the 2 s lease: no heartbeat in a stopped process
    let key = format!("{run}-c");
    let token = runtime
        .block_on(settle(
            &store,
            &effects,
            &run,
            &key,
            "new-holder".into(),
            Duration::ZERO,
        ))
        .unwrap();
    assert_eq!(token, "new-holder");
    let taken = runtime.block_on(store.get("crash", &key)).unwrap().unwrap();
    signal(&holder, "-CONT");

    let mut said = String::new();
    let mut line = String::new();
    while out.read_line(&mut line).unwrap() > 0 {
        said.push_str(&line);
        line.clear();
    }
    assert!(holder.wait().unwrap().success());
    assert!(
        said.contains(&format!(
            "RESULT LEASE_LOST fence={} operation=complete",
            conformance::first_fence(&taken)
        )),
        "the paused holder is told its completion was refused: {said}"
    );
    let after = runtime.block_on(store.get("crash", &key)).unwrap().unwrap();
    assert_eq!(after, taken, "the late completion changed nothing");
    assert_eq!(
        (after.fence, after.response_body.as_deref()),
        (conformance::first_fence(&after) + 1, Some("\"new-holder\""))
    );
    harness::say(&format!("pause on {backend}: SIGSTOP 3 s past a 2 s lease, taken over (the next fence); the holder's late completion was fenced"));
}

#[test]
fn kill_on_sqlite() {
    crash_recovery("sqlite");
}

#[test]
fn kill_on_postgres() {
    crash_recovery("postgres");
}

#[test]
fn kill_on_mysql() {
    crash_recovery("mysql");
}

#[test]
fn pause_on_sqlite() {
    pause_recovery("sqlite");
}

#[test]
fn pause_on_postgres() {
    pause_recovery("postgres");
}

#[test]
fn pause_on_mysql() {
    pause_recovery("mysql");
}

#[test]
fn kill_on_redis() {
    crash_recovery("redis");
}

#[test]
fn pause_on_redis() {
    pause_recovery("redis");
}

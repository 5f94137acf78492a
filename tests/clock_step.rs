//! A step of the host's wall clock while a body runs (an NTP step, a VM resumed from
//! suspend), in a real process whose clock libfaketime moves by a minute mid-body: on
//! `MemoryStore` (its steady clock) the duplicate that arrives after the step meets the
//! running claim; on SQLite, which every process of the host shares and which judges by
//! the host's wall clock, the step opens a window until the holder's next renewal, and
//! the test shows both its sides.

use idem_testkit::harness;

use std::io::{BufRead, BufReader};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use idem::{IdempotencyStore, Idempotent, LeaseClock, MemoryStore};

/// How far the clock is stepped forward mid-body.
const STEP_SECS: u64 = 60;

/// One holder and one duplicate in a process whose clock is stepped between them.
#[test]
fn step_worker() {
    let Some(_) = harness::worker_settings("step") else {
        return;
    };
    let millis = |name: &str| Duration::from_millis(harness::setting(name).parse().unwrap());
    let (lease, after) = (millis("STEP_LEASE_MS"), millis("STEP_AFTER_MS"));
    let (store, file) = (harness::setting("STEP_STORE"), harness::setting("STEP_FILE"));
    harness::worker_runtime().block_on(async {
        let store: Arc<dyn IdempotencyStore> = match store.as_str() {
            "memory" => Arc::new(MemoryStore::new()),
            "memory-judged-by-callers" => Arc::new(MemoryStore::new().with_lease_clock(LeaseClock::Caller)),
            url => idem::sql::open(url).await.unwrap(),
        };
        let op = Idempotent::new("step").store(store).lease(lease);
        let key = idem_testkit::conformance::unique("stepped");
        let runs = Arc::new(AtomicU32::new(0));
        // The holder works until the duplicate has been answered (10 s at most).
        let done = Arc::new(tokio::sync::Notify::new());
        let holder = tokio::spawn({
            let (op, key, runs, done) = (op.clone(), key.clone(), runs.clone(), done.clone());
            async move {
                op.execute(&key, async {
                    runs.fetch_add(1, Ordering::SeqCst);
                    let _ = tokio::time::timeout(Duration::from_secs(10), done.notified()).await;
                    Ok::<u32, idem::Error>(1)
                })
                .await
            }
        });
        tokio::time::sleep(Duration::from_millis(300)).await; // the holder has its claim
        let (wall, steady) = (SystemTime::now(), std::time::Instant::now());
        harness::set_clock(std::path::Path::new(&file), STEP_SECS as i64);
        // libfaketime reads the file again within a second or two: wait until the step
        // shows (the wall clock ahead of the monotonic one), then `after` more.
        let stepped_by = || {
            let wall = SystemTime::now().duration_since(wall).unwrap_or_default();
            wall.saturating_sub(steady.elapsed())
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while stepped_by() < Duration::from_secs(STEP_SECS - 5) && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let moved = stepped_by();
        tokio::time::sleep(after).await;
        let duplicate = op
            .execute(&key, async {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<u32, idem::Error>(2)
            })
            .await;
        done.notify_one();
        let first = holder.await.unwrap();
        let said = |answer: Result<u32, idem::Error>| match answer {
            Ok(value) => value.to_string(),
            Err(idem::Error::InProgress { .. }) => "in-progress".to_owned(),
            Err(idem::Error::LeaseLost { .. }) => "lease-lost".to_owned(),
            Err(other) => format!("error:{other}"),
        };
        harness::report(&format!(
            "RESULT moved={} runs={} duplicate={} holder={}",
            moved.as_secs(),
            runs.load(Ordering::SeqCst),
            said(duplicate),
            said(first)
        ));
    });
}

/// What a worker on `store` said, its clock stepped `STEP_SECS` forward 300 ms into a
/// body under `lease`, the duplicate calling `after` the step showed: (bodies run, the
/// duplicate's answer, the holder's).
fn stepped(libfaketime: &str, store: &str, lease: Duration, after: Duration) -> (u32, String, String) {
    // One clock file per worker: two tests starting in the same millisecond shared one
    // before, and one test's write stepped (or unstepped) the other's worker.
    static WORKERS: AtomicU32 = AtomicU32::new(0);
    let worker_number = WORKERS.fetch_add(1, Ordering::SeqCst);
    let file = idem_testkit::scratch::path(&format!("step-{}-{worker_number}", harness::epoch_millis()));
    harness::set_clock(&file, 0);
    let settings = [
        ("STEP_STORE", store.to_owned()),
        ("STEP_LEASE_MS", lease.as_millis().to_string()),
        ("STEP_AFTER_MS", after.as_millis().to_string()),
        ("STEP_FILE", file.display().to_string()),
    ];
    let mut worker = harness::worker("step", "step_worker", &settings);
    harness::stepped_by(&mut worker, libfaketime, &file);
    let mut child = worker.spawn().unwrap();
    let mut said = None;
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        if let Some(result) = line.unwrap().trim().strip_prefix("RESULT ").map(str::to_owned) {
            said = Some(result);
        }
    }
    assert!(child.wait().unwrap().success());
    let _ = std::fs::remove_file(&file);
    let said = said.expect("the worker answered");
    let field = |name: &str| {
        said.split_whitespace()
            .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
            .unwrap_or_else(|| panic!("{name} in {said}"))
            .to_owned()
    };
    let moved: u64 = field("moved").parse().unwrap();
    assert!(moved >= STEP_SECS - 5, "the worker's clock was stepped: {said}");
    (field("runs").parse().unwrap(), field("duplicate"), field("holder"))
}

#[test]
fn a_step_of_the_clock_mid_body_never_lets_a_duplicate_in_on_memory() {
    let Some(libfaketime) = harness::libfaketime() else {
        return;
    };
    let lease = Duration::from_secs(30);
    let after = Duration::from_millis(200);
    let (runs, duplicate, holder) = stepped(libfaketime, "memory", lease, after);
    assert_eq!(
        (runs, duplicate.as_str(), holder.as_str()),
        (1, "in-progress", "1"),
        "the steady clock kept the lease"
    );
    // The same store judging by its callers' instants (the step's) lets it in: the
    // fault the steady clock guards against is real.
    let (runs, duplicate, holder) = stepped(libfaketime, "memory-judged-by-callers", lease, after);
    assert_eq!(
        (runs, duplicate.as_str(), holder.as_str()),
        (2, "2", "lease-lost"),
        "judged by the stepped clock, the duplicate took the lease over"
    );
    harness::say(&format!(
        "clock step on memory: +{STEP_SECS} s mid-body, duplicate 0.2 s after it showed: in progress, 1 run \
         (judged by the callers' clock: taken over, 2 runs)"
    ));
}

#[test]
fn a_step_of_the_clock_on_sqlite_is_a_window_until_the_holders_next_renewal() {
    let Some(libfaketime) = harness::libfaketime() else {
        return;
    };
    let Some(url) = harness::backend_url("sqlite", "step") else {
        return;
    };
    // A 30 s lease renews every 10 s: a duplicate 0.2 s after the step comes before the
    // renewal that moves the lease with the clock, and takes it over.
    let (runs, duplicate, holder) = stepped(libfaketime, &url, Duration::from_secs(30), Duration::from_millis(200));
    assert_eq!(
        (runs, duplicate.as_str(), holder.as_str()),
        (2, "2", "lease-lost"),
        "inside the window: the bound docs/RELIABILITY.md states"
    );
    // A 3 s lease renews every second: 2 s after the step the holder has renewed on the
    // stepped clock, and the duplicate meets its lease.
    let (runs, duplicate, holder) = stepped(libfaketime, &url, Duration::from_secs(3), Duration::from_secs(2));
    assert_eq!(
        (runs, duplicate.as_str(), holder.as_str()),
        (1, "in-progress", "1"),
        "after the holder's renewal the window is closed"
    );
    harness::say(&format!(
        "clock step on sqlite: +{STEP_SECS} s mid-body; a duplicate before the holder's next renewal (lease 30 s) \
         took it over; after it (lease 3 s, 2 s later) met the lease"
    ));
}

//! A test of expiry that does not wait: idem's clock follows tokio's test clock, on the
//! memory store and on a SQLite file alike. Time is moved with pause → advance →
//! resume: while it stays paused, tokio jumps it to the next timer whenever the runtime
//! waits (on a database's I/O, for one), and a SQL pool's timers would move it by
//! minutes.

use std::sync::Arc;
use std::time::Duration;

use idem::{idempotent, IdempotencyStore, Idempotent};

const DAY: Duration = Duration::from_secs(24 * 3600);

#[idempotent(key = order, biz = "clock.pay", ttl = "24h", store = store)]
async fn pay(store: &Arc<dyn IdempotencyStore>, order: &str, charge: u32) -> Result<u32, idem::Error> {
    Ok(charge)
}

/// Move tokio's clock, and so idem's, `by` ahead, and let it run on from there.
async fn jump(by: Duration) {
    tokio::time::pause();
    tokio::time::advance(by).await;
    tokio::time::resume();
}

/// 23 hours later the first answer is replayed; 25 hours later the key runs again.
async fn expiry_without_sleeping(store: Arc<dyn IdempotencyStore>) {
    let order = format!("order-{}", std::process::id());
    let real = std::time::Instant::now();
    assert_eq!(pay(&store, &order, 1).await.unwrap(), 1);
    jump(DAY - Duration::from_secs(3600)).await;
    assert_eq!(pay(&store, &order, 2).await.unwrap(), 1, "within the ttl: replayed");
    jump(Duration::from_secs(2 * 3600)).await;
    assert_eq!(pay(&store, &order, 3).await.unwrap(), 3, "past the ttl: runs again");
    assert!(real.elapsed() < Duration::from_secs(60), "no day was waited");
}

#[tokio::test]
async fn expiry_on_the_memory_store_without_sleeping() {
    expiry_without_sleeping(Arc::new(idem::MemoryStore::new())).await;
}

/// A SQLite file of this test's own: a file left by an earlier process of the same id
/// would hold its records already. SQLite judges by the caller's instants.
async fn sqlite(test: &str) -> Arc<dyn IdempotencyStore> {
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let path = idem_testkit::scratch::path(&format!("clock-{test}-{run}.db"));
    idem::sql::open(&format!("sqlite://{}?mode=rwc", path.display()))
        .await
        .unwrap()
}

#[tokio::test]
async fn expiry_on_sqlite_without_sleeping() {
    expiry_without_sleeping(sqlite("expiry").await).await;
}

/// An outcome is recorded at the instant its body ended, on the test clock too: the ttl
/// counts from there, not from the claim. A body of 10 hours with a 24 h ttl is still
/// replayed 30 hours after its claim.
#[tokio::test]
async fn a_ttl_counts_from_the_end_of_a_long_body_on_sqlite() {
    let op = Idempotent::new("clock.long").store(sqlite("long").await).ttl(DAY);
    let first: u32 = op
        .execute("order", async {
            jump(Duration::from_secs(10 * 3600)).await;
            Ok::<_, idem::Error>(1)
        })
        .await
        .unwrap();
    jump(Duration::from_secs(20 * 3600)).await;
    let again: u32 = op.execute("order", async { Ok::<_, idem::Error>(2) }).await.unwrap();
    assert_eq!((first, again), (1, 1), "20 hours after a 10-hour body: replayed");
}

#[tokio::test(start_paused = true)]
async fn a_lease_lapses_on_the_test_clock() {
    let store: Arc<dyn IdempotencyStore> = Arc::new(idem::MemoryStore::new());
    let op = Idempotent::new("clock.lease")
        .store(store.clone())
        .lease(Duration::from_secs(30));
    let key = "k";
    // A holder that never finishes (dropped mid-body), then a retry once its lease and
    // the clock tolerance (as long again, by default) have passed.
    let hung = tokio::time::timeout(
        Duration::from_secs(1),
        op.execute(key, std::future::pending::<Result<u32, idem::Error>>()),
    )
    .await;
    assert!(hung.is_err());
    let early = op.execute(key, async { Ok::<u32, idem::Error>(2) }).await.unwrap_err();
    assert!(matches!(early, idem::Error::InProgress { .. }), "{early:?}");
    tokio::time::advance(Duration::from_secs(31)).await;
    let inside = op.execute(key, async { Ok::<u32, idem::Error>(2) }).await.unwrap_err();
    assert!(
        matches!(inside, idem::Error::InProgress { .. }),
        "within the tolerance: {inside:?}"
    );
    tokio::time::advance(Duration::from_secs(30)).await;
    assert_eq!(
        op.execute(key, async { Ok::<u32, idem::Error>(3) }).await.unwrap(),
        3,
        "taken over"
    );
}

/// A retention that depends on the request: `ttl` as an expression, once per call.
#[idempotent(key = order, biz = "clock.kept", ttl = Duration::from_secs(hours * 3600), store = store)]
async fn keep(store: &Arc<dyn IdempotencyStore>, order: &str, hours: u64) -> Result<u64, idem::Error> {
    Ok(hours)
}

#[tokio::test]
async fn a_ttl_expression_is_evaluated_for_each_call() {
    let store: Arc<dyn IdempotencyStore> = Arc::new(idem::MemoryStore::new());
    for (order, hours) in [("short", 1), ("long", 48)] {
        assert_eq!(keep(&store, order, hours).await.unwrap(), hours);
        let record = store.get("clock.kept", order).await.unwrap().unwrap();
        let kept = record.expires_at.duration_since(record.completed_at.unwrap()).unwrap();
        assert_eq!(kept, Duration::from_secs(hours * 3600), "{order}");
    }
    // Out of range: refused before anything is claimed, as the builder refuses it.
    let refused = keep(&store, "none", 0).await.unwrap_err();
    assert!(
        matches!(&refused, idem::Error::InvalidOption { option: "ttl", .. }),
        "{refused:?}"
    );
    assert!(store.get("clock.kept", "none").await.unwrap().is_none());
}

/// A store that fails every completion, on tokio's paused clock: the writer's tries and
/// their bound (half a lease after the body ends) are kept on that clock, so the caller
/// gets the store's error after about half a lease of the test's time and a handful of
/// tries — not after as long in real time, with every pause skipped (on the monotonic
/// clock it made 321,349 tries in 1.8 s).
#[tokio::test(start_paused = true)]
async fn a_failing_completion_is_retried_on_the_test_clock() {
    use idem_testkit::conformance::faulty::{Fault, FaultyStore, Op};

    let memory: Arc<dyn IdempotencyStore> = Arc::new(idem::MemoryStore::new());
    let faulty = FaultyStore::new(&memory);
    faulty.inject(Op::Complete, Fault::Fail, u32::MAX);
    let op = Idempotent::new("clock.failing")
        .store(faulty.shared())
        .lease(Duration::from_secs(4));
    let started = tokio::time::Instant::now();
    let answer: Result<u32, idem::Error> = op.execute("k", async { Ok(1) }).await;
    assert!(matches!(answer, Err(idem::Error::Store { .. })), "{answer:?}");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(1) && waited <= Duration::from_secs(3),
        "the caller waits about half the 4 s lease on the test clock: {waited:?}"
    );
    let tries = faulty.calls(Op::Complete);
    assert!((2..=50).contains(&tries), "a handful of tries, not a loop: {tries}");
}

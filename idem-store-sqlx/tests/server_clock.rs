//! A database server whose clock jumps ahead while a body runs: a PostgreSQL server
//! restarted on its data with its clock ahead (libfaketime), standing for a failover to
//! a standby whose clock is ahead. The store judges leases by the server's clock, so the
//! jump makes every running lease look older than it is; the clock tolerance (by default
//! as long as the lease) keeps a running claim from a duplicate unless the jump is larger
//! than the tolerance plus what was left of the lease. Both sides of that bound are shown.

use idem_testkit::conformance;
use idem_testkit::harness;
#[path = "../../tests/support/ci.rs"]
mod ci;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem::{Error, IdempotencyStore, Idempotent};

/// `.ci/start-pg-skewed [args]`.
fn server(args: &[&str]) -> String {
    ci::ci_script("start-pg-skewed", args)
}

/// Restart the server on its data with its clock `skew` (`+30`) off this host's.
async fn restart_with_clock(skew: &'static str) {
    tokio::task::spawn_blocking(move || server(&["restart", skew]))
        .await
        .unwrap();
}

/// What a holder and the duplicates that met it saw.
struct Jump {
    /// How many times the body ran.
    runs: u32,
    /// The holder's answer.
    holder: Result<u32, Error>,
    /// Whether some duplicate was let in (it ran the body and answered `Ok`).
    taken_over: bool,
}

/// A holder runs its body under `op`; mid-body the server is restarted with its clock
/// `skew` ahead; then duplicates call for two lease-thirds (every 100 ms, answering
/// `InProgress` while the claim is respected). The holder works until they are done.
async fn jump_mid_body(op: &Idempotent, skew: &'static str) -> Jump {
    restart_with_clock("+0").await;
    let key = conformance::unique("server-clock");
    let runs = Arc::new(AtomicU32::new(0));
    let (started, done) = (
        Arc::new(tokio::sync::Notify::new()),
        Arc::new(tokio::sync::Notify::new()),
    );
    let holder = tokio::spawn({
        let (op, key, runs, started, done) = (op.clone(), key.clone(), runs.clone(), started.clone(), done.clone());
        async move {
            op.execute(&key, async {
                runs.fetch_add(1, Ordering::SeqCst);
                started.notify_one();
                let _ = tokio::time::timeout(Duration::from_secs(120), done.notified()).await;
                Ok::<u32, Error>(1)
            })
            .await
        }
    });
    started.notified().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    restart_with_clock(skew).await;
    let mut taken_over = false;
    let until = tokio::time::Instant::now() + Duration::from_secs(3);
    while tokio::time::Instant::now() < until {
        let answer = op
            .execute(&key, async {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<u32, Error>(2)
            })
            .await;
        match answer {
            Err(Error::InProgress { .. }) => {}
            // The first connection after the restart may find the old server gone.
            Err(Error::Store { .. }) => {}
            Ok(2) => taken_over = true,
            other => panic!("a duplicate got {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    done.notify_one();
    let holder = holder.await.unwrap();
    Jump {
        runs: runs.load(Ordering::SeqCst),
        holder,
        taken_over,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_clock_jumping_ahead_does_not_hand_a_running_claim_over() {
    if conformance::server_url("IDEM_TEST_POSTGRES_URL", "PostgreSQL").is_none() || harness::libfaketime().is_none() {
        return;
    }
    let exports = tokio::task::spawn_blocking(|| server(&[])).await.unwrap();
    let url = exports
        .trim()
        .trim_start_matches("export IDEM_PG_SKEWED_URL=")
        .to_owned();
    let store: Arc<dyn IdempotencyStore> = Arc::new(harness::postgres_store_across_restarts(&url).await);

    // The defaults (a 30 s lease, as much tolerance): a server back 30 s ahead.
    let defaults = Idempotent::new("server-clock").store(store.clone());
    let jump = jump_mid_body(&defaults, "+30").await;
    assert!(
        !jump.taken_over,
        "a server 30 s ahead handed a running claim to a duplicate"
    );
    assert_eq!(
        (jump.runs, jump.holder.ok()),
        (1, Some(1)),
        "one run, and the holder's answer recorded"
    );

    // A 6 s lease (renewed every 2 s) and its 6 s tolerance: a jump as large as the
    // tolerance is absorbed...
    let short = Idempotent::new("server-clock")
        .store(store.clone())
        .lease(Duration::from_secs(6));
    let jump = jump_mid_body(&short, "+6").await;
    assert!(!jump.taken_over, "a jump of the tolerance handed a running claim over");
    assert_eq!((jump.runs, jump.holder.ok()), (1, Some(1)));

    // ...and one larger than the lease plus the tolerance is not: the bound is where the
    // docs put it. The duplicate runs the body, the holder's outcome is refused.
    let jump = jump_mid_body(&short, "+13").await;
    assert!(
        jump.taken_over,
        "a jump beyond lease + tolerance is expected to let a duplicate in"
    );
    assert_eq!(jump.runs, 2);
    assert!(
        matches!(jump.holder, Err(Error::LeaseLost { .. })),
        "the holder got {:?}",
        jump.holder
    );

    // Without tolerance, the jump of the first case runs the body twice.
    let none = Idempotent::new("server-clock")
        .store(store.clone())
        .lease(Duration::from_secs(30))
        .clock_tolerance(Duration::ZERO);
    let jump = jump_mid_body(&none, "+30").await;
    assert!(
        jump.taken_over && jump.runs == 2,
        "no tolerance: a 30 s jump takes a 30 s lease over"
    );

    tokio::task::spawn_blocking(|| server(&["stop"])).await.unwrap();
}

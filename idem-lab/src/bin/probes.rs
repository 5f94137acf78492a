//! The faults of issue 8, probed: each row injects one fault (through the test
//! harness's `FaultyStore`, or a value JSON cannot hold) into a run of calls and counts
//! the bodies that ran and the answers that were wrong.
//!
//! ```sh
//! cargo run --release -p idem-lab --bin probes     # this tree
//! bash .ci/before-after probes                    # this tree beside the code before issue 8, one run
//! ```
//!
//! Written against the API both have (the attribute, the builder, the store trait), so
//! the same file runs on either. A row prints `bodies` (how many times a body ran, where
//! once is right), `wrong` (answers that differ from the first call's, or errors where
//! the contract promises something else) and a note.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem::{Error, Idempotent, MemoryStore, OnError};
use idem_testkit::conformance::faulty::{self, Fault, FaultyStore, Op, Store};

/// Trials per row.
const TRIALS: u32 = 10;

struct Row {
    fault: &'static str,
    bodies: u32,
    calls: u32,
    wrong: u32,
    note: String,
}

fn memory() -> Store {
    Arc::new(MemoryStore::new())
}

fn op(biz: &'static str, store: &Store) -> Idempotent {
    Idempotent::new(biz).store(store.clone())
}

/// The error's variant, by name (the same on both sides of the change).
fn variant(error: &Error) -> String {
    format!("{error:?}")
        .split([' ', '(', '{'])
        .next()
        .unwrap_or_default()
        .to_owned()
}

async fn run_body(runs: &AtomicU32) -> Result<u32, Error> {
    Ok(runs.fetch_add(1, Ordering::SeqCst) + 1)
}

/// The body finished; `complete` fails 3 times; the caller is dropped after 100 ms.
async fn dropped_caller() -> Row {
    let (mut bodies, mut wrong) = (0, 0);
    for trial in 0..TRIALS {
        let faulty = FaultyStore::new(&memory());
        faulty.inject(Op::Complete, Fault::Fail, 3);
        let op = op("probe.dropped", &faulty.shared()).lease(Duration::from_millis(300));
        let (key, runs) = (format!("k{trial}"), AtomicU32::new(0));
        let _ = tokio::time::timeout(Duration::from_millis(100), op.execute(&key, run_body(&runs))).await;
        tokio::time::sleep(Duration::from_millis(800)).await; // past the lease
        match op.execute(&key, run_body(&runs)).await {
            Ok(1) => {}
            _ => wrong += 1,
        }
        bodies += runs.load(Ordering::SeqCst);
    }
    Row {
        fault: "caller dropped while `complete` fails 3×",
        bodies,
        calls: TRIALS,
        wrong,
        note: "retry after the lease".into(),
    }
}

/// `on_error = Record`; `fail` fails once; a retry after the lease.
async fn fail_write_fails_once() -> Row {
    let (mut bodies, mut wrong) = (0, 0);
    for trial in 0..TRIALS {
        let faulty = FaultyStore::new(&memory());
        faulty.inject(Op::Fail, Fault::Fail, 1);
        let op = op("probe.fail", &faulty.shared())
            .lease(Duration::from_millis(300))
            .on_error(OnError::Record);
        let (key, runs) = (format!("k{trial}"), AtomicU32::new(0));
        let declined = || async {
            runs.fetch_add(1, Ordering::SeqCst);
            Err::<u32, Error>(Error::NoStore { biz: "declined".into() })
        };
        let _ = op.execute(&key, declined()).await;
        tokio::time::sleep(Duration::from_millis(400)).await;
        match op.execute(&key, declined()).await {
            Err(error) if variant(&error) == "PreviousFailed" => {}
            _ => wrong += 1,
        }
        bodies += runs.load(Ordering::SeqCst);
    }
    Row {
        fault: "`fail` write fails once (on_error = Record)",
        bodies,
        calls: TRIALS,
        wrong,
        note: "want PreviousFailed".into(),
    }
}

/// The claim waits 290 ms of its 300 ms lease; a duplicate arrives 40 ms into the body.
async fn late_claim() -> Row {
    let mut bodies = 0;
    for trial in 0..TRIALS {
        let faulty = FaultyStore::new(&memory());
        faulty.inject(Op::Claim, Fault::Delay(Duration::from_millis(290)), 1);
        let op = op("probe.late", &faulty.shared()).lease(Duration::from_millis(300));
        let (key, runs) = (format!("k{trial}"), Arc::new(AtomicU32::new(0)));
        let body = |runs: Arc<AtomicU32>| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(400)).await;
            Ok::<u32, Error>(1)
        };
        let first = {
            let (op, key, runs) = (op.clone(), key.clone(), runs.clone());
            tokio::spawn(async move { op.execute(&key, body(runs)).await })
        };
        while runs.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        tokio::time::sleep(Duration::from_millis(40)).await;
        let _ = op.execute(&key, body(runs.clone())).await;
        let _ = first.await;
        bodies += runs.load(Ordering::SeqCst);
    }
    Row {
        fault: "claim waited 290 ms of a 300 ms lease",
        bodies,
        calls: TRIALS,
        wrong: 0,
        note: "a duplicate 40 ms into the body".into(),
    }
}

/// `complete` commits, then its reply is lost.
async fn lost_reply() -> Row {
    let (mut bodies, mut wrong) = (0, 0);
    for trial in 0..TRIALS {
        let faulty = FaultyStore::new(&memory());
        faulty.inject(Op::Complete, Fault::CommitThenFail, 1);
        let op = op("probe.reply", &faulty.shared());
        let runs = AtomicU32::new(0);
        if op.execute(format!("k{trial}"), run_body(&runs)).await.is_err() {
            wrong += 1;
        }
        bodies += runs.load(Ordering::SeqCst);
    }
    Row {
        fault: "`complete` commits, reply lost",
        bodies,
        calls: TRIALS,
        wrong,
        note: "the caller's own result is recorded".into(),
    }
}

/// 10,000 random doubles, each replayed.
async fn float_replays() -> Row {
    let store = memory();
    let op = op("probe.floats", &store);
    let mut wrong = 0;
    let values = faulty::random_doubles(0x2545_F491_4F6C_DD1D, 10_000);
    for (i, value) in values.iter().enumerate() {
        let key = format!("k{i}");
        let _: Result<f64, Error> = op.execute(&key, async { Ok(*value) }).await;
        match op.execute(&key, async { Ok::<f64, Error>(0.0) }).await {
            Ok(replayed) if replayed.to_bits() == value.to_bits() => {}
            _ => wrong += 1,
        }
    }
    Row {
        fault: "random finite f64 replayed",
        bodies: values.len() as u32,
        calls: values.len() as u32,
        wrong,
        note: "replay bits ≠ first answer's".into(),
    }
}

/// NaN, infinity and `Some(None)`: the first answer, then a replay.
async fn unrepresentable_values() -> Row {
    let store = memory();
    let op = op("probe.nan", &store);
    let (mut bodies, mut wrong) = (0, 0);
    let values = [Some(Some(f64::NAN)), Some(Some(f64::INFINITY)), Some(None)];
    for (i, value) in values.into_iter().enumerate() {
        let runs = AtomicU32::new(0);
        let key = format!("k{i}");
        let body = || async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<Option<Option<f64>>, Error>(value)
        };
        let first = op.execute(&key, body()).await;
        let again = op.execute(&key, body()).await;
        // Right: the first call refuses (Encode) and so does the duplicate (PreviousFailed);
        // wrong: a first answer that a replay then contradicts.
        if let (Ok(first), replay) = (&first, &again) {
            let same = matches!(replay, Ok(r) if format!("{r:?}") == format!("{first:?}"));
            wrong += u32::from(!same);
        }
        bodies += runs.load(Ordering::SeqCst);
    }
    Row {
        fault: "NaN, ∞, Some(None) as the Ok value",
        bodies,
        calls: 3,
        wrong,
        note: "a replay that differs from the first answer".into(),
    }
}

/// The same request, with a `HashSet` and a `u128` past 2^64, retried 20 times.
async fn set_payloads() -> Row {
    let store = memory();
    let (runs, mut wrong) = (AtomicU32::new(0), 0);
    let skus: Vec<String> = (0..32).map(|i| format!("sku-{i}")).collect();
    for _ in 0..20 {
        let payload = (
            skus.iter().cloned().collect::<HashSet<String>>(),
            u128::from(u64::MAX) + 7,
        );
        let op = op("probe.payload", &store).payload(&payload);
        if op.execute("basket-1", run_body(&runs)).await.is_err() {
            wrong += 1;
        }
    }
    Row {
        fault: "HashSet + u128 payload, 20 retries",
        bodies: runs.load(Ordering::SeqCst),
        calls: 1,
        wrong,
        note: "PayloadMismatch or Encode on an honest retry".into(),
    }
}

/// `wait = 50ms` behind a running call, polling claims taking 300 ms.
async fn wait_overshoot() -> Row {
    let store = memory();
    let holder = {
        let op = op("probe.wait", &store);
        tokio::spawn(async move {
            op.execute("k", async {
                tokio::time::sleep(Duration::from_secs(3)).await;
                Ok::<u8, Error>(1)
            })
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut longest = Duration::ZERO;
    for _ in 0..3 {
        // The waiter's first claim is quick; any claim after it (a poll) takes 300 ms.
        let faulty = FaultyStore::new(&store);
        faulty.inject(Op::Claim, Fault::Delay(Duration::ZERO), 1);
        faulty.inject(Op::Claim, Fault::Delay(Duration::from_millis(300)), 100);
        let waiter = op("probe.wait", &faulty.shared()).wait(Duration::from_millis(50));
        let started = Instant::now();
        let _ = waiter.execute("k", async { Ok::<u8, Error>(2) }).await;
        longest = longest.max(started.elapsed());
    }
    holder.abort();
    Row {
        fault: "`wait = 50ms`, a second claim takes 300 ms",
        bodies: 0,
        calls: 3,
        wrong: 0,
        note: format!("longest wait {longest:.0?}"),
    }
}

/// A body that calls its own key (`wait = 2s`).
async fn reentrant() -> Row {
    let store = memory();
    let op = op("probe.reentrant", &store).wait(Duration::from_secs(2));
    let started = Instant::now();
    let inner = op.clone();
    let outcome: Result<u8, Error> = op
        .execute(
            "k",
            async move { inner.execute("k", async { Ok::<u8, Error>(1) }).await },
        )
        .await;
    let said = match outcome {
        Ok(_) => "Ok".to_owned(),
        Err(error) => variant(&error),
    };
    Row {
        fault: "a body calls its own (biz, key)",
        bodies: 1,
        calls: 1,
        wrong: u32::from(said != "Reentrant"),
        note: format!("{said} after {:.0?}", started.elapsed()),
    }
}

/// Durations no store can hold, in the builder; an 8,000-year ttl on SQLite.
async fn durations() -> Row {
    let file = std::env::temp_dir().join(format!("idem-probes-{}.db", std::process::id()));
    let sqlite = idem::sql::open(&format!("sqlite://{}", file.display())).await.unwrap();
    // Built inside the probe's task: a builder may panic on these.
    type Build = Box<dyn Fn() -> Idempotent + Send + Sync>;
    let cases: Vec<(&str, Build, Store)> = vec![
        (
            "ttl(MAX)",
            Box::new(|| Idempotent::new("probe.dur").ttl(Duration::MAX)),
            memory(),
        ),
        (
            "lease(MAX)",
            Box::new(|| Idempotent::new("probe.dur").lease(Duration::MAX)),
            memory(),
        ),
        (
            "wait(MAX)",
            Box::new(|| Idempotent::new("probe.dur").wait(Duration::MAX)),
            memory(),
        ),
        (
            "lease(0)",
            Box::new(|| Idempotent::new("probe.dur").lease(Duration::ZERO)),
            memory(),
        ),
        (
            "ttl 8,000 y (SQLite)",
            Box::new(|| Idempotent::new("probe.dur").ttl(Duration::from_secs(8_000 * 365 * 86_400))),
            sqlite,
        ),
    ];
    let (mut bodies, mut wrong, mut said) = (0, 0, Vec::new());
    for (name, make, store) in cases {
        let runs = Arc::new(AtomicU32::new(0));
        let outcome = {
            let runs = runs.clone();
            tokio::spawn(async move {
                let op = make().store(store);
                let body = |runs: Arc<AtomicU32>| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    Ok::<u8, Error>(1)
                };
                let first = op.execute("k", body(runs.clone()));
                let second = async {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    op.execute("k", body(runs.clone())).await
                };
                let (a, b) = tokio::join!(first, second);
                let _ = op.execute("k", body(runs.clone())).await;
                (a.map_err(|e| variant(&e)), b.map_err(|e| variant(&e)))
            })
            .await
        };
        let ran = runs.load(Ordering::SeqCst);
        bodies += ran;
        let verdict = match outcome {
            Err(join) if join.is_panic() => "panic".to_owned(),
            Err(_) => "cancelled".to_owned(),
            Ok((Err(a), _)) if a == "InvalidOption" => "InvalidOption".to_owned(),
            Ok(_) if ran > 1 => format!("ran {ran}×"),
            Ok(_) => "accepted".to_owned(),
        };
        wrong += u32::from(verdict != "InvalidOption");
        said.push(format!("{name}: {verdict}"));
    }
    Row {
        fault: "durations no store holds (builder)",
        bodies,
        calls: 5,
        wrong,
        note: said.join("; "),
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let label = std::env::args().nth(1).unwrap_or_else(|| "this tree".into());
    let rows = vec![
        dropped_caller().await,
        fail_write_fails_once().await,
        late_claim().await,
        lost_reply().await,
        float_replays().await,
        unrepresentable_values().await,
        set_payloads().await,
        wait_overshoot().await,
        reentrant().await,
        durations().await,
    ];
    println!("\n{label}\n");
    println!("| fault | keys | bodies run | wrong answers | note |");
    println!("|---|---|---|---|---|");
    for row in rows {
        println!(
            "| {} | {} | {} | {} | {} |",
            row.fault, row.calls, row.bodies, row.wrong, row.note
        );
    }
}

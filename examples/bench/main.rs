//! One table of what idem costs, per backend, from one run:
//!
//! ```text
//! cargo run --release --example bench                       # memory and SQLite
//! eval "$(.ci/start-databases)"                             # PostgreSQL and MariaDB too
//! cargo run --release --example bench -- --calls 5000 --growth
//! ```
//!
//! For each backend: the bare function, the hand-written floor (the same claim and
//! record statements typed directly with sqlx on the same pool), idem's first execution
//! and replay, replay through `CachedStore`; p50 and p99 of each. Then throughput of
//! distinct keys with 1, 8 and 64 tasks, a storm of 1,000 concurrent calls on one key,
//! the memory one live record takes in `MemoryStore`, and (`--growth`) the cost of a
//! claim and of a purge batch with 10⁴, 10⁵ and 10⁶ records in the table, with the
//! query plans that show the indexes at work.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use idem::sqlx::Row;
use idem::{CachedStore, IdempotencyStore, Idempotent, MemoryStore};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Receipt {
    charge_id: u64,
    cents: u64,
}

/// The business under test: nothing, so what is measured is the library.
async fn bare(n: u64) -> Result<Receipt, idem::Error> {
    Ok(Receipt {
        charge_id: n,
        cents: 19_900,
    })
}

struct Percentiles {
    p50: Duration,
    p99: Duration,
}

fn percentiles(mut samples: Vec<Duration>) -> Percentiles {
    samples.sort_unstable();
    let at = |q: f64| samples[((samples.len() as f64 - 1.0) * q).round() as usize];
    Percentiles {
        p50: at(0.50),
        p99: at(0.99),
    }
}

async fn sample<F, Fut>(calls: usize, mut call: F) -> Percentiles
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    for i in 0..calls.min(200) {
        call(usize::MAX - i).await; // warm-up, on keys of its own
    }
    let mut samples = Vec::with_capacity(calls);
    for i in 0..calls {
        let started = Instant::now();
        call(i).await;
        samples.push(started.elapsed());
    }
    percentiles(samples)
}

fn micros(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e6)
}

struct Backend {
    name: &'static str,
    store: Arc<dyn IdempotencyStore>,
    floor: Option<Floor>,
}

/// The floor: the very statements idem runs on the hot path (its claim and its
/// completion, taken from the store), bound and run by hand with sqlx on the same pool.
enum Floor {
    Sqlite(idem::SqliteStore),
    Postgres(idem::PostgresStore),
    MySql(idem::MySqlStore),
}

use idem::sqlx::types::chrono::{DateTime, Utc};

fn utc(at: SystemTime) -> DateTime<Utc> {
    at.into()
}

fn sqlite_text(at: SystemTime) -> String {
    utc(at).format("%Y-%m-%d %H:%M:%S%.6f").to_string()
}

impl Floor {
    async fn claim_and_record(&self, key: &str) {
        let (biz, response) = ("floor", r#"{"charge_id":1,"cents":19900}"#);
        let now = idem::store::now();
        let (lease_until, expires) = (now + Duration::from_secs(30), now + Duration::from_secs(86_400));
        let no_text: Option<&str> = None;
        let first_fence = i64::try_from(now.duration_since(std::time::UNIX_EPOCH).unwrap().as_micros()).unwrap();
        match self {
            Floor::Sqlite(store) => {
                let row = idem::sqlx::query(store.claim_sql())
                    .bind(biz)
                    .bind(key)
                    .bind(no_text)
                    .bind(no_text)
                    .bind(sqlite_text(lease_until))
                    .bind(sqlite_text(now))
                    .bind(sqlite_text(expires))
                    .bind(first_fence)
                    .fetch_one(store.pool())
                    .await
                    .unwrap();
                let (fence, created_at): (i64, String) = (row.get(0), row.get(1));
                idem::sqlx::query(store.complete_sql())
                    .bind(response)
                    .bind(sqlite_text(now))
                    .bind(sqlite_text(now))
                    .bind(sqlite_text(expires))
                    .bind(biz)
                    .bind(key)
                    .bind(fence)
                    .bind(created_at)
                    .execute(store.pool())
                    .await
                    .unwrap();
            }
            Floor::Postgres(store) => {
                let row = idem::sqlx::query(store.claim_sql())
                    .bind(biz)
                    .bind(key)
                    .bind(no_text)
                    .bind(no_text)
                    .bind(utc(lease_until))
                    .bind(utc(now))
                    .bind(utc(expires))
                    .bind(first_fence)
                    .fetch_one(store.pool())
                    .await
                    .unwrap();
                // The claim returns the record that stood in the way first, then the grant.
                let (fence, created_at): (i64, DateTime<Utc>) = (row.get(12), row.get(13));
                idem::sqlx::query(store.complete_sql())
                    .bind(response)
                    .bind(utc(now))
                    .bind(utc(now))
                    .bind(utc(expires))
                    .bind(biz)
                    .bind(key)
                    .bind(fence)
                    .bind(created_at)
                    .execute(store.pool())
                    .await
                    .unwrap();
            }
            Floor::MySql(store) => {
                let done = idem::sqlx::query(store.claim_sql())
                    .bind(biz)
                    .bind(key)
                    .bind(no_text)
                    .bind(no_text)
                    .bind(utc(lease_until).naive_utc())
                    .bind(utc(now).naive_utc())
                    .bind(utc(expires).naive_utc())
                    .bind(first_fence)
                    .execute(store.pool())
                    .await
                    .unwrap();
                assert_eq!((done.rows_affected(), done.last_insert_id()), (1, 0), "a fresh insert");
                idem::sqlx::query(store.complete_sql())
                    .bind(response)
                    .bind(utc(now).naive_utc())
                    .bind(utc(now).naive_utc())
                    .bind(utc(expires).naive_utc())
                    .bind(biz)
                    .bind(key)
                    .bind(first_fence)
                    .bind(utc(now).naive_utc())
                    .execute(store.pool())
                    .await
                    .unwrap();
            }
        }
    }
}

async fn backends() -> Vec<Backend> {
    let mut backends = vec![Backend {
        name: "memory",
        store: Arc::new(MemoryStore::new()),
        floor: None,
    }];
    let path = std::env::temp_dir().join(format!("idem-bench-{}.db", std::process::id()));
    let sqlite = idem::SqliteStore::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    sqlite.migrate().await.unwrap();
    let floor = Floor::Sqlite(sqlite.clone());
    backends.push(Backend {
        name: "SQLite file",
        store: Arc::new(sqlite),
        floor: Some(floor),
    });
    if let Ok(url) = std::env::var("IDEM_TEST_POSTGRES_URL") {
        let store = idem::PostgresStore::connect(&url).await.unwrap();
        store.migrate().await.unwrap();
        let floor = Floor::Postgres(store.clone());
        backends.push(Backend {
            name: "PostgreSQL",
            store: Arc::new(store),
            floor: Some(floor),
        });
    }
    if let Ok(url) = std::env::var("IDEM_TEST_MYSQL_URL") {
        let store = idem::MySqlStore::connect(&url).await.unwrap();
        store.migrate().await.unwrap();
        let floor = Floor::MySql(store.clone());
        backends.push(Backend {
            name: "MariaDB",
            store: Arc::new(store),
            floor: Some(floor),
        });
    }
    backends
}

fn run_id() -> u128 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// Latency rows of one backend.
async fn latency(backend: &Backend, calls: usize) {
    let run = run_id();
    let op = Idempotent::new("bench").store(backend.store.clone());
    let bare_p = sample(calls, |i| async move {
        std::hint::black_box(bare(i as u64).await.unwrap());
    })
    .await;
    let first = sample(calls, |i| {
        let op = &op;
        async move {
            std::hint::black_box(op.execute(format!("{run}-{i}"), bare(i as u64)).await.unwrap());
        }
    })
    .await;
    op.execute(format!("{run}-hot"), bare(0)).await.unwrap();
    let replay = sample(calls, |_| {
        let op = &op;
        async move {
            std::hint::black_box(op.execute(format!("{run}-hot"), bare(1)).await.unwrap());
        }
    })
    .await;
    let cached = Arc::new(CachedStore::new(backend.store.clone(), 10_000));
    let cached_op = Idempotent::new("bench").store(cached);
    cached_op.execute(format!("{run}-hot"), bare(0)).await.unwrap();
    let cached_replay = sample(calls, |_| {
        let op = &cached_op;
        async move {
            std::hint::black_box(op.execute(format!("{run}-hot"), bare(1)).await.unwrap());
        }
    })
    .await;
    let floor = match &backend.floor {
        Some(floor) => Some(
            sample(
                calls,
                |i| async move { floor.claim_and_record(&format!("{run}-{i}")).await },
            )
            .await,
        ),
        None => None,
    };
    let row = |what: &str, p: &Percentiles, against: Option<&Percentiles>| {
        let ratio = against.map_or(String::from("—"), |base| {
            format!("{:.2}×", p.p50.as_secs_f64() / base.p50.as_secs_f64())
        });
        println!(
            "| {} | {what} | {} | {} | {ratio} |",
            backend.name,
            micros(p.p50),
            micros(p.p99)
        );
    };
    row("bare fn", &bare_p, None);
    if let Some(floor) = &floor {
        row("hand-written floor (claim + record)", floor, None);
    }
    row("idem first execution", &first, floor.as_ref());
    row("idem replay", &replay, None);
    row("idem replay via CachedStore", &cached_replay, None);
    // The library's own cost: over the floor where there is one, over the bare fn
    // in memory.
    let (base, against) = match &floor {
        Some(floor) => (floor, "first − floor"),
        None => (&bare_p, "first − bare"),
    };
    let signed = |a: Duration, b: Duration| format!("{:+.1}", (a.as_secs_f64() - b.as_secs_f64()) * 1e6);
    println!(
        "| {} | **added by idem** ({against}) | {} | {} | |",
        backend.name,
        signed(first.p50, base.p50),
        signed(first.p99, base.p99)
    );
}

/// Distinct keys per second with `tasks` concurrent tasks.
async fn throughput(backend: &Backend, tasks: usize, calls: usize) -> f64 {
    let run = run_id();
    let per_task = (calls / tasks).max(1);
    let started = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let op = Idempotent::new("bench").store(backend.store.clone());
            tokio::spawn(async move {
                for i in 0..per_task {
                    op.execute(format!("{run}-{t}-{i}"), bare(i as u64)).await.unwrap();
                }
            })
        })
        .collect();
    for handle in handles {
        handle.await.unwrap();
    }
    (per_task * tasks) as f64 / started.elapsed().as_secs_f64()
}

/// 1,000 concurrent calls on one key: how long each caller waits for its answer.
async fn storm(backend: &Backend, wait: bool) -> (Percentiles, Duration, usize, usize) {
    let bodies = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let key = format!("{}-storm", run_id());
    let mut op = Idempotent::new("bench").store(backend.store.clone());
    if wait {
        op = op.wait(Duration::from_secs(30));
    }
    let op = Arc::new(op);
    let started = Instant::now();
    let handles: Vec<_> = (0..1000)
        .map(|i| {
            let (op, key, bodies) = (op.clone(), key.clone(), bodies.clone());
            tokio::spawn(async move {
                let began = Instant::now();
                let outcome = op
                    .execute(key, async move {
                        bodies.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        bare(i).await
                    })
                    .await;
                (began.elapsed(), outcome.is_ok())
            })
        })
        .collect();
    let mut samples = Vec::new();
    let mut ok = 0;
    for handle in handles {
        let (took, success) = handle.await.unwrap();
        samples.push(took);
        ok += usize::from(success);
    }
    (
        percentiles(samples),
        started.elapsed(),
        ok,
        bodies.load(std::sync::atomic::Ordering::SeqCst),
    )
}

fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|kb| kb.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

async fn memory_per_record() -> (u64, usize) {
    let store = Arc::new(MemoryStore::new());
    let op = Idempotent::new("bench").store(store.clone());
    let n = 200_000;
    let before = resident_bytes();
    for i in 0..n {
        op.execute(format!("order-{i:012}"), bare(i as u64)).await.unwrap();
    }
    let after = resident_bytes();
    assert_eq!(store.len(), n);
    ((after.saturating_sub(before)) / n as u64, n)
}

mod growth;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let calls = args
        .iter()
        .position(|a| a == "--calls")
        .and_then(|at| args.get(at + 1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(2000usize);
    let backends = backends().await;
    println!("idem bench: {calls} calls a row, one run, release build; µs per call\n");
    println!("| backend | what | p50 µs | p99 µs | first ÷ floor (p50) |");
    println!("|---|---|---|---|---|");
    for backend in &backends {
        latency(backend, calls).await;
    }

    println!("\n| backend | distinct keys/s, 1 task | 8 tasks | 64 tasks |");
    println!("|---|---|---|---|");
    for backend in &backends {
        let mut cells = Vec::new();
        for tasks in [1, 8, 64] {
            cells.push(format!("{:.0}", throughput(backend, tasks, calls * 2).await));
        }
        println!("| {} | {} |", backend.name, cells.join(" | "));
    }

    println!("\n| backend | storm: 1,000 concurrent calls, one key, body 20 ms | p50 ms | p99 ms | all answered in | bodies run |");
    println!("|---|---|---|---|---|---|");
    for backend in &backends {
        for wait in [false, true] {
            let (p, total, ok, bodies) = storm(backend, wait).await;
            let how = if wait {
                "with `wait`: every caller gets the result"
            } else {
                "no wait: duplicates get InProgress"
            };
            println!(
                "| {} | {how} ({ok} Ok) | {:.2} | {:.2} | {:.0} ms | {bodies} |",
                backend.name,
                p.p50.as_secs_f64() * 1e3,
                p.p99.as_secs_f64() * 1e3,
                total.as_secs_f64() * 1e3
            );
        }
    }

    let (bytes, n) = memory_per_record().await;
    println!(
        "\nMemoryStore: {bytes} bytes of resident memory per live record ({n} records, 20-char keys, small response)"
    );

    if args.iter().any(|a| a == "--growth") {
        growth::report(&backends).await;
    }
}

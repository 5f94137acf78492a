//! One table of what idem costs, per backend, from one run:
//!
//! ```text
//! cargo run --release -p idem-lab --bin bench                       # memory and SQLite
//! eval "$(.ci/start-databases)"                             # PostgreSQL and MariaDB too
//! cargo run --release -p idem-lab --bin bench -- --calls 5000 --growth
//! cargo run --release -p idem-lab --bin bench -- --transactional-only  # just that table
//! cargo run --release -p idem-lab --bin bench -- --http-only           # just the HTTP layer's
//! cargo run --release -p idem-lab --bin bench -- --seal-only           # just what sealing costs
//! cargo run --release -p idem-lab --bin bench -- --latency-only        # just the first table
//! cargo run --release -p idem-lab --bin bench -- --latency-only --memory-only  # … of MemoryStore alone
//! cargo run --release -p idem-lab --bin bench -- --storm-only          # just the storms
//! cargo run --release -p idem-lab --bin bench -- --replay-only         # a replay against a read by key
//! cargo run --release -p idem-lab --bin bench -- --gap-only            # what idem adds to its store's calls
//! cargo run --release -p idem-lab --bin bench -- --powertools-side     # idem on Redis, as the Powertools script measures
//! ```
//!
//! For each backend: the bare function, the hand-written floor (the same claim and
//! record statements typed directly with sqlx on the same pool), the classic design
//! (an `INSERT`, then an `UPDATE`) on the same pool and on a pool with sqlx's defaults,
//! idem's first execution and replay, replay through `CachedStore`; p50 and p99 of
//! each. Then transactional
//! mode against the same business transaction without idem, and the `Idempotency-Key`
//! layer against the same axum handler without it, and a sealed store (`idem::seal`)
//! against the same store unsealed, and idem's first execution against its store's two
//! calls by hand (with, between them, nothing, a `MemoryStore` call, or a spin of 1.5 or
//! 20 µs) and idem's own time between its two calls. Then
//! throughput of distinct keys with 1, 8 and 64 tasks, storms of 1,000 concurrent calls
//! on one key (in one process, and across four processes that share the key, warm
//! and cold),
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

/// `variants` measurements of `calls` calls each, one call of each in turn — each
/// round starting with the next variant, so none always follows the same one — after a
/// warm-up of each on keys of its own: the percentiles of each, in order.
async fn alternate<'a, F>(calls: usize, mut call: F, variants: usize) -> Vec<Percentiles>
where
    F: FnMut(usize, usize) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + 'a>>,
{
    for i in 0..calls.min(200) {
        for variant in 0..variants {
            call(variant, usize::MAX - i * variants - variant).await;
        }
    }
    let mut samples = vec![Vec::with_capacity(calls); variants];
    for i in 0..calls {
        for turn in 0..variants {
            let variant = (i + turn) % variants;
            let started = Instant::now();
            call(variant, i * variants + variant).await;
            samples[variant].push(started.elapsed());
        }
    }
    samples.into_iter().map(percentiles).collect()
}

fn micros(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e6)
}

struct Backend {
    name: &'static str,
    store: Arc<dyn IdempotencyStore>,
    floor: Option<Floor>,
    /// Redis's floor: its two scripts by hand.
    redis_floor: Option<redis_floor::RedisFloor>,
    /// The same database on a pool with sqlx's defaults (which pings every connection
    /// it lends), for the classic design as a team writes it on its own pool.
    defaults: Option<Floor>,
}

impl Backend {
    /// The floor's claim and record of `key`, on a backend that has one.
    async fn by_hand(&self, key: &str) {
        match (&self.floor, &self.redis_floor) {
            (Some(floor), _) => floor.claim_and_record(key).await,
            (None, Some(floor)) => floor.claim_and_record(key).await,
            (None, None) => unreachable!("a backend without a floor"),
        }
    }
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
    /// The store's read of `key` (of the bench's biz) on this floor's pool.
    async fn get(&self, key: &str) -> Option<idem::store::Record> {
        let read = match self {
            Floor::Sqlite(store) => store.get(BIZ, key).await,
            Floor::Postgres(store) => store.get(BIZ, key).await,
            Floor::MySql(store) => store.get(BIZ, key).await,
        };
        read.unwrap()
    }

    /// The claim and the record, each committed on its own, as idem's leased mode runs them.
    async fn claim_and_record(&self, key: &str) {
        self.run(key, None).await;
    }

    /// The claim, then `business` (an insert binding the key and an amount), then the
    /// record, in one transaction: the floor of transactional mode.
    async fn claim_business_record(&self, key: &str, business: &str) {
        self.run(key, Some(business)).await;
    }

    async fn run(&self, key: &str, business: Option<&str>) {
        /// Each statement on the pool, as idem's leased mode runs them (the body runs
        /// between them, holding no connection), or all in one transaction.
        macro_rules! on_connection {
            ($store:expr, $rows:ident) => {
                match business {
                    None => $rows($store, None, key, None).await,
                    Some(sql) => {
                        let mut tx = $store.pool().begin().await.unwrap();
                        $rows($store, Some(&mut *tx), key, Some(sql)).await;
                        tx.commit().await.unwrap();
                    }
                }
            };
        }
        match self {
            Floor::Sqlite(store) => on_connection!(store, sqlite_rows),
            Floor::Postgres(store) => on_connection!(store, postgres_rows),
            Floor::MySql(store) => on_connection!(store, mysql_rows),
        }
    }
}

/// Run `query` with `method` on the transaction's connection, or else on the pool.
macro_rules! on {
    ($conn:expr, $store:expr, $query:expr, $method:ident) => {
        match $conn {
            Some(ref mut conn) => $query.$method(&mut **conn).await,
            None => $query.$method($store.pool()).await,
        }
    };
}

const BIZ: &str = "floor";
const RESPONSE: &str = r#"{"charge_id":1,"cents":19900}"#;
const NO_TEXT: Option<&str> = None;

/// When the floor's record is claimed, its lease ends and it expires.
struct Stamps {
    now: SystemTime,
    lease_until: SystemTime,
    expires: SystemTime,
    first_fence: i64,
}

fn stamps() -> Stamps {
    let now = idem::store::now();
    Stamps {
        now,
        lease_until: now + LEASE,
        expires: now + TTL,
        first_fence: i64::try_from(now.duration_since(std::time::UNIX_EPOCH).unwrap().as_micros()).unwrap(),
    }
}

/// The business statement of the transactional rows: one insert binding the key and an
/// amount.
async fn business_insert<'c, DB>(conn: &'c mut DB::Connection, sql: &str, key: &str)
where
    DB: idem::sqlx::Database,
    &'c mut DB::Connection: idem::sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: idem::sqlx::IntoArguments<'q, DB>,
    for<'q> String: idem::sqlx::Encode<'q, DB> + idem::sqlx::Type<DB>,
    for<'q> i64: idem::sqlx::Encode<'q, DB> + idem::sqlx::Type<DB>,
{
    idem::sqlx::query(sql)
        .bind(key.to_owned())
        .bind(19_900i64)
        .execute(conn)
        .await
        .unwrap();
}

/// idem's claim and completion of `key` on `store`, bound by hand as the store binds
/// them: `$at` writes an instant as the dialect binds it — or, with `$at` `None`, the
/// statements read the server's clock and take the lease's and the record's lengths in
/// microseconds. The claim runs with `$method` and `$lease` turns its answer (`$answer`,
/// with the call's `$stamps`) into the lease's fence and `created_at`, which the
/// completion matches. With `business`, the business insert runs between them on `conn`.
macro_rules! idem_rows {
    ($store:expr, $conn:expr, $key:expr, $business:expr, $db:ty, $at:expr, $method:ident, |$answer:ident, $stamps:ident| $lease:expr) => {{
        let at = stamps();
        let claim = idem::sqlx::query($store.claim_sql())
            .bind(BIZ)
            .bind($key)
            .bind(NO_TEXT)
            .bind(NO_TEXT);
        let claim = match $at {
            Some(stamp) => claim
                .bind(stamp(at.lease_until))
                .bind(stamp(at.now))
                .bind(stamp(at.expires))
                .bind(at.first_fence),
            None => claim.bind(length_micros(LEASE)).bind(length_micros(TTL)),
        };
        let $answer = on!($conn, $store, claim, $method).unwrap();
        let $stamps = &at;
        let (fence, created_at) = $lease;
        if let Some(sql) = $business {
            business_insert::<$db>($conn.as_deref_mut().expect("a transaction"), sql, $key).await;
        }
        let complete = idem::sqlx::query($store.complete_sql()).bind(RESPONSE);
        // The record's end, its replay's end (the same: it replays until it expires),
        // no subject; then the lease.
        let complete = match $at {
            Some(stamp) => complete
                .bind(stamp(at.now))
                .bind(stamp(at.now))
                .bind(stamp(at.expires))
                .bind(stamp(at.expires)),
            None => complete.bind(length_micros(TTL)).bind(length_micros(TTL)),
        };
        let complete = complete
            .bind(None::<String>)
            .bind(BIZ)
            .bind($key)
            .bind(fence)
            .bind(created_at);
        on!($conn, $store, complete, execute).unwrap();
    }};
}

/// The floor's lease and record lengths.
const LEASE: Duration = Duration::from_secs(30);
const TTL: Duration = Duration::from_secs(86_400);

/// A length in microseconds, as a server adds it to its clock.
fn length_micros(length: Duration) -> i64 {
    i64::try_from(length.as_micros()).unwrap()
}

async fn sqlite_rows(
    store: &idem::SqliteStore,
    mut conn: Option<&mut idem::sqlx::SqliteConnection>,
    key: &str,
    business: Option<&str>,
) {
    idem_rows!(
        store,
        conn,
        key,
        business,
        idem::sqlx::Sqlite,
        Some(sqlite_text),
        fetch_one,
        |row, _stamps| { (row.get::<i64, _>(0), row.get::<String, _>(1)) }
    );
}

async fn postgres_rows(
    store: &idem::PostgresStore,
    mut conn: Option<&mut idem::sqlx::PgConnection>,
    key: &str,
    business: Option<&str>,
) {
    idem_rows!(
        store,
        conn,
        key,
        business,
        idem::sqlx::Postgres,
        None::<fn(SystemTime) -> DateTime<Utc>>,
        fetch_one,
        |row, _stamps| { (row.get::<i64, _>(0), row.get::<DateTime<Utc>, _>(1)) }
    );
}

async fn mysql_rows(
    store: &idem::MySqlStore,
    mut conn: Option<&mut idem::sqlx::MySqlConnection>,
    key: &str,
    business: Option<&str>,
) {
    // A plain INSERT: the lease's fence comes back as the last insert id, the server's
    // instant in microseconds, which is its `created_at`.
    idem_rows!(
        store,
        conn,
        key,
        business,
        idem::sqlx::MySql,
        None::<fn(SystemTime) -> idem::sqlx::types::chrono::NaiveDateTime>,
        execute,
        |done, _stamps| {
            assert_eq!(done.rows_affected(), 1, "a fresh insert");
            let fence = done.last_insert_id();
            let created_at = utc(std::time::UNIX_EPOCH + Duration::from_micros(fence)).naive_utc();
            (i64::try_from(fence).unwrap(), created_at)
        }
    );
}

/// The table of the stores the bench measures on a server (made anew for each run).
const BENCH_TABLE: &str = "idem_bench_record";

/// `store` on a table of its own, [`BENCH_TABLE`], made anew for the run (as the seed
/// design's floor is): every statement measured on a table of the same size.
macro_rules! fresh_table {
    ($store:expr) => {{
        idem::sqlx::query(&format!("DROP TABLE IF EXISTS {BENCH_TABLE}"))
            .execute($store.pool())
            .await
            .unwrap();
        let store = $store.with_table_name(BENCH_TABLE).unwrap();
        store.migrate().await.unwrap();
        store
    }};
}

async fn backends() -> Vec<Backend> {
    let mut backends = vec![Backend {
        name: "memory",
        store: Arc::new(MemoryStore::new()),
        floor: None,
        redis_floor: None,
        defaults: None,
    }];
    let sqlite = idem::SqliteStore::connect(&format!("sqlite://{}", sqlite_path()))
        .await
        .unwrap();
    sqlite.migrate().await.unwrap();
    let floor = Floor::Sqlite(sqlite.clone());
    let defaults = idem::sqlx::SqlitePool::connect(&format!("sqlite://{}", sqlite_path()))
        .await
        .unwrap();
    backends.push(Backend {
        name: "SQLite file",
        store: Arc::new(sqlite),
        floor: Some(floor),
        redis_floor: None,
        defaults: Some(Floor::Sqlite(idem::SqliteStore::new(defaults))),
    });
    if let Ok(url) = std::env::var("IDEM_TEST_POSTGRES_URL") {
        let store = idem::PostgresStore::connect(&url).await.unwrap();
        let store = fresh_table!(store);
        let floor = Floor::Postgres(store.clone());
        let defaults = idem::sqlx::PgPool::connect(&url).await.unwrap();
        backends.push(Backend {
            name: "PostgreSQL",
            store: Arc::new(store),
            floor: Some(floor),
            redis_floor: None,
            defaults: Some(Floor::Postgres(
                idem::PostgresStore::new(defaults).with_table_name(BENCH_TABLE).unwrap(),
            )),
        });
    }
    // The same server through PgBouncer (`.ci/start-pgbouncer`): in session mode with
    // the store's defaults, and in transaction mode, where every statement is unnamed
    // and runs in a transaction of its own (`?pooler=transaction`). No floor: the
    // floor's statements are prepared ones.
    for (var, name, pooler) in [
        (
            "IDEM_TEST_PGBOUNCER_SESSION_URL",
            "PostgreSQL via PgBouncer, session mode",
            "",
        ),
        (
            "IDEM_TEST_PGBOUNCER_URL",
            "PostgreSQL via PgBouncer, transaction mode",
            "?pooler=transaction",
        ),
    ] {
        let Ok(url) = std::env::var(var) else { continue };
        let store = idem::PostgresStore::connect(&format!("{url}{pooler}"))
            .await
            .unwrap()
            .with_table_name("idem_bench_pooled")
            .unwrap();
        store.migrate().await.unwrap();
        idem::sqlx::raw_sql("TRUNCATE idem_bench_pooled")
            .execute(store.pool())
            .await
            .unwrap();
        backends.push(Backend {
            name,
            store: Arc::new(store),
            floor: None,
            redis_floor: None,
            defaults: None,
        });
    }
    // MariaDB alone, and one node of a Galera cluster (its first URL): certification at
    // every commit, causal reads on replays.
    for (var, name) in [
        ("IDEM_TEST_MYSQL_URL", "MariaDB"),
        ("IDEM_TEST_GALERA_URLS", "Galera node"),
    ] {
        let Ok(urls) = std::env::var(var) else { continue };
        let store = idem::MySqlStore::connect(urls.split(',').next().unwrap())
            .await
            .unwrap();
        let store = fresh_table!(store);
        let floor = Floor::MySql(store.clone());
        let defaults = idem::sqlx::MySqlPool::connect(urls.split(',').next().unwrap())
            .await
            .unwrap();
        backends.push(Backend {
            name,
            store: Arc::new(store),
            floor: Some(floor),
            redis_floor: None,
            defaults: Some(Floor::MySql(
                idem::MySqlStore::new(defaults).with_table_name(BENCH_TABLE).unwrap(),
            )),
        });
    }
    if let Ok(url) = std::env::var("IDEM_TEST_REDIS_URL") {
        let store = idem::RedisStore::connect(&url).await.unwrap();
        backends.push(Backend {
            name: "Redis",
            store: Arc::new(store.clone()),
            floor: None,
            redis_floor: Some(redis_floor::RedisFloor::connect(&url, store).await),
            defaults: None,
        });
    }
    backends
}

/// The bench's SQLite file.
fn sqlite_path() -> String {
    std::env::temp_dir()
        .join(format!("idem-bench-{}.db", std::process::id()))
        .display()
        .to_string()
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
    // idem's first execution, the floor of its own statements and the seed design's
    // floor, one call of each in turn: drift in the machine or the server touches all
    // three alike.
    if let Some(floor) = &backend.floor {
        seed_floor::create(floor).await;
    }
    let mut alternated = alternate(
        calls,
        |variant, i| {
            let op = &op;
            Box::pin(async move {
                let key = format!("{run}-{i}");
                match variant {
                    0 => drop(std::hint::black_box(op.execute(key, bare(i as u64)).await.unwrap())),
                    1 => backend.by_hand(&key).await,
                    4 => seed_floor::claim_and_record(backend.defaults.as_ref().unwrap(), &key, false).await,
                    v => seed_floor::claim_and_record(backend.floor.as_ref().unwrap(), &key, v == 3).await,
                }
            })
        },
        match (&backend.floor, &backend.redis_floor, &backend.defaults) {
            (Some(_), _, Some(_)) => 5,
            (Some(_), _, None) => 4,
            (None, Some(_), _) => 2,
            (None, None, _) => 1,
        },
    )
    .await
    .into_iter();
    let first = alternated.next().unwrap();
    let floor = alternated.next();
    let seed = alternated.next();
    let seed_moving_expiry = alternated.next();
    let seed_on_defaults = alternated.next();
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
    if let Some(seed) = &seed {
        row("seed-design floor (INSERT + UPDATE)", seed, None);
    }
    if let Some(moving) = &seed_moving_expiry {
        row("seed-design floor, its UPDATE moving the expiry", moving, seed.as_ref());
    }
    if let Some(on_defaults) = &seed_on_defaults {
        row(
            "seed-design floor on a pool with sqlx's defaults (a ping before every statement)",
            on_defaults,
            seed.as_ref(),
        );
    }
    row("idem first execution", &first, floor.as_ref());
    if let Some(seed) = &seed {
        row("idem first execution, against the seed design", &first, Some(seed));
    }
    if let Some(on_defaults) = &seed_on_defaults {
        row(
            "idem first execution, against the seed design on sqlx's default pool",
            &first,
            Some(on_defaults),
        );
    }
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

mod gap;
mod growth;
mod http_layer;
mod messages;
mod messages_nats;
mod redis_floor;
mod replay;
mod sealed;
mod seed_floor;
mod storm;
mod transactional;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let calls = args
        .iter()
        .position(|a| a == "--calls")
        .and_then(|at| args.get(at + 1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(2000usize);
    if args.iter().any(|a| a == "--powertools-side") {
        let url = std::env::var("IDEM_TEST_REDIS_URL").expect("IDEM_TEST_REDIS_URL: the Redis to measure on");
        redis_floor::powertools_side(&url, calls).await;
        return;
    }
    if let Some(at) = args.iter().position(|a| a == "--storm-child") {
        storm::child(&args[at + 1..]).await;
        return;
    }
    let mut backends = backends().await;
    if args.iter().any(|a| a == "--memory-only") {
        backends.truncate(1);
    }
    report(&args, calls, &backends).await;
    drop(backends);
    // The SQLite file the run made, with its journal files.
    let file = sqlite_path();
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{file}{suffix}"));
    }
}

/// The tables `args` ask for, `calls` calls a row.
async fn report(args: &[String], calls: usize, backends: &[Backend]) {
    println!("idem bench: {calls} calls a row, one run, release build; µs per call\n");
    if args.iter().any(|a| a == "--transactional-only") {
        transactional::report(backends, calls).await;
        return;
    }
    if args.iter().any(|a| a == "--messages-only") {
        messages::report(calls).await;
        messages_nats::report(calls).await;
        return;
    }
    if args.iter().any(|a| a == "--http-only") {
        http_layer::report(backends, calls).await;
        return;
    }
    if args.iter().any(|a| a == "--storm-only") {
        storm::report(backends, &sqlite_path()).await;
        return;
    }
    if args.iter().any(|a| a == "--replay-only") {
        replay::report(backends, calls).await;
        return;
    }
    if args.iter().any(|a| a == "--gap-only") {
        gap::report(backends, calls).await;
        return;
    }
    if args.iter().any(|a| a == "--seal-only") {
        sealed::report(backends, calls).await;
        return;
    }
    println!("| backend | what | p50 µs | p99 µs | first ÷ floor (p50) |");
    println!("|---|---|---|---|---|");
    for backend in backends {
        latency(backend, calls).await;
    }
    if args.iter().any(|a| a == "--latency-only") {
        return;
    }

    transactional::report(backends, calls).await;
    http_layer::report(backends, calls).await;
    sealed::report(backends, calls).await;
    replay::report(backends, calls).await;
    gap::report(backends, calls).await;
    messages::report(calls).await;
    messages_nats::report(calls).await;

    println!("\n| backend | distinct keys/s, 1 task | 8 tasks | 64 tasks |");
    println!("|---|---|---|---|");
    for backend in backends {
        let mut cells = Vec::new();
        for tasks in [1, 8, 64] {
            cells.push(format!("{:.0}", throughput(backend, tasks, calls * 2).await));
        }
        println!("| {} | {} |", backend.name, cells.join(" | "));
    }

    storm::report(backends, &sqlite_path()).await;

    let (bytes, n) = memory_per_record().await;
    println!(
        "\nMemoryStore: {bytes} bytes of resident memory per live record ({n} records, 20-char keys, small response)"
    );

    if args.iter().any(|a| a == "--growth") {
        growth::report(backends).await;
    }
}

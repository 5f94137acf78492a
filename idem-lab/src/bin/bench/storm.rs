//! Storms: 1,000 concurrent calls on one key whose body takes 20 ms, in one process and
//! across four processes sharing the key (this one and three children of the same
//! binary, started with `--storm-child`), in processes that served calls before and in
//! processes whose first calls the storm is. How long each caller waits for its answer,
//! and how many bodies ran.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use idem::{IdempotencyStore, Idempotent};

use super::{bare, percentiles, run_id, Backend, BENCH_TABLE};

/// The body every storm call runs.
const BODY: Duration = Duration::from_millis(20);
/// Callers in all.
const CALLERS: usize = 1000;
/// Processes of the shared storm.
const PROCESSES: usize = 4;

/// What one process of a storm saw.
struct Seen {
    /// Each caller's wait, from its call to its answer.
    waits: Vec<Duration>,
    ok: usize,
    bodies: usize,
    /// From the storm's start to this process's last answer.
    last_answer: Duration,
}

/// Whether a process served calls before the storm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Process {
    /// It has: its pool holds a few connections, and its store's listener listens.
    Warm,
    /// The storm's calls are its store's first: no connection is pooled, none listens.
    Cold,
}

impl Process {
    /// How a child is told this on its command line.
    fn arg(self) -> &'static str {
        match self {
            Process::Warm => "warm",
            Process::Cold => "cold",
        }
    }

    /// The process a child is told of by `arg`.
    fn named(arg: &str) -> Option<Process> {
        [Process::Warm, Process::Cold]
            .into_iter()
            .find(|process| process.arg() == arg)
    }
}

/// `callers` concurrent calls of `key` on `store`, starting at `start` (wall clock, so
/// that processes agree on it).
async fn run(
    store: Arc<dyn IdempotencyStore>,
    key: &str,
    wait: bool,
    callers: usize,
    start: SystemTime,
    process: Process,
) -> Seen {
    let bodies = Arc::new(AtomicUsize::new(0));
    if process == Process::Warm {
        warm(&store).await;
    }
    let mut op = Idempotent::new("bench-storm").store(store);
    if wait {
        op = op.wait(Duration::from_secs(30));
    }
    let op = Arc::new(op);
    if let Ok(ahead) = start.duration_since(SystemTime::now()) {
        tokio::time::sleep(ahead).await;
    }
    let started = Instant::now();
    let handles: Vec<_> = (0..callers)
        .map(|i| {
            let (op, key, bodies) = (op.clone(), key.to_owned(), bodies.clone());
            tokio::spawn(async move {
                let began = Instant::now();
                let outcome = op
                    .execute(key, async move {
                        bodies.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(BODY).await;
                        bare(i as u64).await
                    })
                    .await;
                (began.elapsed(), outcome.is_ok())
            })
        })
        .collect();
    let mut seen = Seen {
        waits: Vec::with_capacity(callers),
        ok: 0,
        bodies: 0,
        last_answer: Duration::ZERO,
    };
    for handle in handles {
        let (took, success) = handle.await.unwrap();
        seen.waits.push(took);
        seen.ok += usize::from(success);
    }
    seen.last_answer = started.elapsed();
    seen.bodies = bodies.load(Ordering::SeqCst);
    seen
}

/// A process that has served calls before the storm: its pool holds a few connections,
/// and the store's listener (where it has one) listens.
async fn warm(store: &Arc<dyn IdempotencyStore>) {
    let _ = store.watch("bench-storm", "warm-up").await;
    let read = || store.get("bench-storm", "warm-up");
    let _ = tokio::join!(read(), read(), read(), read());
}

/// The table's rows for every backend.
pub async fn report(backends: &[Backend], sqlite_path: &str) {
    println!(
        "\n| backend | storm: 1,000 concurrent calls, one key, body 20 ms | p50 ms | p99 ms | all answered in | ÷ body | bodies run |"
    );
    println!("|---|---|---|---|---|---|---|");
    for backend in backends {
        for wait in [false, true] {
            let key = format!("{}-storm", run_id());
            let seen = run(
                backend.store.clone(),
                &key,
                wait,
                CALLERS,
                SystemTime::now(),
                Process::Warm,
            )
            .await;
            let how = if wait {
                "with `wait`, one process: every caller gets the result"
            } else {
                "no wait: duplicates get InProgress"
            };
            row(backend.name, how, seen);
        }
        // A MemoryStore is one process's; the others are the stores a child opens.
        if !["SQLite file", "PostgreSQL", "MariaDB", "Redis"].contains(&backend.name) {
            continue;
        }
        for (process, how) in [
            (
                Process::Warm,
                "with `wait`, four processes (250 callers each): every caller gets the result",
            ),
            (
                Process::Cold,
                "with `wait`, four processes whose first calls these are: every caller gets the result",
            ),
        ] {
            let seen = across_processes(backend, sqlite_path, process).await;
            row(backend.name, how, seen);
        }
    }
}

fn row(backend: &str, how: &str, seen: Seen) {
    let p = percentiles(seen.waits);
    println!(
        "| {backend} | {how} ({} Ok) | {:.2} | {:.2} | {:.0} ms | {:.1}× | {} |",
        seen.ok,
        p.p50.as_secs_f64() * 1e3,
        p.p99.as_secs_f64() * 1e3,
        seen.last_answer.as_secs_f64() * 1e3,
        seen.last_answer.as_secs_f64() / BODY.as_secs_f64(),
        seen.bodies
    );
}

/// The storm split over four processes: three children and this one, all starting at
/// one instant a second from now. Cold, this one's share runs on a store it opens
/// afresh, as the children's do.
async fn across_processes(backend: &Backend, sqlite_path: &str, process: Process) -> Seen {
    let key = format!("{}-shared-storm", run_id());
    let start = SystemTime::now() + Duration::from_secs(1);
    let start_micros = start.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_micros();
    let callers = CALLERS / PROCESSES;
    let children: Vec<_> = (1..PROCESSES)
        .map(|_| {
            tokio::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "--storm-child",
                    backend.name,
                    &key,
                    &start_micros.to_string(),
                    sqlite_path,
                    process.arg(),
                ])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("a storm child")
        })
        .collect();
    let store = match process {
        Process::Warm => backend.store.clone(),
        Process::Cold => open(backend.name, sqlite_path).await,
    };
    let mut seen = run(store, &key, true, callers, start, process).await;
    for child in children {
        let output = child.wait_with_output().await.unwrap();
        assert!(output.status.success(), "a storm child failed");
        let line = String::from_utf8(output.stdout).unwrap();
        let fields: Vec<u128> = line
            .split_whitespace()
            .skip(1)
            .map(|field| field.parse().unwrap())
            .collect();
        let [ok, bodies, last_answer, ref waits @ ..] = fields[..] else {
            panic!("a storm child printed {line:?}")
        };
        seen.ok += ok as usize;
        seen.bodies += bodies as usize;
        seen.last_answer = seen.last_answer.max(Duration::from_micros(last_answer as u64));
        seen.waits
            .extend(waits.iter().map(|micros| Duration::from_micros(*micros as u64)));
    }
    seen
}

/// A child of the shared storm: `--storm-child BACKEND KEY START_MICROS SQLITE_PATH
/// warm|cold`. Prints `STORM ok bodies last-answer-µs wait-µs…`.
pub async fn child(args: &[String]) {
    let [backend, key, start, sqlite_path, process] = args else {
        panic!("--storm-child BACKEND KEY START_MICROS SQLITE_PATH warm|cold")
    };
    let start = SystemTime::UNIX_EPOCH + Duration::from_micros(start.parse().unwrap());
    let Some(process) = Process::named(process) else {
        panic!("--storm-child: `{process}` is neither warm nor cold")
    };
    let store = open(backend, sqlite_path).await;
    let seen = run(store, key, true, CALLERS / PROCESSES, start, process).await;
    let waits: Vec<String> = seen.waits.iter().map(|wait| wait.as_micros().to_string()).collect();
    println!(
        "STORM {} {} {} {}",
        seen.ok,
        seen.bodies,
        seen.last_answer.as_micros(),
        waits.join(" ")
    );
}

/// The store of `backend` opened afresh, on the parent's table as it is: a child's, and
/// the parent's own for a cold storm.
async fn open(backend: &str, sqlite_path: &str) -> Arc<dyn IdempotencyStore> {
    let url = |var: &str| std::env::var(var).unwrap_or_else(|_| panic!("{var}: the parent's server"));
    match backend {
        "SQLite file" => Arc::new(
            idem::SqliteStore::connect(&format!("sqlite://{sqlite_path}"))
                .await
                .unwrap(),
        ),
        "PostgreSQL" => Arc::new(
            idem::PostgresStore::connect(&url("IDEM_TEST_POSTGRES_URL"))
                .await
                .unwrap()
                .with_table_name(BENCH_TABLE)
                .unwrap(),
        ),
        "MariaDB" => Arc::new(
            idem::MySqlStore::connect(&url("IDEM_TEST_MYSQL_URL"))
                .await
                .unwrap()
                .with_table_name(BENCH_TABLE)
                .unwrap(),
        ),
        "Redis" => Arc::new(idem::RedisStore::connect(&url("IDEM_TEST_REDIS_URL")).await.unwrap()),
        other => panic!("no shared storm on {other}"),
    }
}

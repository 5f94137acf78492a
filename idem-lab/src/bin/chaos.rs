//! The chaos suite: worker processes call shared keys through `#[idempotent]` while
//! faults land on a schedule; every call and every body's run is recorded, and the
//! checker (`idem_testkit::chaos`) judges the history at the end.
//!
//! ```sh
//! eval "$(.ci/start-databases)"
//! cargo run --release -p idem-lab --bin chaos -- --store "$IDEM_TEST_POSTGRES_URL" --seconds 60 \
//!     --faults kill,pause,partition,restart,skew \
//!     --restart "bash .ci/start-databases stop-postgres; bash .ci/start-databases start-postgres"
//! ```
//!
//! Workers (`--workers`, each with `--tasks` concurrent callers) call `--keys` keys at
//! random — a fresh set every 5 s — one call in 25 with another payload. A quarter of the keys run in leased mode
//! (the body writes its run into the business table), a quarter in transactional mode on
//! a SQL store (the run is written in the transaction that records the answer; leased
//! elsewhere), a quarter with steps (the run, then a notification, each a step), and a
//! quarter with a step that reconciles (`Step::reconcile`) against a business table that
//! never deduplicates: its lookup asks whether the key's run is there. Faults, each
//! in turn, one every `--every-ms`: `kill` (SIGKILL a worker, start it again), `pause` (SIGSTOP a
//! worker past its lease, then SIGCONT), `partition` (cut a worker's link to the store
//! past its lease, then heal it), `restart` (run the `--restart` command: the store's
//! server stopped and started), `skew` (step a worker's wall clock by minutes through
//! libfaketime; every worker starts with a clock of its own when `skew` is on).
//!
//! It prints the checker's verdict and a table of the faults, and exits 1 when the
//! history holds an anomaly. A body a kill, pause, partition or server restart cut off
//! *while it ran* may run again (the lease allows it) — a reconciled key's only after a
//! pause or a partition (its intent is on record before the effect); no other body may, no lease may be
//! lost by a process no fault hit, and no caller may get another answer than the first.
//! `--broken-guard N` breaks a guard on purpose (one claim in N granted a hundredth of
//! its lease): such a run must come out INVALID, or the checker is not to be trusted.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use idem::sqlx;
use idem::{idempotent, IdempotencyStore};
use idem_testkit::chaos::{check, Answer, Call, Fault, FaultKind, EVERY_PROCESS};
use idem_testkit::harness::{self, link::Link, AppError, Effects};
use idem_testkit::mutants::ShortLeases;
use rand::seq::IndexedRandom;
use rand::Rng;

type Store = Arc<dyn IdempotencyStore>;

/// How long a pause or a partition cuts a worker off: past the 4 s lease of its calls
/// and the clock tolerance (as long again, by default), so that its claims can be taken
/// over.
const CUT_OFF: Duration = Duration::from_secs(10);

/// How long one set of keys is called before the next.
const WINDOW_MS: u64 = 5_000;

#[derive(Parser, Debug, Clone)]
#[command(about = "Run idem under faults and check the history")]
struct Args {
    /// The store: sqlite://, postgres://, mysql:// or redis://.
    #[arg(long)]
    store: String,
    /// How long the workload runs.
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// Worker processes.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Concurrent callers in each worker.
    #[arg(long, default_value_t = 4)]
    tasks: usize,
    /// Keys the callers share in each 5 s of the run: a fresh set every 5 s, so bodies
    /// keep running (not only replays) while faults land, however long the run.
    #[arg(long, default_value_t = 200)]
    keys: usize,
    /// Faults to inject: kill, pause, partition, restart, skew.
    #[arg(long, value_delimiter = ',', default_value = "kill,pause,partition,skew")]
    faults: Vec<String>,
    /// A shell command that stops and starts the store's server (for `restart`).
    #[arg(long)]
    restart: Option<String>,
    /// Milliseconds between faults.
    #[arg(long, default_value_t = 2000)]
    every_ms: u64,
    /// Break a guard, to prove the checker sees what it exists for: one leased claim in
    /// N is granted a hundredth of its lease while its holder renews on the full one,
    /// so duplicates take over live bodies (no fault explains it). The run must then be
    /// INVALID.
    #[arg(long, value_name = "N")]
    broken_guard: Option<u64>,
    /// Break the reconciled keys' guard: their step runs without a policy, so a
    /// takeover after a kill charges again. The run must then be INVALID (a kill excuses
    /// no second run of a reconciled key).
    #[arg(long)]
    unreconciled: bool,
}

/// How a key is called: by its number, the same in every worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Leased: the body records its run.
    Leased,
    /// Transactional (a SQL store): the run is written in the record's transaction.
    Transactional,
    /// Leased, the effects as steps.
    Steps,
    /// Leased, the effect a step that reconciles against a table that does not
    /// deduplicate.
    Reconciled,
}

impl Mode {
    fn of(k: usize, sql: bool) -> Mode {
        match k % 4 {
            1 if sql => Mode::Transactional,
            2 => Mode::Steps,
            3 => Mode::Reconciled,
            _ => Mode::Leased,
        }
    }

    fn biz(self) -> &'static str {
        match self {
            Mode::Leased => "chaos",
            Mode::Transactional => "chaos.tx",
            Mode::Steps => "chaos.steps",
            Mode::Reconciled => "chaos.reconciled",
        }
    }
}

/// The worker's settings, from its environment.
struct Worker {
    url: String,
    effects_url: String,
    run: String,
    process: String,
    keys: usize,
    tasks: usize,
    until: Instant,
    history: PathBuf,
    /// `--broken-guard`: one claim in this many granted a short lease.
    broken_guard: Option<u64>,
    /// `--unreconciled`: the reconciled keys' step runs without its policy.
    unreconciled: bool,
    /// When this process started, and how long after the coordinator's start that was.
    started: Instant,
    started_after_ms: u64,
}

impl Worker {
    /// Milliseconds since the coordinator started (monotonic, unskewed).
    fn millis(&self) -> u64 {
        self.started_after_ms + self.started.elapsed().as_millis() as u64
    }
}

#[idempotent(key = key, biz = "chaos", store = store, payload = payload, lease = "4s", wait = "30s")]
async fn leased(
    store: &Store,
    effects: &Effects,
    run: &str,
    key: &str,
    payload: &str,
    token: String,
    process: &str,
) -> Result<String, AppError> {
    let fence = idem::context().expect("inside a call").fence();
    effects.record_run(run, key, &token, fence, process).await?;
    tokio::time::sleep(body_time(&token)).await;
    Ok(token)
}

/// Steps: the charge (the run of the key) and a notification (a run of `{key}#notify`),
/// each a step, so a takeover replays a finished one instead of running it again.
#[idempotent(key = key, biz = "chaos.steps", store = store, payload = payload, lease = "4s", wait = "30s")]
async fn stepped(
    store: &Store,
    effects: &Effects,
    run: &str,
    key: &str,
    payload: &str,
    token: String,
    process: &str,
) -> Result<String, AppError> {
    let fence = idem::context().expect("inside a call").fence();
    let charged: String = idem::step("charge", async {
        effects.record_run(run, key, &token, fence, process).await?;
        Ok::<_, AppError>(token.clone())
    })
    .await?;
    tokio::time::sleep(body_time(&token)).await;
    idem::step("notify", async {
        let notified = format!("{key}#notify");
        effects.record_run(run, &notified, &token, fence, process).await?;
        Ok::<_, AppError>(())
    })
    .await?;
    Ok(charged)
}

/// A charge at a downstream that never deduplicates (a row per request) and answers
/// slowly, as a step that reconciles: a takeover (or an error of the insert) asks
/// whether the key's run is there and answers with it instead of charging again.
#[idempotent(key = key, biz = "chaos.reconciled", store = store, payload = payload, lease = "4s", wait = "30s")]
async fn reconciled(
    store: &Store,
    effects: &Effects,
    worker: &Worker,
    key: &str,
    payload: &str,
    token: String,
) -> Result<String, AppError> {
    let (run, process) = (worker.run.as_str(), worker.process.as_str());
    let fence = idem::context().expect("inside a call").fence();
    let step = idem::Step::new("charge");
    let step = if worker.unreconciled {
        step
    } else {
        step.reconcile(|_| async move {
            Ok::<_, AppError>(match effects.run_of(run, key).await? {
                Some(token) => idem::Lookup::Done(token),
                None => idem::Lookup::NotDone,
            })
        })
    };
    // The downstream charges, then takes the body's time to answer: a kill in between
    // leaves a charge whose answer is lost.
    let charged = step
        .run(async {
            effects.record_run(run, key, &token, fence, process).await?;
            tokio::time::sleep(body_time(&token)).await;
            Ok::<_, AppError>(token.clone())
        })
        .await?;
    Ok(charged)
}

/// Transactional mode: the run is written in the transaction that claims the key and
/// records its answer, on PostgreSQL and on MariaDB.
macro_rules! transactional {
    ($name:ident, $db:ty) => {
        #[idempotent(key = key, biz = "chaos.tx", tx = tx, payload = payload, wait = "30s")]
        async fn $name(
            tx: &mut sqlx::Transaction<'_, $db>,
            insert: &str,
            run: &str,
            key: &str,
            payload: &str,
            token: String,
            process: &str,
        ) -> Result<String, AppError> {
            let fence = idem::context().expect("inside a call").fence();
            sqlx::query(insert)
                .bind(run)
                .bind(key)
                .bind(&token)
                .bind(i64::try_from(fence).unwrap_or(i64::MAX))
                .bind(process)
                .execute(&mut **tx)
                .await?;
            tokio::time::sleep(body_time(&token)).await;
            Ok(token)
        }
    };
}
transactional!(transactional_pg, sqlx::Postgres);
transactional!(transactional_my, sqlx::MySql);

/// A pool for transactional calls, when the store is PostgreSQL or MariaDB.
enum TxPool {
    Postgres(sqlx::PgPool),
    MySql(sqlx::MySqlPool),
}

impl TxPool {
    async fn open(url: &str) -> Option<TxPool> {
        let (max, acquire) = (8, Duration::from_secs(3));
        if url.starts_with("postgres") {
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(max)
                .acquire_timeout(acquire);
            Some(TxPool::Postgres(pool.connect_lazy(url).ok()?))
        } else if url.starts_with("mysql") {
            let pool = sqlx::mysql::MySqlPoolOptions::new()
                .max_connections(max)
                .acquire_timeout(acquire);
            Some(TxPool::MySql(pool.connect_lazy(url).ok()?))
        } else {
            None
        }
    }

    async fn call(
        &self,
        insert: &str,
        run: &str,
        key: &str,
        payload: &str,
        token: String,
        process: &str,
    ) -> Result<String, AppError> {
        match self {
            TxPool::Postgres(pool) => {
                let mut tx = pool.begin().await?;
                let answer = transactional_pg(&mut tx, insert, run, key, payload, token, process).await?;
                tx.commit().await?;
                Ok(answer)
            }
            TxPool::MySql(pool) => {
                let mut tx = pool.begin().await?;
                let answer = transactional_my(&mut tx, insert, run, key, payload, token, process).await?;
                tx.commit().await?;
                Ok(answer)
            }
        }
    }
}

/// How long a body works: 20–200 ms, so duplicates and faults meet it running.
fn body_time(token: &str) -> Duration {
    let spread = token
        .bytes()
        .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
    Duration::from_millis(20 + spread % 180)
}

fn answer_of(outcome: Result<String, AppError>) -> Answer {
    match outcome {
        Ok(token) => Answer::Ok(token),
        Err(AppError::Idem(idem::Error::InProgress { .. })) => Answer::InProgress,
        Err(AppError::Idem(idem::Error::PayloadMismatch { .. })) => Answer::PayloadMismatch,
        Err(AppError::Idem(idem::Error::LeaseLost { .. })) => Answer::LeaseLost,
        Err(error) => Answer::Failed(error.to_string()),
    }
}

/// A worker process: its callers call keys at random until its time is up, each call
/// written to its history file as it ends.
fn work(worker: Worker) {
    let runtime = harness::worker_runtime();
    runtime.block_on(async {
        let mut store = harness::open_store(&worker.url).await;
        if let Some(every) = worker.broken_guard {
            store = Arc::new(ShortLeases::new(store, every));
        }
        let effects = Effects::open(&worker.effects_url).await;
        let tx_pool = Arc::new(TxPool::open(&worker.url).await);
        let insert = Arc::new(effects.run_insert());
        let history = Arc::new(std::sync::Mutex::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&worker.history)
                .unwrap(),
        ));
        let worker = Arc::new(worker);
        let callers: Vec<_> = (0..worker.tasks)
            .map(|task| {
                let (store, effects, tx_pool, insert, history, worker) = (
                    store.clone(),
                    effects.clone(),
                    tx_pool.clone(),
                    insert.clone(),
                    history.clone(),
                    worker.clone(),
                );
                tokio::spawn(async move {
                    let mut n = 0u64;
                    while Instant::now() < worker.until {
                        n += 1;
                        let (k, other) = {
                            let mut rng = rand::rng();
                            (rng.random_range(0..worker.keys), rng.random_ratio(1, 25))
                        };
                        // A fresh set of keys every 5 s, on the run's (unskewed) clock.
                        let key = format!("{}-{}-{k}", worker.run, worker.millis() / WINDOW_MS);
                        let payload = if other { "other" } else { "first" };
                        let token = format!("{}.{task}.{n}", worker.process);
                        let own = token.clone();
                        let start_ms = worker.millis();
                        let (run, process) = (&worker.run, &worker.process);
                        let mode = Mode::of(k, tx_pool.is_some());
                        let outcome = match (mode, tx_pool.as_ref()) {
                            (Mode::Transactional, Some(pool)) => {
                                pool.call(&insert, run, &key, payload, token, process).await
                            }
                            (Mode::Steps, _) => stepped(&store, &effects, run, &key, payload, token, process).await,
                            (Mode::Reconciled, _) => reconciled(&store, &effects, &worker, &key, payload, token).await,
                            _ => leased(&store, &effects, run, &key, payload, token, process).await,
                        };
                        let call = Call::new(&key, payload, &worker.process, answer_of(outcome)).ran(
                            &own,
                            start_ms,
                            worker.millis(),
                        );
                        let call = if mode == Mode::Reconciled {
                            call.reconciled()
                        } else {
                            call
                        };
                        let line = serde_json::to_string(&call).unwrap();
                        let mut file = history.lock().unwrap();
                        writeln!(file, "{line}").unwrap();
                        file.flush().unwrap();
                    }
                })
            })
            .collect();
        for caller in callers {
            let _ = caller.await;
        }
    });
}

/// The coordinator's view of one worker slot.
struct Slot {
    child: Child,
    process: String,
    incarnation: u32,
    link: Option<Link>,
    clock: PathBuf,
}

/// A URL with its port replaced by `port`.
fn through(url: &str, port: u16) -> String {
    let original = harness::url_port(url);
    url.replacen(&format!(":{original}"), &format!(":{port}"), 1)
}

struct Coordinator {
    args: Args,
    run: String,
    dir: PathBuf,
    libfaketime: Option<&'static str>,
    started: Instant,
    until: Instant,
}

impl Coordinator {
    /// Milliseconds since the run started: the clock of every call and fault.
    fn millis(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// A fault on `process` of `kind` that began at `start_ms` and ends now.
    fn fault(&self, process: &str, kind: FaultKind, start_ms: u64) -> Fault {
        Fault {
            process: process.to_owned(),
            kind,
            start_ms,
            end_ms: self.millis(),
        }
    }

    fn spawn(&self, i: usize, incarnation: u32, link: &Option<Link>, clock: &Path) -> Child {
        let process = format!("w{i}#{incarnation}");
        let url = link
            .as_ref()
            .map_or(self.args.store.clone(), |link| through(&self.args.store, link.port()));
        let remaining = self.until.saturating_duration_since(Instant::now());
        let mut command = Command::new(std::env::current_exe().unwrap());
        command
            .env("IDEM_CHAOS_WORKER", "1")
            .env("CHAOS_URL", url)
            .env("CHAOS_EFFECTS_URL", &self.args.store)
            .env("CHAOS_RUN", &self.run)
            .env("CHAOS_PROCESS", &process)
            .env("CHAOS_KEYS", self.args.keys.to_string())
            .env("CHAOS_TASKS", self.args.tasks.to_string())
            .env("CHAOS_MILLIS", remaining.as_millis().to_string())
            .env("CHAOS_HISTORY", self.dir.join(format!("history-{process}.jsonl")))
            .env("CHAOS_STARTED_AFTER_MS", self.millis().to_string())
            .env(
                "CHAOS_BROKEN_GUARD",
                self.args.broken_guard.map(|n| n.to_string()).unwrap_or_default(),
            )
            .env("CHAOS_UNRECONCILED", if self.args.unreconciled { "1" } else { "0" })
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        if let Some(libfaketime) = self.libfaketime {
            // The worker's clock offset is read from a file, again every second: a
            // clock step is a write to it.
            harness::stepped_by(&mut command, libfaketime, clock);
        }
        command.spawn().expect("start a chaos worker")
    }
}

fn signal(child: &Child, name: &str) {
    let status = Command::new("kill")
        .args([name, &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill {name} failed");
}

fn main() {
    if std::env::var_os("IDEM_CHAOS_WORKER").is_some() {
        let setting = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("worker without {name}"));
        return work(Worker {
            url: setting("CHAOS_URL"),
            effects_url: setting("CHAOS_EFFECTS_URL"),
            run: setting("CHAOS_RUN"),
            process: setting("CHAOS_PROCESS"),
            keys: setting("CHAOS_KEYS").parse().unwrap(),
            tasks: setting("CHAOS_TASKS").parse().unwrap(),
            until: Instant::now() + Duration::from_millis(setting("CHAOS_MILLIS").parse().unwrap()),
            history: setting("CHAOS_HISTORY").into(),
            broken_guard: setting("CHAOS_BROKEN_GUARD").parse().ok(),
            unreconciled: setting("CHAOS_UNRECONCILED") == "1",
            started: Instant::now(),
            started_after_ms: setting("CHAOS_STARTED_AFTER_MS").parse().unwrap(),
        });
    }
    let args = Args::parse();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let _guard = runtime.enter();
    let run = format!("chaos-{}-{}", std::process::id(), harness::epoch_millis());
    let dir = std::env::temp_dir().join(&run);
    std::fs::create_dir_all(&dir).unwrap();
    let faults: HashSet<&str> = args.faults.iter().map(String::as_str).collect();
    for fault in &faults {
        assert!(
            ["kill", "pause", "partition", "restart", "skew"].contains(fault),
            "unknown fault `{fault}`: use kill, pause, partition, restart, skew"
        );
    }
    assert!(
        !faults.contains("restart") || args.restart.is_some(),
        "the `restart` fault needs --restart (a command that stops and starts the store's server)"
    );
    let libfaketime = if faults.contains("skew") {
        Some(harness::libfaketime().expect("the `skew` fault needs libfaketime (apt-get install faketime)"))
    } else {
        None
    };
    // The store's table and the business table, made before any worker starts.
    let (store, effects) =
        runtime.block_on(async { (harness::open_store(&args.store).await, Effects::open(&args.store).await) });
    let partitions = faults.contains("partition") && !args.store.starts_with("sqlite");
    let coordinator = Coordinator {
        started: Instant::now(),
        until: Instant::now() + Duration::from_secs(args.seconds),
        args: args.clone(),
        run: run.clone(),
        dir: dir.clone(),
        libfaketime,
    };
    let started = Instant::now();
    let mut slots: Vec<Slot> = (0..args.workers)
        .map(|i| {
            let link = partitions.then(|| runtime.block_on(Link::to(harness::url_port(&args.store))));
            let clock = dir.join(format!("clock-{i}"));
            // Every worker starts with a clock of its own, minutes apart.
            let skew = if libfaketime.is_some() {
                [-300, -60, 0, 60, 300][i % 5]
            } else {
                0
            };
            harness::set_clock(&clock, skew);
            let child = coordinator.spawn(i, 1, &link, &clock);
            Slot {
                child,
                process: format!("w{i}#1"),
                incarnation: 1,
                link,
                clock,
            }
        })
        .collect();

    let mut injected: Vec<Fault> = Vec::new();
    let mut counts: HashMap<&str, usize> = HashMap::new();
    let enabled: Vec<&str> = ["kill", "pause", "partition", "restart", "skew"]
        .into_iter()
        .filter(|f| faults.contains(f) && (*f != "partition" || partitions))
        .collect();
    while Instant::now() + Duration::from_millis(args.every_ms) < coordinator.until && !enabled.is_empty() {
        std::thread::sleep(Duration::from_millis(args.every_ms));
        // Each fault in turn, on a worker drawn at random.
        let fault = enabled[counts.values().sum::<usize>() % enabled.len()];
        let i = rand::rng().random_range(0..slots.len());
        let slot = &mut slots[i];
        let start_ms = coordinator.millis();
        match fault {
            "kill" => {
                signal(&slot.child, "-KILL");
                let _ = slot.child.wait();
                injected.push(coordinator.fault(&slot.process, FaultKind::Kill, start_ms));
                slot.incarnation += 1;
                slot.process = format!("w{i}#{}", slot.incarnation);
                slot.child = coordinator.spawn(i, slot.incarnation, &slot.link, &slot.clock);
            }
            "pause" => {
                signal(&slot.child, "-STOP");
                std::thread::sleep(CUT_OFF);
                signal(&slot.child, "-CONT");
                injected.push(coordinator.fault(&slot.process, FaultKind::Pause, start_ms));
            }
            "partition" => {
                let link = slot.link.as_ref().expect("a partitioned worker has a link");
                link.cut();
                std::thread::sleep(CUT_OFF);
                link.heal();
                injected.push(coordinator.fault(&slot.process, FaultKind::Partition, start_ms));
            }
            "restart" => {
                let command = args.restart.as_deref().unwrap();
                let status = Command::new("bash")
                    .args(["-c", command])
                    .stdout(Stdio::null())
                    .status()
                    .unwrap();
                assert!(status.success(), "the restart command failed: {command}");
                injected.push(coordinator.fault(EVERY_PROCESS, FaultKind::Restart, start_ms));
            }
            "skew" => {
                let step = *[-300i64, -180, -60, 60, 180, 300].choose(&mut rand::rng()).unwrap();
                harness::set_clock(&slot.clock, step);
                injected.push(coordinator.fault(&slot.process, FaultKind::ClockStep, start_ms));
            }
            _ => unreachable!(),
        }
        *counts.entry(fault).or_default() += 1;
    }
    for slot in &mut slots {
        // A worker still running well past the end is stuck: killed, and its calls cut off.
        let deadline = Instant::now() + Duration::from_secs(60);
        while slot.child.try_wait().unwrap().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        if slot.child.try_wait().unwrap().is_none() {
            let start_ms = coordinator.millis();
            signal(&slot.child, "-KILL");
            let _ = slot.child.wait();
            injected.push(coordinator.fault(&slot.process, FaultKind::Kill, start_ms));
        }
    }
    let elapsed = started.elapsed();

    let mut calls = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "jsonl") {
            for line in std::io::BufReader::new(std::fs::File::open(&path).unwrap()).lines() {
                calls.push(serde_json::from_str::<Call>(&line.unwrap()).unwrap());
            }
        }
    }
    let runs = runtime.block_on(effects.runs(&run));
    let keys: HashSet<&str> = calls.iter().map(|c| c.key.as_str()).collect();
    let records: HashMap<String, Option<String>> = runtime.block_on(async {
        let mut records = HashMap::new();
        for key in keys {
            let k: usize = key.rsplit('-').next().unwrap().parse().unwrap();
            let sql = args.store.starts_with("postgres") || args.store.starts_with("mysql");
            let biz = Mode::of(k, sql).biz();
            let record = store.get(biz, key).await.unwrap();
            let answer = record
                .filter(|r| r.status == idem::Status::Succeeded)
                .and_then(|r| r.response_body)
                .and_then(|body| serde_json::from_str::<String>(&body).ok());
            records.insert(key.to_owned(), answer);
        }
        records
    });
    let verdict = check(&calls, &runs, &records, &injected);
    println!(
        "chaos on {}: {} workers x {} tasks, {} keys every 5 s, {:.0?}",
        idem::store::redacted_url(&args.store),
        args.workers,
        args.tasks,
        args.keys,
        elapsed
    );
    println!("| kills | pauses | partitions | restarts | clock steps |");
    println!("|---|---|---|---|---|");
    let count = |fault| counts.get(fault).copied().unwrap_or(0);
    println!(
        "| {} | {} | {} | {} | {} |",
        count("kill"),
        count("pause"),
        count("partition"),
        count("restart"),
        count("skew")
    );
    print!("{verdict}");
    let _ = std::fs::remove_dir_all(&dir);
    if !verdict.valid() {
        std::process::exit(1);
    }
}

//! Tools of the cross-process tests: the business effect a body writes into the same
//! database, and worker processes (this very test binary, re-run on one test).

pub mod failover;
pub mod link;

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sqlx::AnyPool;

/// The application's error: its own database failing, or idem.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// idem's error.
    #[error(transparent)]
    Idem(#[from] idem::Error),
    /// The business's own database failed.
    #[error("business write failed: {0}")]
    Effect(#[from] sqlx::Error),
}

/// The business table, `storm_effect(run_id, k, token)`: one row per execution of a
/// body. Exactly-once means exactly one row per key. On sqlx's `Any` driver, so one
/// piece of code serves the three databases.
#[derive(Clone)]
pub struct Effects {
    pool: AnyPool,
    numbered: bool,
    /// On a Galera node: reads wait for what the cluster committed before them.
    causal: bool,
}

impl Effects {
    /// The business table in the database at `url` (created if missing).
    pub async fn open(url: &str) -> Self {
        Self::open_waiting(url, Duration::from_secs(30)).await
    }

    /// Like [`open`](Self::open), giving up on a connection after `acquire`: the
    /// business fails fast, as the store does, while its server is down.
    pub async fn open_waiting(url: &str, acquire: Duration) -> Self {
        sqlx::any::install_default_drivers();
        // Records in Redis: the business lives in a SQLite file every process shares.
        let shared_file = format!(
            "sqlite://{}",
            std::env::temp_dir().join("idem-redis-effects.db").display()
        );
        let url = if url.starts_with("redis") {
            shared_file.as_str()
        } else {
            url
        };
        let url = if url.starts_with("sqlite") {
            format!("{url}?mode=rwc")
        } else {
            url.to_owned()
        };
        let mut effects = Effects {
            pool: sqlx::any::AnyPoolOptions::new()
                .acquire_timeout(acquire)
                .connect(&url)
                .await
                .unwrap(),
            numbered: url.starts_with("postgres"),
            causal: false,
        };
        if url.starts_with("mysql") {
            let wsrep: Option<(String, String)> = sqlx::query_as("SHOW VARIABLES LIKE 'wsrep_on'")
                .fetch_optional(&effects.pool)
                .await
                .unwrap();
            effects.causal = wsrep.is_some_and(|(_, on)| on == "ON");
        }
        create_table(&effects.pool, CREATE_EFFECTS).await;
        create_table(&effects.pool, CREATE_RUNS).await;
        effects
    }

    /// A body's run of `key` in `process`, under `fence`, answering `token`: one row of
    /// `chaos_effect`, for the chaos checker.
    pub async fn record_run(
        &self,
        run: &str,
        key: &str,
        token: &str,
        fence: u64,
        process: &str,
    ) -> Result<(), sqlx::Error> {
        let insert = self.run_insert();
        sqlx::query(&insert)
            .bind(run)
            .bind(key)
            .bind(token)
            .bind(i64::try_from(fence).unwrap_or(i64::MAX))
            .bind(process)
            .execute(&self.pool)
            .await
            .map(drop)
    }

    /// The statement of [`record_run`](Self::record_run), in this database's
    /// placeholders, for a body that writes its run in its own transaction.
    pub fn run_insert(&self) -> String {
        self.sql("INSERT INTO chaos_effect (run_id, k, token, fence, process) VALUES (?, ?, ?, ?, ?)")
    }

    /// The token of the first body's run of `key` in `run`, if a body ran it: what a
    /// chaos run's reconciling lookup asks ("did this key's charge happen?").
    pub async fn run_of(&self, run: &str, key: &str) -> Result<Option<String>, sqlx::Error> {
        let select = "SELECT token FROM chaos_effect WHERE run_id = ? AND k = ? ORDER BY fence LIMIT 1";
        let select = if self.causal {
            format!("SET STATEMENT wsrep_sync_wait = 1 FOR {select}")
        } else {
            self.sql(select)
        };
        let row: Option<(String,)> = sqlx::query_as(&select)
            .bind(run)
            .bind(key)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|(token,)| token))
    }

    /// Every body's run in `run`, as the chaos checker reads them.
    pub async fn runs(&self, run: &str) -> Vec<crate::chaos::Effect> {
        let select = "SELECT k, token, fence, process FROM chaos_effect WHERE run_id = ?";
        let rows: Vec<(String, String, i64, String)> = sqlx::query_as(&self.sql(select))
            .bind(run)
            .fetch_all(&self.pool)
            .await
            .unwrap();
        rows.into_iter()
            .map(|(key, token, fence, process)| crate::chaos::Effect {
                key,
                token,
                fence: u64::try_from(fence).unwrap_or_default(),
                process,
            })
            .collect()
    }

    fn sql(&self, text: &str) -> String {
        if self.numbered {
            idem::sql::numbered(text)
        } else {
            text.to_owned()
        }
    }

    /// Run `text` (with `?` placeholders) bound to `binds`, as an operator would by hand.
    pub async fn execute(&self, text: &str, binds: &[&str]) -> Result<u64, sqlx::Error> {
        let sql = self.sql(text);
        let mut query = sqlx::query(&sql);
        for bind in binds {
            query = query.bind(*bind);
        }
        query.execute(&self.pool).await.map(|done| done.rows_affected())
    }

    /// The business effect: one row.
    pub async fn record(&self, run: &str, key: &str, token: &str) -> Result<(), sqlx::Error> {
        sqlx::query(&self.sql("INSERT INTO storm_effect (run_id, k, token) VALUES (?, ?, ?)"))
            .bind(run)
            .bind(key)
            .bind(token)
            .execute(&self.pool)
            .await
            .map(drop)
    }

    /// Every token written in `run`, by key.
    pub async fn tokens(&self, run: &str) -> HashMap<String, Vec<String>> {
        let select = "SELECT k, token FROM storm_effect WHERE run_id = ?";
        let select = if self.causal {
            format!("SET STATEMENT wsrep_sync_wait = 1 FOR {select}")
        } else {
            self.sql(select)
        };
        let rows: Vec<(String, String)> = sqlx::query_as(&select).bind(run).fetch_all(&self.pool).await.unwrap();
        let mut by_key: HashMap<String, Vec<String>> = HashMap::new();
        for (key, token) in rows {
            by_key.entry(key).or_default().push(token);
        }
        by_key
    }
}

/// Runs `create`, a `CREATE TABLE IF NOT EXISTS`. Concurrent ones race on PostgreSQL's
/// catalog (a duplicate key in `pg_type`, or the relation that already exists) and on a
/// SQLite file's lock: the loser runs it again, and then finds the winner's table.
async fn create_table(pool: &AnyPool, create: &str) {
    let mut tries = 0;
    while let Err(error) = sqlx::query(create).execute(pool).await {
        tries += 1;
        assert!(tries < 5, "could not create a test table ({tries} tries): {error}");
        tokio::time::sleep(Duration::from_millis(20 * tries)).await;
    }
}

/// The business table of `Effects`.
const CREATE_EFFECTS: &str = "CREATE TABLE IF NOT EXISTS storm_effect (run_id VARCHAR(128) NOT NULL, \
     k VARCHAR(255) NOT NULL, token VARCHAR(255) NOT NULL)";

/// The table of bodies' runs a chaos run writes (`Effects::record_run`).
const CREATE_RUNS: &str = "CREATE TABLE IF NOT EXISTS chaos_effect (run_id VARCHAR(128) NOT NULL, \
     k VARCHAR(255) NOT NULL, token VARCHAR(255) NOT NULL, fence BIGINT NOT NULL, process VARCHAR(64) NOT NULL)";

/// The store at `url`: Redis for `redis://`, else the SQL store of the URL's kind
/// (its table migrated). A server that refuses the first connections (a cluster node
/// whose listener is flooded by a storm's processes all starting at once) is tried
/// again for up to 10 s; then its last error fails the process.
pub async fn open_store(url: &str) -> std::sync::Arc<dyn idem::IdempotencyStore> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let opened = if url.starts_with("redis") {
            idem::RedisStore::connect(url)
                .await
                .map(|store| std::sync::Arc::new(store) as std::sync::Arc<dyn idem::IdempotencyStore>)
        } else {
            idem::sql::open(url).await
        };
        match opened {
            Ok(store) => return store,
            Err(error) if std::time::Instant::now() < deadline => {
                eprintln!("opening the store failed, trying again: {error}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(error) => panic!("open the store: {error:?}"),
        }
    }
}

/// A PostgreSQL store at `url` (its table migrated) for a server the test stops,
/// restarts or fails over: its pool gives up waiting for a connection after 2 s, so a
/// call fails with a store error instead of hanging while the server is away.
pub async fn postgres_store_across_restarts(url: &str) -> idem::PostgresStore {
    let pool = idem::sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(std::time::Duration::from_secs(2))
        .connect(url)
        .await
        .expect("connect to PostgreSQL");
    let store = idem::PostgresStore::new(pool);
    store.migrate().await.expect("migrate");
    store
}

/// The environment variable that makes a test binary a worker of `role`.
const ROLE: &str = "IDEM_WORKER_ROLE";

/// The worker's settings when this process was started as a worker of `role`.
pub fn worker_settings(role: &str) -> Option<HashMap<String, String>> {
    (std::env::var(ROLE).ok()? == role).then(|| std::env::vars().collect())
}

/// A command that re-runs this test binary as a worker of `role` running `test`.
pub fn worker(role: &str, test: &str, settings: &[(&str, String)]) -> Command {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .envs(settings.iter().map(|(name, value)| (*name, value)))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    command
}

/// Start a worker of `role` running `test`, and read what it says until a line holds
/// `marker`: the worker, the rest of what it will say, and that line.
pub fn start_worker(
    role: &str,
    test: &str,
    settings: &[(&str, String)],
    marker: &str,
) -> (
    std::process::Child,
    std::io::BufReader<std::process::ChildStdout>,
    String,
) {
    use std::io::BufRead;
    let mut child = worker(role, test, settings).spawn().unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while out.read_line(&mut line).unwrap() > 0 {
        if line.contains(marker) {
            return (child, out, line);
        }
        line.clear();
    }
    panic!("the {role} worker ended before saying {marker}: {:?}", child.wait());
}

/// A setting the coordinator passed to this worker.
pub fn setting(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("worker without {name}"))
}

/// The runtime a worker process runs on.
pub fn worker_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Milliseconds since the epoch, for start barriers shared by processes.
pub fn epoch_millis() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

/// Sleep until `epoch_millis` (a start barrier).
pub async fn sleep_until_epoch_millis(at: u64) {
    let now = epoch_millis();
    if at > now {
        tokio::time::sleep(Duration::from_millis(at - now)).await;
    }
}

/// Print lines that the coordinator reads, past libtest's capture; on a line of their
/// own, since libtest leaves `test name ... ` open while the test runs.
pub fn report(lines: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "\n{lines}");
}

/// Say a figure in the CI log, past libtest's capture.
pub fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// The URLs of the backends this machine has: a SQLite file always, the servers when
/// their URLs are set (or, under CI, a failure when they are not).
pub fn backend_url(backend: &str, name: &str) -> Option<String> {
    match backend {
        "sqlite" => {
            let path = crate::scratch::path(&format!("{name}.db"));
            Some(format!("sqlite://{}", path.display()))
        }
        "postgres" => crate::conformance::server_url("IDEM_TEST_POSTGRES_URL", "PostgreSQL"),
        "redis" => crate::conformance::server_url("IDEM_TEST_REDIS_URL", "Redis"),
        // One URL per node, comma-separated.
        "galera" => crate::conformance::server_url("IDEM_TEST_GALERA_URLS", "Galera"),
        _ => crate::conformance::server_url("IDEM_TEST_MYSQL_URL", "MySQL/MariaDB"),
    }
}

/// A database's address, as a service reaches it (a virtual IP, a proxy, a DNS name):
/// connections to the returned port are forwarded to the port in `target`, read at
/// each new connection. A failover points it at another server.
pub async fn forwarder(target: std::sync::Arc<std::sync::atomic::AtomicU16>) -> u16 {
    use tokio::net::{TcpListener, TcpStream};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((mut client, _)) = listener.accept().await else {
                continue;
            };
            let target = target.load(std::sync::atomic::Ordering::SeqCst);
            tokio::spawn(async move {
                if let Ok(mut server) = TcpStream::connect(("127.0.0.1", target)).await {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                }
            });
        }
    });
    port
}

/// Debian's libfaketime (package `faketime`), multi-threaded build: preloaded into a
/// worker, it moves that process's wall clock (`SystemTime`) and nothing else.
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

/// libfaketime's path when this machine has it; under CI its absence fails the test
/// (`.ci/run` installs it), elsewhere the test is skipped, and said so once.
pub fn libfaketime() -> Option<&'static str> {
    if std::path::Path::new(LIBFAKETIME).exists() {
        return Some(LIBFAKETIME);
    }
    if std::env::var_os("CI").is_some() {
        panic!("{LIBFAKETIME} is missing: CI must run the clock-skew tests (apt-get install faketime)");
    }
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| say("NOT RUN: the clock-skew tests need libfaketime (apt-get install faketime)"));
    None
}

/// Run `command` with its wall clock `skew_secs` seconds off this host's (ahead when
/// positive), through libfaketime; its monotonic clock (tokio's timers) is left alone.
/// The worker learns the skew too (`IDEM_SKEW_SECS`), to meet start barriers set by
/// this host's clock.
pub fn skewed(command: &mut Command, libfaketime: &str, skew_secs: i64) {
    command
        .env("LD_PRELOAD", libfaketime)
        .env("FAKETIME", format!("{skew_secs:+}"))
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .env("FAKETIME_NO_CACHE", "1")
        .env("IDEM_SKEW_SECS", skew_secs.to_string());
}

/// Run `command` with its wall clock set by the file `clock` (an offset such as `+0` or
/// `+60`, in seconds), through libfaketime, which reads it again every second: writing
/// the file steps the running process's wall clock, as an NTP step or a resumed VM
/// would. Its monotonic clock (tokio's timers) is left alone.
pub fn stepped_by(command: &mut Command, libfaketime: &str, clock: &std::path::Path) {
    command
        .env("LD_PRELOAD", libfaketime)
        .env("FAKETIME_TIMESTAMP_FILE", clock)
        .env("FAKETIME_CACHE_DURATION", "1")
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
}

/// One call through `store` that must fail before its body runs: the error's whole
/// chain (asserted: no body ran).
pub async fn refused_before_the_body(store: std::sync::Arc<dyn idem::IdempotencyStore>) -> String {
    let runs = std::sync::atomic::AtomicUsize::new(0);
    let outcome: Result<u32, idem::Error> = idem::Idempotent::new("refused")
        .store(store)
        .execute("k", async {
            runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(1)
        })
        .await;
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 0, "no body ran");
    idem::error_chain(&outcome.expect_err("the call was refused"))
}

/// Set the clock file of a process run [`stepped_by`] it to `offset_secs` (`+60`, `-300`):
/// written beside it and renamed into place, so libfaketime, which reads it again every
/// second, never reads it half written (an emptied file read mid-write left a step
/// unseen).
pub fn set_clock(clock: &std::path::Path, offset_secs: i64) {
    let mut next = clock.as_os_str().to_owned();
    next.push(".next");
    std::fs::write(&next, format!("{offset_secs:+}")).expect("write the clock file");
    std::fs::rename(&next, clock).expect("move the clock file into place");
}

/// This process's clock skew as its coordinator set it (0 when none).
pub fn own_skew_secs() -> i64 {
    std::env::var("IDEM_SKEW_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// Sleep until `at` (epoch milliseconds by the coordinator's clock), on a clock
/// skewed by [`own_skew_secs`].
pub async fn sleep_until_coordinator_millis(at: u64) {
    sleep_until_epoch_millis(at.saturating_add_signed(own_skew_secs() * 1000)).await;
}

/// The port of a database URL (`scheme://user@host:PORT/db`).
pub fn url_port(url: &str) -> u16 {
    url.rsplit(':')
        .next()
        .and_then(|rest| rest.split('/').next())
        .and_then(|port| port.parse().ok())
        .unwrap_or_else(|| panic!("no port in {url}"))
}

/// A TCP port on 127.0.0.1 that was free a moment ago, for a server a test starts —
/// below Linux's ephemeral range (32768–60999), so that a server started again on it
/// after a kill never finds it held by some client connection's local end.
pub fn free_port() -> u16 {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos()
        ^ std::process::id().wrapping_mul(7919);
    (0..2000u32)
        .map(|attempt| 20000 + ((seed.wrapping_add(attempt.wrapping_mul(4099))) % 12000) as u16)
        .find(|port| std::net::TcpListener::bind(("127.0.0.1", *port)).is_ok())
        .expect("a free port below the ephemeral range")
}

/// Wait (at most 30 s) until something listens on 127.0.0.1:`port`; `what` names it
/// in the failure.
pub fn until_listening(port: u16, what: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "{what} did not start listening on {port}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether the connection `pool` lends next is inside a transaction, as one whose
/// `BEGIN` was cut off mid-round trip and handed back to the pool is. Give the pool one
/// connection, so that it is the one the cut call used.
pub async fn lends_inside_a_transaction(pool: &sqlx::PgPool) -> bool {
    // A simple query is one message: outside a transaction both instants are its receipt.
    let row = sqlx::raw_sql("SELECT now() = statement_timestamp()")
        .fetch_one(pool)
        .await
        .expect("the pool's connection answers");
    let fresh: bool = sqlx::Row::get(&row, 0);
    !fresh
}

/// Drive `call` until it has waited `waits` times (each time it was polled and not
/// ready: a round trip under way, a connection awaited), then drop it there, as a caller
/// that gives up does: `None`. Its output if it ended first. Cuts placed by waits, not by
/// a timer, fall at the same point of the call however loaded the machine is.
pub async fn cut_after_waits<F: std::future::Future>(call: F, waits: usize) -> Option<F::Output> {
    driven(call, Some(waits)).await.0
}

/// Calls of one kind cut at each point they wait at, in turn ([`cut_after_waits`]),
/// with a whole run between rounds: turn after turn, a call is dropped at its first
/// wait, its second, … up to the most any whole run of them waited, and then run whole.
/// Each whole run teaches the most waits anew, so a call that waits more on one turn
/// than the first whole one did is still cut at its later points.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// use std::time::Duration;
/// use idem_testkit::harness::Cuts;
///
/// let three_waits = || async {
///     for _ in 0..3 {
///         tokio::time::sleep(Duration::from_millis(1)).await;
///     }
/// };
/// let mut cuts = Cuts::default();
/// for _ in 0..8 {
///     cuts.next(three_waits()).await;
/// }
/// assert_eq!((cuts.points(), cuts.cut()), (3, 6)); // whole, 1, 2, 3, whole, 1, 2, 3
/// # });
/// ```
#[derive(Debug, Default)]
pub struct Cuts {
    /// The wait the next call is cut at; none: run it whole.
    at: Option<usize>,
    points: usize,
    cut: usize,
}

impl Cuts {
    /// Run `call` cut at this turn's point, or whole on the turn after the last point:
    /// `None` when it was cut.
    pub async fn next<F: std::future::Future>(&mut self, call: F) -> Option<F::Output> {
        let (output, waited) = driven(call, self.at).await;
        match output {
            Some(_) => self.points = self.points.max(waited),
            None => self.cut += 1,
        }
        self.at = match self.at {
            None => (self.points > 0).then_some(1),
            Some(at) => (at < self.points).then_some(at + 1),
        };
        output
    }

    /// The most waits a whole call has made so far: the points it is cut at.
    pub fn points(&self) -> usize {
        self.points
    }

    /// How many calls were cut.
    pub fn cut(&self) -> usize {
        self.cut
    }
}

/// `call` driven to its end, or dropped at its `cut_at`-th wait; and how often it waited.
async fn driven<F: std::future::Future>(call: F, cut_at: Option<usize>) -> (Option<F::Output>, usize) {
    let mut call = std::pin::pin!(call);
    let mut waited = 0;
    std::future::poll_fn(|cx| match call.as_mut().poll(cx) {
        std::task::Poll::Ready(output) => std::task::Poll::Ready((Some(output), waited)),
        std::task::Poll::Pending if cut_at == Some(waited + 1) => std::task::Poll::Ready((None, waited + 1)),
        std::task::Poll::Pending => {
            waited += 1;
            std::task::Poll::Pending
        }
    })
    .await
}

//! Processes whose wall clocks disagree by minutes (libfaketime), on every server
//! store: a call holds its key for 4 s; a process 5 minutes ahead calls the same key
//! 1 s later and waits for the first answer instead of taking the running body over;
//! a process 5 minutes behind replays it; a record a skewed process completes expires
//! a TTL after the store's completion. (The skewed storms are in `tests/storm.rs`.)

use idem_testkit::conformance;
use idem_testkit::harness;

use std::io::{BufRead, BufReader};
use std::time::{Duration, SystemTime};

use harness::{AppError, Effects};
use idem::{idempotent, IdempotencyStore};

type Store = std::sync::Arc<dyn IdempotencyStore>;

const TTL: Duration = Duration::from_secs(3600);

/// The body: one business row, then `hang`, under a 2 s lease its heartbeat renews.
#[idempotent(key = key, biz = "skew", store = store, lease = "2s", ttl = "1h", wait = "20s")]
async fn settle(
    store: &Store,
    effects: &Effects,
    run: &str,
    key: &str,
    token: String,
    hang: Duration,
) -> Result<String, AppError> {
    effects.record(run, key, &token).await?;
    harness::report("BODY_STARTED");
    tokio::time::sleep(hang).await;
    Ok(token)
}

/// One call of `settle`, in a process of its own (its clock skewed or not).
#[test]
fn skew_worker() {
    let Some(_) = harness::worker_settings("skew") else {
        return;
    };
    let (url, run, key, token) = (
        harness::setting("SKEW_URL"),
        harness::setting("SKEW_RUN"),
        harness::setting("SKEW_KEY"),
        harness::setting("SKEW_TOKEN"),
    );
    let hang = Duration::from_millis(harness::setting("SKEW_HANG_MS").parse().unwrap());
    harness::worker_runtime().block_on(async {
        harness::report(&format!("CLOCK {}", harness::epoch_millis()));
        let store = harness::open_store(&url).await;
        let effects = Effects::open(&url).await;
        harness::report(&match settle(&store, &effects, &run, &key, token, hang).await {
            Ok(token) => format!("RESULT OK {token}"),
            Err(error) => format!("RESULT ERR {error}"),
        });
    });
}

/// Where the workers call: the store, the run, and libfaketime.
struct Calls<'a> {
    libfaketime: &'a str,
    url: &'a str,
    run: &'a str,
}

impl Calls<'_> {
    /// A worker calling `key`, its clock `skew_secs` off; returns once it said `marker`.
    fn call(
        &self,
        key: &str,
        token: &str,
        hang: Duration,
        skew_secs: i64,
        marker: &str,
    ) -> (std::process::Child, BufReader<std::process::ChildStdout>) {
        let (libfaketime, url, run) = (self.libfaketime, self.url, self.run);
        let settings = [
            ("SKEW_URL", url.to_owned()),
            ("SKEW_RUN", run.to_owned()),
            ("SKEW_KEY", key.to_owned()),
            ("SKEW_TOKEN", token.to_owned()),
            ("SKEW_HANG_MS", hang.as_millis().to_string()),
        ];
        let mut worker = harness::worker("skew", "skew_worker", &settings);
        harness::skewed(&mut worker, libfaketime, skew_secs);
        let mut child = worker.spawn().unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        let mut clock = None;
        while out.read_line(&mut line).unwrap() > 0 {
            if let Some(millis) = line.trim().strip_prefix("CLOCK ") {
                clock = millis.parse::<i64>().ok();
            }
            if line.contains(marker) {
                let off = clock.expect("the worker said its clock") - harness::epoch_millis() as i64;
                assert!(
                    (off - skew_secs * 1000).abs() < 10_000,
                    "the worker should run {skew_secs} s off; it is {off} ms off"
                );
                return (child, out);
            }
            line.clear();
        }
        panic!("the worker ended before saying {marker}: {:?}", child.wait());
    }
}

/// What a worker answered, once it ends.
fn answer(mut child: std::process::Child, mut out: BufReader<std::process::ChildStdout>) -> String {
    let mut line = String::new();
    let mut result = None;
    while out.read_line(&mut line).unwrap() > 0 {
        if let Some(said) = line.trim().strip_prefix("RESULT ") {
            result = Some(said.to_owned());
        }
        line.clear();
    }
    assert!(child.wait().unwrap().success());
    result.expect("the worker answered")
}

fn skewed_processes(backend: &str) {
    let Some(url) = harness::backend_url(backend, "skew") else {
        return;
    };
    let Some(libfaketime) = harness::libfaketime() else {
        return;
    };
    let run = conformance::unique("skew");
    let key = format!("{run}-held");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (store, effects) = runtime.block_on(async { (harness::open_store(&url).await, Effects::open(&url).await) });

    // On time: holds the key for 4 s.
    let calls = Calls {
        libfaketime,
        url: &url,
        run: &run,
    };
    let (holder, holder_out) = calls.call(&key, "first", Duration::from_secs(4), 0, "BODY_STARTED");
    std::thread::sleep(Duration::from_secs(1));
    // 5 minutes ahead, 1 s later: every lease it sees would be lapsed by its clock.
    let (ahead, ahead_out) = calls.call(&key, "ahead", Duration::ZERO, 300, "CLOCK");
    assert_eq!(
        answer(holder, holder_out),
        "OK first",
        "the holder's lease was never lost"
    );
    assert_eq!(
        answer(ahead, ahead_out),
        "OK first",
        "the caller ahead waited for the first answer"
    );
    // 5 minutes behind, after it finished: the record has not expired by the store.
    let (behind, behind_out) = calls.call(&key, "behind", Duration::ZERO, -300, "CLOCK");
    assert_eq!(answer(behind, behind_out), "OK first", "the caller behind replays it");
    let rows = runtime.block_on(effects.tokens(&run));
    assert_eq!(rows[&key], ["first"], "one execution: {rows:?}");

    // A record completed by a process 5 minutes behind expires a TTL after the store's
    // completion, not 5 minutes early.
    let fresh = format!("{run}-fresh");
    let (behind, behind_out) = calls.call(&fresh, "late", Duration::ZERO, -300, "CLOCK");
    assert_eq!(answer(behind, behind_out), "OK late");
    let record = runtime.block_on(store.get("skew", &fresh)).unwrap().expect("recorded");
    let completed = record.completed_at.expect("completed");
    let off = SystemTime::now()
        .duration_since(completed)
        .or_else(|e| Ok::<_, ()>(e.duration()))
        .unwrap();
    assert!(
        off < Duration::from_secs(30),
        "completed at the store's instant, {off:?} off"
    );
    assert_eq!(record.expires_at.duration_since(completed).unwrap(), TTL);
    harness::say(&format!(
        "skew on {backend}: a call held 4 s; callers 5 min ahead and behind got its answer; 1 execution; \
         a record completed 5 min behind expires 1 h after the store's completion"
    ));
}

#[test]
fn skewed_processes_on_postgres() {
    skewed_processes("postgres");
}

#[test]
fn skewed_processes_on_mysql() {
    skewed_processes("mysql");
}

#[test]
fn skewed_processes_on_redis() {
    skewed_processes("redis");
}

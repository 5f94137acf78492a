//! Duplicate storms across OS processes, through the attribute, on every database.
//!
//! Each storm starts `IDEM_STORM_PROCESSES` (4) processes × `IDEM_STORM_TASKS` (16)
//! tasks, every task calling the same `IDEM_STORM_KEYS` (500) keys in the same order
//! from one start barrier. The body writes one business row into the same database.
//! Even keys fail fast on a running duplicate (`InProgress`), odd keys `wait`.
//! Afterwards: every key has exactly one business row; every `Ok` a caller got is that
//! row's token; a waiting caller always got it. On a Galera cluster the processes call
//! through different nodes.

use idem_testkit::conformance;
use idem_testkit::harness;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use harness::{AppError, Effects};
use idem::{idempotent, IdempotencyStore};

type Store = Arc<dyn IdempotencyStore>;

#[idempotent(key = key, biz = "storm", store = store, lease = "20s")]
async fn charge(store: &Store, effects: &Effects, run: &str, key: &str, token: String) -> Result<String, AppError> {
    charge_body(effects, run, key, token).await
}

#[idempotent(key = key, biz = "storm", store = store, lease = "20s", wait = "60s")]
async fn charge_waiting(
    store: &Store,
    effects: &Effects,
    run: &str,
    key: &str,
    token: String,
) -> Result<String, AppError> {
    charge_body(effects, run, key, token).await
}

/// The business: one row, then a little time, so duplicates overlap the body.
async fn charge_body(effects: &Effects, run: &str, key: &str, token: String) -> Result<String, AppError> {
    effects.record(run, key, &token).await?;
    tokio::time::sleep(Duration::from_millis(1 + token.len() as u64 % 3)).await;
    Ok(token)
}

fn setting(settings: &HashMap<String, String>, name: &str) -> String {
    settings
        .get(name)
        .unwrap_or_else(|| panic!("worker without {name}"))
        .clone()
}

fn size(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// One storm process: its tasks call every key, and report each outcome on stdout.
#[test]
fn storm_worker() {
    let Some(settings) = harness::worker_settings("storm") else {
        return;
    };
    let (url, run) = (setting(&settings, "STORM_URL"), setting(&settings, "STORM_RUN"));
    let keys: usize = setting(&settings, "STORM_KEYS").parse().unwrap();
    let tasks: usize = setting(&settings, "STORM_TASKS").parse().unwrap();
    let start_at: u64 = setting(&settings, "STORM_START_AT").parse().unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let store = harness::open_store(&url).await;
        let effects = Effects::open(&url).await;
        harness::sleep_until_coordinator_millis(start_at).await;
        // What this process's wall clock says, for the coordinator to check its skew.
        harness::report(&format!("CLOCK {}", harness::epoch_millis()));
        let pid = std::process::id();
        let handles: Vec<_> = (0..tasks)
            .map(|task| {
                let (store, effects, run) = (store.clone(), effects.clone(), run.clone());
                tokio::spawn(async move {
                    let mut lines = Vec::with_capacity(keys);
                    for k in 0..keys {
                        let key = format!("{run}-{k}");
                        let token = format!("{pid}.{task}.{k}");
                        let outcome = if k % 2 == 0 {
                            charge(&store, &effects, &run, &key, token).await
                        } else {
                            charge_waiting(&store, &effects, &run, &key, token).await
                        };
                        lines.push(match outcome {
                            Ok(token) => format!("R {k} OK {token}"),
                            Err(AppError::Idem(idem::Error::InProgress { .. })) => format!("R {k} INPROGRESS"),
                            Err(error) => format!("R {k} ERR {error}"),
                        });
                    }
                    lines
                })
            })
            .collect();
        for handle in handles {
            harness::report(&handle.await.unwrap().join("\n"));
        }
    });
}

static ONE_STORM_AT_A_TIME: Mutex<()> = Mutex::new(());

fn storm(backend: &str) {
    storm_skewed(backend, &[]);
}

/// A storm whose process `i` runs with its wall clock `skews[i]` seconds off (through
/// libfaketime; none past the list's end).
fn storm_skewed(backend: &str, skews: &[i64]) {
    let Some(urls) = harness::backend_url(backend, "storm") else {
        return;
    };
    let libfaketime = match skews {
        [] => None,
        _ => match harness::libfaketime() {
            Some(path) => Some(path),
            None => return,
        },
    };
    // A cluster's nodes, comma-separated: worker `i` calls through node `i`.
    let nodes: Vec<String> = urls.split(',').map(str::to_owned).collect();
    let url = nodes[0].clone();
    let _alone = ONE_STORM_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (processes, tasks, keys) = (
        size("IDEM_STORM_PROCESSES", 4),
        size("IDEM_STORM_TASKS", 16),
        size("IDEM_STORM_KEYS", 500),
    );
    let run = conformance::unique("storm");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let effects = runtime.block_on(async {
        harness::open_store(&url).await;
        Effects::open(&url).await
    });

    let started = Instant::now();
    let start_at = harness::epoch_millis() + 2_000;
    let workers: Vec<_> = (0..processes)
        .map(|i| {
            let settings = [
                ("STORM_URL", nodes[i % nodes.len()].clone()),
                ("STORM_RUN", run.clone()),
                ("STORM_KEYS", keys.to_string()),
                ("STORM_TASKS", tasks.to_string()),
                ("STORM_START_AT", start_at.to_string()),
            ];
            let mut worker = harness::worker("storm", "storm_worker", &settings);
            if let (Some(libfaketime), Some(&skew)) = (libfaketime, skews.get(i)) {
                harness::skewed(&mut worker, libfaketime, skew);
            }
            worker.spawn().expect("start a storm process")
        })
        .collect();
    let mut outcomes: HashMap<usize, Vec<Option<String>>> = HashMap::new();
    let mut calls = 0;
    for (i, worker) in workers.into_iter().enumerate() {
        let output = worker.wait_with_output().unwrap();
        assert!(output.status.success(), "a storm process failed: {:?}", output.status);
        let stdout = String::from_utf8(output.stdout).unwrap();
        if let Some(&skew) = skews.get(i) {
            // The worker's clock, read at the barrier, is off by its skew (give or take
            // the time the barrier took to pass).
            let clock: i64 = stdout
                .lines()
                .find_map(|l| l.strip_prefix("CLOCK "))
                .expect("the worker said its clock")
                .parse()
                .unwrap();
            let off = clock - start_at as i64;
            assert!(
                (off - skew * 1000).abs() < 10_000,
                "process {i} should run {skew} s off; its clock is {off} ms off"
            );
        }
        for line in stdout.lines().filter(|l| l.starts_with("R ")) {
            let mut parts = line.splitn(4, ' ').skip(1);
            let k: usize = parts.next().unwrap().parse().unwrap();
            let outcome = match (parts.next().unwrap(), parts.next()) {
                ("OK", Some(token)) => Some(token.to_owned()),
                ("INPROGRESS", None) => None,
                _ => panic!("a caller got an error: {line}"),
            };
            outcomes.entry(k).or_default().push(outcome);
            calls += 1;
        }
    }
    let elapsed = started.elapsed();
    assert_eq!(calls, processes * tasks * keys, "every call reported");

    let rows = runtime.block_on(effects.tokens(&run));
    let mut in_progress = 0;
    for k in 0..keys {
        let written = rows.get(&format!("{run}-{k}")).map(Vec::as_slice).unwrap_or_default();
        assert_eq!(written.len(), 1, "key {k} ran {} times: {written:?}", written.len());
        for outcome in &outcomes[&k] {
            match outcome {
                Some(token) => assert_eq!(
                    token, &written[0],
                    "key {k}: a caller got another result than the first"
                ),
                None if k % 2 == 1 => panic!("key {k}: a waiting caller got InProgress"),
                None => in_progress += 1,
            }
        }
    }
    let store = runtime.block_on(harness::open_store(&url));
    for k in (0..keys).step_by(keys.div_ceil(20).max(1)) {
        let record = runtime
            .block_on(store.get("storm", &format!("{run}-{k}")))
            .unwrap()
            .expect("record kept");
        assert_eq!(record.status, idem::Status::Succeeded);
        assert_eq!(
            record.response_body,
            Some(format!("\"{}\"", rows[&format!("{run}-{k}")][0]))
        );
    }
    let skewed = if skews.is_empty() {
        String::new()
    } else {
        format!(", clocks skewed {skews:?} s")
    };
    harness::say(&format!(
        "storm on {backend} ({} node(s){skewed}): {processes} processes x {tasks} tasks x {keys} keys = {calls} calls \
         in {:.1?}; {keys} business rows (one per key); {in_progress} InProgress answers; 0 double executions",
        nodes.len(),
        elapsed
    ));
}

#[test]
fn storm_on_sqlite() {
    storm("sqlite");
}

#[test]
fn storm_on_postgres() {
    storm("postgres");
}

#[test]
fn storm_on_mysql() {
    storm("mysql");
}

/// Processes on the three nodes of a Galera cluster, the same keys: claims of one key
/// on different nodes collide at certification.
#[test]
fn storm_on_galera() {
    storm("galera");
}

#[test]
fn storm_on_redis() {
    storm("redis");
}

/// Hosts whose clocks disagree by minutes: one process 5 minutes behind, one on time,
/// one 3 and one 5 minutes ahead, all on the same keys. The store's clock judges every
/// lease: no process takes over another's running body.
const SKEWS: [i64; 4] = [-300, 0, 180, 300];

#[test]
fn storm_with_skewed_clocks_on_postgres() {
    storm_skewed("postgres", &SKEWS);
}

#[test]
fn storm_with_skewed_clocks_on_mysql() {
    storm_skewed("mysql", &SKEWS);
}

#[test]
fn storm_with_skewed_clocks_on_redis() {
    storm_skewed("redis", &SKEWS);
}

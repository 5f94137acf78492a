//! idem across the nodes of a MariaDB Galera cluster (`IDEM_TEST_GALERA_URLS`, one URL
//! per node; `.ci/start-galera` starts three). The conformance suite through one node
//! is in `idem-store-sqlx/tests/mysql.rs`, the cross-node storm of processes in `tests/storm.rs`.
//!
//! Claims of one key on different nodes do not meet at a row lock: each node inserts,
//! and the cluster's certification lets the first through and rolls the others back
//! (`ERROR 1213`). The cluster here runs with `wsrep_retry_autocommit=0`, so every such
//! rollback reaches the store; each test reads the nodes' certification counters and
//! checks that conflicts happened, so it cannot pass without meeting them.

use idem_testkit::conformance;
use idem_testkit::harness;
#[path = "../../tests/support/ci.rs"]
mod ci;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use harness::failover::Storm;
use idem::sqlx::{self, MySqlPool, Transaction};
use idem::store::{Claim, ClaimOutcome, FenceCheck};
use idem::{idempotent, IdempotencyStore, MySqlStore};

/// Taken by every test here: one of them kills a node.
static CLUSTER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// One store per node.
async fn nodes() -> Option<Vec<MySqlStore>> {
    let urls = conformance::server_url("IDEM_TEST_GALERA_URLS", "Galera")?;
    let mut stores = Vec::new();
    for url in urls.split(',') {
        let store = MySqlStore::connect(url).await.expect("connect to a Galera node");
        store.migrate().await.expect("migrate");
        stores.push(store);
    }
    Some(stores)
}

/// Certification conflicts and brute-force aborts on every node so far.
async fn conflicts(nodes: &[MySqlStore]) -> u64 {
    let mut total = 0;
    for node in nodes {
        let rows: Vec<(String, String)> = sqlx::query_as(
            "SHOW GLOBAL STATUS WHERE Variable_name IN ('wsrep_local_cert_failures', 'wsrep_local_bf_aborts')",
        )
        .fetch_all(node.pool())
        .await
        .unwrap();
        total += rows.iter().map(|(_, n)| n.parse::<u64>().unwrap()).sum::<u64>();
    }
    total
}

fn claim_of<'a>(biz: &'a str, key: &'a str) -> Claim<'a> {
    Claim::new(
        biz,
        key,
        idem::store::now(),
        Duration::from_secs(30),
        Duration::from_secs(3600),
    )
}

/// The same new key claimed on the three nodes at once, two claims per node: one is
/// granted, every other answers with the winner's record — never a store error. A
/// rolled-back claim read the record that won.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_claimed_on_every_node_at_once_is_granted_once() {
    let _cluster = CLUSTER.lock().await;
    let Some(nodes) = nodes().await else { return };
    let biz = conformance::unique("galera-claim");
    let before = conflicts(&nodes).await;
    let keys = 300;
    let mut granted = vec![0; keys];
    for batch in (0..keys).collect::<Vec<_>>().chunks(20) {
        let mut racers = Vec::new();
        for &k in batch {
            for node in nodes.iter().chain(&nodes) {
                let (node, biz) = (node.clone(), biz.clone());
                racers.push(tokio::spawn(async move {
                    let key = format!("k{k}");
                    (k, node.claim(&claim_of(&biz, &key)).await)
                }));
            }
        }
        for racer in racers {
            let (k, outcome) = racer.await.unwrap();
            match outcome {
                Ok(ClaimOutcome::Acquired(_)) => granted[k] += 1,
                Ok(ClaimOutcome::Existing(record)) => {
                    assert_eq!(record.status, idem::Status::Processing, "key {k}: {record:?}")
                }
                Err(error) => panic!("key {k}: a claim that lost the race failed: {error}"),
            }
        }
    }
    assert!(granted.iter().all(|&n| n == 1), "granted once per key: {granted:?}");
    let met = conflicts(&nodes).await - before;
    assert!(
        met > 0,
        "the claims met no certification conflict: the test proves nothing"
    );
    harness::say(&format!(
        "galera: {keys} keys claimed 6 times at once on 3 nodes: each granted once, {met} certification \
         conflicts on the way, 0 errors"
    ));
}

/// Purges of the same expired records on every node at once collide at certification:
/// a purge the cluster rolls back deleted nothing and is run again, so none fails and
/// every expired record goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn purges_on_every_node_at_once_never_fail() {
    let _cluster = CLUSTER.lock().await;
    let Some(nodes) = nodes().await else { return };
    let biz = conformance::unique("galera-purge");
    let now = idem::store::now();
    let hour = Duration::from_secs(3600);
    let records = 300;
    // Written hours in the past, at the instants given; purged by the servers' clock.
    let writer = nodes[0].clone().with_lease_clock(idem::LeaseClock::Caller);
    for k in 0..records {
        let key = format!("k{k}");
        // Claimed under a lease that runs until it is completed: only this test's
        // purges take these records, and only once they expired.
        let claim = Claim::new(&biz, &key, now - 3 * hour, 3 * hour + Duration::from_secs(60), hour);
        let ClaimOutcome::Acquired(lease) = writer.claim(&claim).await.unwrap() else {
            panic!("first claim of {key}")
        };
        let done = writer.complete(&lease, "1", now - 2 * hour, hour).await.unwrap();
        assert_eq!(done, FenceCheck::Held);
    }
    let before = conflicts(&nodes).await;
    let mut purgers = Vec::new();
    for node in nodes.iter().chain(&nodes) {
        let node = node.clone();
        purgers.push(tokio::spawn(async move {
            let mut deleted = 0;
            loop {
                match node.purge_expired(idem::store::now(), 20).await {
                    Ok(0) => return Ok(deleted),
                    Ok(n) => deleted += n,
                    Err(error) => return Err(error),
                }
            }
        }));
    }
    for purger in purgers {
        let purged = purger.await.unwrap();
        assert!(purged.is_ok(), "a purge failed: {purged:?}");
    }
    for k in 0..records {
        assert!(
            nodes[1].get(&biz, &format!("k{k}")).await.unwrap().is_none(),
            "k{k} purged"
        );
    }
    harness::say(&format!(
        "galera: {records} expired records purged by 6 purgers on 3 nodes at once: {} certification conflicts, 0 errors",
        conflicts(&nodes).await - before
    ));
}

/// Holder writes of one lease sent through every node at once collide at
/// certification: each is run again and finds its lease, so every renewal holds and
/// the completion lands once — none fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn holder_writes_rolled_back_by_the_cluster_are_run_again() {
    let _cluster = CLUSTER.lock().await;
    let Some(nodes) = nodes().await else { return };
    let biz = conformance::unique("galera-write");
    let before = conflicts(&nodes).await;
    let keys = 100;
    let mut leases = Vec::new();
    for k in 0..keys {
        let key = format!("k{k}");
        let ClaimOutcome::Acquired(lease) = nodes[0].claim(&claim_of(&biz, &key)).await.unwrap() else {
            panic!("first claim of {key}")
        };
        leases.push(lease);
    }
    let mut writes = Vec::new();
    for lease in &leases {
        for node in nodes.iter().chain(&nodes) {
            let (node, lease) = (node.clone(), lease.clone());
            writes.push(tokio::spawn(async move {
                node.renew(&lease, idem::store::now(), Duration::from_secs(30)).await
            }));
        }
    }
    for write in writes {
        let renewed = write.await.unwrap();
        assert_eq!(renewed.unwrap(), FenceCheck::Held, "a renewal of a held lease holds");
    }
    let mut finishes = Vec::new();
    for lease in &leases {
        for (i, node) in nodes.iter().enumerate() {
            let (node, lease) = (node.clone(), lease.clone());
            finishes.push(tokio::spawn(async move {
                let now = idem::store::now();
                if i == 0 {
                    (
                        true,
                        node.complete(&lease, "\"paid\"", now, Duration::from_secs(3600)).await,
                    )
                } else {
                    (false, node.renew(&lease, now, Duration::from_secs(30)).await)
                }
            }));
        }
    }
    for finish in finishes {
        match finish.await.unwrap() {
            (true, completed) => assert_eq!(completed.unwrap(), FenceCheck::Held, "the completion lands"),
            // Before the completion it holds; after it, the record is finished.
            (false, renewed) => assert!(renewed.is_ok(), "a renewal failed: {renewed:?}"),
        }
    }
    for (k, node) in (0..keys).zip(nodes.iter().cycle()) {
        let record = node.get(&biz, &format!("k{k}")).await.unwrap().unwrap();
        assert_eq!(record.status, idem::Status::Succeeded, "read on another node");
    }
    let met = conflicts(&nodes).await - before;
    assert!(
        met > 0,
        "the writes met no certification conflict: the test proves nothing"
    );
    harness::say(&format!(
        "galera: {keys} leases renewed 6 times at once and completed through 3 nodes: {met} certification \
         conflicts, 0 errors"
    ));
}

/// A call finished through one node, its duplicates sent at once to the other two:
/// they replay the first answer (their reads wait for the cluster's commits), never
/// run the body, never answer `InProgress`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_duplicate_on_another_node_replays_the_first_answer() {
    let _cluster = CLUSTER.lock().await;
    let Some(nodes) = nodes().await else { return };
    let ops: Vec<_> = nodes
        .iter()
        .map(|node| Arc::new(idem::Idempotent::new("galera.replay").store(Arc::new(node.clone()))))
        .collect();
    let run = conformance::unique("replay");
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    for k in 0..200 {
        let key = format!("{run}-{k}");
        let body = |runs: Arc<std::sync::atomic::AtomicUsize>, answer: usize| async move {
            runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok::<_, idem::Error>(answer)
        };
        let first = ops[k % 3].execute(&key, body(runs.clone(), k)).await.unwrap();
        let (a, b) = tokio::join!(
            ops[(k + 1) % 3].execute(&key, body(runs.clone(), usize::MAX)),
            ops[(k + 2) % 3].execute(&key, body(runs.clone(), usize::MAX)),
        );
        assert_eq!((a.unwrap(), b.unwrap()), (first, first), "key {k}");
    }
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 200, "one body per key");
}

/// A node busy applying a large transaction of another node's answers a duplicate
/// after it has applied the first call's completion too: a claim on it right after the
/// completion returned on the first node sees `SUCCESS`, not the claim's `PROCESSING`
/// (on loopback a node otherwise applies faster than the test can look).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lagging_node_answers_with_the_finished_record() {
    let _cluster = CLUSTER.lock().await;
    let Some(nodes) = nodes().await else { return };
    ballast(&nodes[0]).await;
    let biz = conformance::unique("galera-lag");
    for round in 0..3 {
        let key = format!("k{round}");
        let ClaimOutcome::Acquired(lease) = nodes[0].claim(&claim_of(&biz, &key)).await.unwrap() else {
            panic!("first claim")
        };
        // Node 2 has the claim; then gets a large write set to apply, and the completion after it.
        assert!(nodes[1].get(&biz, &key).await.unwrap().is_some());
        add_ballast(&nodes[0]).await;
        let now = idem::store::now();
        let done = nodes[0]
            .complete(&lease, "\"paid\"", now, Duration::from_secs(3600))
            .await;
        assert_eq!(done.unwrap(), FenceCheck::Held);
        match nodes[1].claim(&claim_of(&biz, &key)).await.unwrap() {
            ClaimOutcome::Existing(record) => assert_eq!(
                record.status,
                idem::Status::Succeeded,
                "round {round}: the duplicate saw the record before its completion"
            ),
            other => panic!("round {round}: {other:?}"),
        }
    }
}

/// A holder whose connection lands on a node still applying the cluster's writes
/// (behind a proxy, after a failover) finds its own lease there: each holder write
/// waits until the node has applied what the cluster committed before it, so the claim
/// made through another node is there to match. (Were it judged on what the node had
/// applied, the claim would be missing, the write refused as if the key had been taken
/// over, the outcome dropped — and the key run again once the lease lapsed.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_holder_write_on_a_lagging_node_finds_its_lease() {
    let _cluster = CLUSTER.lock().await;
    let Some(nodes) = nodes().await else { return };
    ballast(&nodes[0]).await;
    let biz = conformance::unique("galera-lag-write");
    let hour = Duration::from_secs(3600);
    for (round, operation) in ["renew", "record_steps", "complete", "fail", "release"]
        .into_iter()
        .enumerate()
    {
        let key = format!("k{round}");
        // Node 2 gets a large write set to apply, and the claim after it.
        add_ballast(&nodes[0]).await;
        let ClaimOutcome::Acquired(lease) = nodes[0].claim(&claim_of(&biz, &key)).await.unwrap() else {
            panic!("first claim")
        };
        let now = idem::store::now();
        let written = match operation {
            "renew" => nodes[1].renew(&lease, now, Duration::from_secs(30)).await,
            "record_steps" => nodes[1].record_steps(&lease, "{}").await,
            "complete" => nodes[1].complete(&lease, "\"paid\"", now, hour).await,
            "fail" => nodes[1].fail(&lease, "declined", now, hour).await,
            _ => nodes[1].release(&lease).await,
        };
        assert_eq!(
            written.unwrap(),
            FenceCheck::Held,
            "{operation} on the lagging node was refused: it judged the lease before applying the claim"
        );
    }
}

/// A table on `node` whose large inserts keep the other nodes applying for a while.
async fn ballast(node: &MySqlStore) {
    sqlx::query("CREATE TABLE IF NOT EXISTS galera_ballast (id BIGINT AUTO_INCREMENT PRIMARY KEY, pad TEXT NOT NULL)")
        .execute(node.pool())
        .await
        .unwrap();
    sqlx::query("TRUNCATE TABLE galera_ballast")
        .execute(node.pool())
        .await
        .unwrap();
}

/// One large insert through `node`: it returns once certified, long before the other
/// nodes have applied it.
async fn add_ballast(node: &MySqlStore) {
    sqlx::query("INSERT INTO galera_ballast (pad) SELECT REPEAT('x', 200) FROM seq_1_to_100000")
        .execute(node.pool())
        .await
        .unwrap();
}

// --- A node killed in the middle of a storm -----------------------------------------

const KILL_KEYS: usize = 4000;

#[idempotent(key = key, biz = "galera.kill", tx = tx, wait = "30s")]
async fn pay(tx: &mut Transaction<'_, sqlx::MySql>, key: &str, token: &str) -> Result<String, harness::AppError> {
    sqlx::query("INSERT INTO galera_payment (order_key, token) VALUES (?, ?)")
        .bind(key)
        .bind(token)
        .execute(&mut **tx)
        .await?;
    tokio::time::sleep(Duration::from_millis(1)).await;
    Ok(token.to_owned())
}

/// One payment in its own transaction; the claim, the business row and the record
/// commit together on the worker's node, or not at all.
async fn pay_once(pool: &MySqlPool, key: &str, token: &str) -> Result<String, harness::AppError> {
    let mut tx = pool.begin().await?;
    let answer = pay(&mut tx, key, token).await?;
    tx.commit().await?;
    Ok(answer)
}

/// A worker on one node: every key in turn (from its own offset, so workers meet on
/// every key), each retried until it is answered — as an application retries a
/// transaction the cluster rolled back, or a node that went away.
#[test]
fn kill_worker() {
    let Some(settings) = harness::worker_settings("galera-kill") else {
        return;
    };
    let (url, run) = (settings["KILL_URL"].clone(), settings["KILL_RUN"].clone());
    let offset: usize = settings["KILL_OFFSET"].parse().unwrap();
    let token = format!("p{}", std::process::id());
    harness::worker_runtime().block_on(async {
        let pool = sqlx::mysql::MySqlPoolOptions::new()
            .acquire_timeout(Duration::from_secs(2))
            .connect_lazy(&url)
            .unwrap();
        let (mut errors, mut longest) = (0, Duration::ZERO);
        for i in 0..KILL_KEYS {
            let key = format!("{run}-{}", (i + offset) % KILL_KEYS);
            let started = Instant::now();
            let answer = loop {
                match pay_once(&pool, &key, &token).await {
                    Ok(answer) => break answer,
                    Err(error) => {
                        errors += 1;
                        assert!(started.elapsed() < Duration::from_secs(90), "{key}: {error}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            };
            longest = longest.max(started.elapsed());
            harness::report(&format!("DONE {key} {answer}"));
        }
        harness::report(&format!("ERRORS {errors} LONGEST_MS {}", longest.as_millis()));
    });
}

/// Six workers, two per node, pay the same keys in transactional mode; one node's
/// `mariadbd` is SIGKILLed mid-storm and started again a few seconds later. Every key
/// has one business row, every answer is that row, nothing is left `PROCESSING`, the
/// workers on the surviving nodes never stop, and the killed node rejoins.
#[test]
fn a_node_killed_mid_storm_runs_nothing_twice() {
    let _cluster = CLUSTER.blocking_lock();
    let Some(urls) = harness::backend_url("galera", "kill") else {
        return;
    };
    let urls: Vec<String> = urls.split(',').map(str::to_owned).collect();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let first = runtime.block_on(async {
        let store = MySqlStore::connect(&urls[0]).await.unwrap();
        store.migrate().await.unwrap();
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS galera_payment (id BIGINT AUTO_INCREMENT PRIMARY KEY, \
             order_key VARCHAR(255) NOT NULL, token VARCHAR(64) NOT NULL)",
        )
        .execute(store.pool())
        .await
        .unwrap();
        store
    });
    let run = conformance::unique("kill");
    let started = Instant::now();
    let workers: Vec<_> = (0..6)
        .map(|i| {
            let settings = [
                ("KILL_URL", urls[i % 3].clone()),
                ("KILL_RUN", run.clone()),
                ("KILL_OFFSET", (i * KILL_KEYS / 6).to_string()),
            ];
            (
                i % 3,
                harness::worker("galera-kill", "kill_worker", &settings)
                    .spawn()
                    .unwrap(),
            )
        })
        .collect();
    // Node 3 dies with its clients' transactions in flight, and comes back.
    std::thread::sleep(Duration::from_millis(1500));
    galera("kill-node", 3);
    let killed_at = started.elapsed();
    std::thread::sleep(Duration::from_secs(4));
    galera("start-node", 3);
    let rejoined_at = started.elapsed();

    let mut answers: Vec<(String, String)> = Vec::new();
    let mut report = Vec::new();
    for (node, worker) in workers {
        let output = worker.wait_with_output().unwrap();
        assert!(output.status.success(), "a worker on node {} failed", node + 1);
        let out = String::from_utf8(output.stdout).unwrap();
        let done: Vec<_> = out
            .lines()
            .filter_map(|line| line.strip_prefix("DONE "))
            .filter_map(|rest| rest.split_once(' '))
            .map(|(key, token)| (key.to_owned(), token.to_owned()))
            .collect();
        assert_eq!(
            done.len(),
            KILL_KEYS,
            "a worker on node {} answered every key",
            node + 1
        );
        answers.extend(done);
        let summary = out.lines().find(|line| line.starts_with("ERRORS ")).unwrap().to_owned();
        if node == 2 {
            assert!(
                !summary.starts_with("ERRORS 0 "),
                "the storm was over before node 3 died: the test proves nothing ({summary})"
            );
        }
        report.push(format!("node {}: {summary}", node + 1));
    }
    let elapsed = started.elapsed();

    runtime.block_on(async {
        let rows: Vec<(String, String)> = sqlx::query_as(
            "SET STATEMENT wsrep_sync_wait = 1 FOR SELECT order_key, token FROM galera_payment WHERE order_key LIKE ?",
        )
        .bind(format!("{run}-%"))
        .fetch_all(first.pool())
        .await
        .unwrap();
        let mut by_key: HashMap<String, Vec<String>> = HashMap::new();
        for (key, token) in rows {
            by_key.entry(key).or_default().push(token);
        }
        assert_eq!(by_key.len(), KILL_KEYS, "every key has its business row");
        for (key, tokens) in &by_key {
            assert_eq!(tokens.len(), 1, "key {key} ran {} times: {tokens:?}", tokens.len());
        }
        for (key, token) in &answers {
            assert_eq!(&by_key[key][0], token, "the answer for {key} is its row");
        }
        let processing: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM idempotent_record WHERE biz_type = 'galera.kill' AND idempotent_key LIKE ? \
             AND status = 'PROCESSING'",
        )
        .bind(format!("{run}-%"))
        .fetch_one(first.pool())
        .await
        .unwrap();
        assert_eq!(processing, 0, "no record is left PROCESSING");
        let size: (String, String) = sqlx::query_as("SHOW STATUS LIKE 'wsrep_cluster_size'")
            .fetch_one(first.pool())
            .await
            .unwrap();
        assert_eq!(size.1, "3", "the killed node rejoined");
    });
    harness::say(&format!(
        "galera kill: 6 workers (2 per node) x {KILL_KEYS} keys in {elapsed:.1?}; node 3 SIGKILLed at \
         {killed_at:.1?}, rejoined at {rejoined_at:.1?}; one business row per key, 0 PROCESSING; retried errors \
         by worker: {}",
        report.join(", ")
    ));
}

/// Leased mode through the address a service reaches the cluster at (a proxy, a
/// virtual IP), which points at node 3 until node 3 hangs (SIGSTOP) and is SIGKILLed
/// mid-storm, then at node 1. Holders whose completion met the dead node keep writing it and land on node 1
/// within their lease: every call answered, every answer recorded, every body finished
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_lost_behind_its_address_loses_no_answer() {
    let _cluster = CLUSTER.lock().await;
    let Some(urls) = conformance::server_url("IDEM_TEST_GALERA_URLS", "Galera") else {
        return;
    };
    let ports: Vec<u16> = urls.split(',').map(harness::url_port).collect();
    let target = Arc::new(AtomicU16::new(ports[2]));
    let address = harness::forwarder(target.clone()).await;
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .acquire_timeout(Duration::from_secs(2))
        .connect(&format!("mysql://idem:idem@127.0.0.1:{address}/idem"))
        .await
        .unwrap();
    let store = MySqlStore::new(pool);
    store.migrate().await.unwrap();
    let biz = conformance::unique("galera-lost");
    // A holder keeps writing its completion for half its lease: 30 s here, well above
    // the cluster's stall while it waits out the hung node (5–10 s, longer on a loaded
    // machine). A claim that committed as node 3 hung, its answer lost with the node,
    // holds its key until its stored lease (the lease plus the clock tolerance) lapses;
    // the nodes judge leases by their clocks on one host, so a second of tolerance does.
    let (tasks, keys) = (8, 1000);
    let started = Instant::now();
    // Each task on a handle of its own: the callers of a key claim at the cluster.
    let (storm, handles) = Storm::start_apart(&store, tasks, keys, |handle| {
        idem::Idempotent::new(biz.clone())
            .store(handle)
            .lease(Duration::from_secs(60))
            .clock_tolerance(Duration::from_secs(1))
    });
    // Node 3 hangs first (what its clients sent meanwhile is never answered), then dies.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    tokio::task::spawn_blocking(|| galera("pause-node", 3)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let done_before = storm.answered();
    tokio::task::spawn_blocking(|| galera("kill-node", 3)).await.unwrap();
    let killed_at = started.elapsed();
    // A proxy's health check notices, and sends new connections to node 1.
    tokio::time::sleep(Duration::from_millis(500)).await;
    target.store(ports[0], Ordering::SeqCst);
    Storm::join(handles, Duration::from_secs(180)).await;
    let elapsed = started.elapsed();
    tokio::task::spawn_blocking(|| galera("start-node", 3)).await.unwrap();
    assert!(
        done_before > 0 && done_before < tasks * keys,
        "node 3 died mid-storm ({done_before} answers before)"
    );
    storm.check(tasks, keys, &biz, &store).await;
    let (slowest, took, told) = storm.slowest().expect("the storm made calls");
    harness::say(&format!(
        "galera address moved: {tasks} tasks x {keys} keys (leased mode) in {elapsed:.1?}; node 3 hung 0.5 s, SIGKILLed at \
         {killed_at:.1?} ({done_before} answers before), the address moved to node 1 0.5 s later; {} errors \
         retried; every answer SUCCESS; every body finished once; node 3 rejoined; the slowest key, k{slowest}, \
         took {took:.1?}:\n{told}",
        storm.errors.load(Ordering::SeqCst)
    ));
}

/// `.ci/start-galera <command> <node>`.
fn galera(command: &str, node: usize) {
    ci::ci_script("start-galera", &[command, &node.to_string()]);
}

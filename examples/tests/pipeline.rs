//! The example pipeline (`examples/pipeline.rs`) killed end to end: orders posted under
//! load while the HTTP server, the relay and the consumers are SIGKILLed at random
//! moments and RabbitMQ is killed and restarted once; then everything drains, and every
//! order has exactly one effect and no effect lacks its order. Last, a consumer is killed
//! while it holds deliveries it has not settled, so that some are certainly delivered again.
//!
//! Runs on PostgreSQL (`IDEM_TEST_POSTGRES_URL`) and MariaDB (`IDEM_TEST_MYSQL_URL`) with
//! RabbitMQ (`IDEM_TEST_AMQP_URL`, started by `.ci/start-rabbitmq`); prints NOT RUN
//! without them outside CI.

#[path = "../../tests/support/ci.rs"]
mod ci;

use std::collections::BTreeSet;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_testkit::harness;
use rand::Rng;
use serde_json::Value;

/// Run `statement` on the server at `url` (PostgreSQL or MariaDB).
async fn run_sql(url: &str, statement: &str) {
    use idem::sqlx::Connection;
    if url.starts_with("postgres") {
        let mut connection = idem::sqlx::PgConnection::connect(url).await.unwrap();
        idem::sqlx::query(statement).execute(&mut connection).await.unwrap();
    } else {
        let mut connection = idem::sqlx::MySqlConnection::connect(url).await.unwrap();
        idem::sqlx::query(statement).execute(&mut connection).await.unwrap();
    }
}

/// A fresh database on the server at `url` for one run; its URL.
async fn fresh_database(url: &str, name: &str) -> String {
    run_sql(url, &format!("DROP DATABASE IF EXISTS {name}")).await;
    run_sql(url, &format!("CREATE DATABASE {name}")).await;
    let (base, _) = url.rsplit_once('/').unwrap();
    format!("{base}/{name}")
}

/// The orders stored in the pipeline's database at `url`.
async fn stored_orders(url: &str) -> BTreeSet<String> {
    let query = "SELECT order_ref FROM pipeline_orders";
    let rows: Vec<(String,)> = if url.starts_with("postgres") {
        let pool = idem::sqlx::PgPool::connect(url).await.unwrap();
        idem::sqlx::query_as(query).fetch_all(&pool).await.unwrap()
    } else {
        let pool = idem::sqlx::MySqlPool::connect(url).await.unwrap();
        idem::sqlx::query_as(query).fetch_all(&pool).await.unwrap()
    };
    rows.into_iter().map(|(order,)| order).collect()
}

/// Where the parts' stderr goes (warnings, and why a part could not start).
fn log_path() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("idem-pipeline-{}.log", std::process::id()))
}

/// One part of the pipeline as its own process, started again after each kill.
struct Part {
    role: &'static str,
    args: Vec<String>,
    child: Child,
    kills: u32,
}

impl Part {
    fn start(binary: &str, role: &'static str, args: &[String]) -> Part {
        let child = Self::spawn(binary, role, args);
        Part {
            role,
            args: args.to_vec(),
            child,
            kills: 0,
        }
    }

    /// The part's process, its output appended to `<temp>/idem-pipeline-<pid>.log`.
    fn spawn(binary: &str, role: &str, args: &[String]) -> Child {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log_path())
            .unwrap();
        Command::new(binary)
            .args(args)
            .args(["--role", role])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start the pipeline")
    }

    fn kill_and_restart(&mut self, binary: &str) {
        self.kill();
        self.restart(binary, &self.args.clone());
    }

    /// SIGKILL the part and wait for it to be gone.
    fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        self.kills += 1;
    }

    /// Start the (killed) part again, with `args`.
    fn restart(&mut self, binary: &str, args: &[String]) {
        self.child = Self::spawn(binary, self.role, args);
    }
}

impl Drop for Part {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Post orders with fresh keys until `stop`, each retried with its own key until it is
/// answered 201; the orders answered.
async fn customer(base: String, name: String, stop: Arc<AtomicBool>, accepted: Arc<Mutex<BTreeSet<String>>>) -> u32 {
    let client = client();
    let mut retries = 0;
    let mut n = 0;
    while !stop.load(Ordering::SeqCst) {
        n += 1;
        let (order, retried) = place_order(&client, &base, &name, n).await;
        accepted.lock().unwrap().insert(order);
        retries += retried;
    }
    retries
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

/// Order number `n` of customer `name`, retried with its key until it is answered 201:
/// the order's reference and how many retries it took.
async fn place_order(client: &reqwest::Client, base: &str, name: &str, n: u32) -> (String, u32) {
    let key = format!("{name}-{n}");
    let mut retries = 0;
    loop {
        let answer = client
            .post(format!("{base}/orders"))
            .bearer_auth(name)
            .header("idempotency-key", &key)
            .json(&serde_json::json!({"customer": name, "cents": 100 * n}))
            .send()
            .await;
        match answer {
            Ok(response) if response.status() == reqwest::StatusCode::CREATED => {
                let placed: Value = response.json().await.unwrap();
                return (placed["order"].as_str().unwrap().to_owned(), retries);
            }
            _ => {
                retries += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// With both consumers (`parts[2..]`) stopped, a few orders queued behind them; one
/// consumer started with a slow effect and killed once the broker counts deliveries it
/// holds unsettled, so that those are delivered again, for certain; then both consumers
/// as before. The orders placed.
async fn kill_a_consumer_holding_deliveries(parts: &mut [Part], binary: &str, base: &str, queue: &str) -> Vec<String> {
    let client = client();
    for consumer in &mut parts[2..] {
        consumer.kill();
    }
    let mut placed = Vec::new();
    for n in 1..=8 {
        placed.push(place_order(&client, base, "last", n).await.0);
    }
    let mut slow = parts[2].args.clone();
    let delay = slow.iter().position(|arg| arg == "--effect-delay-ms").unwrap() + 1;
    slow[delay] = "20000".into();
    parts[2].restart(binary, &slow);
    let deadline = Instant::now() + Duration::from_secs(60);
    while ci::ci_script("start-rabbitmq", &["unacked", queue]).trim() == "0" {
        assert!(
            Instant::now() < deadline,
            "the slow consumer took no delivery of {queue} in 60 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    parts[2].kill();
    for consumer in &mut parts[2..] {
        let args = consumer.args.clone();
        consumer.restart(binary, &args);
    }
    placed
}

async fn stats(base: &str) -> Option<Value> {
    reqwest::get(format!("{base}/stats")).await.ok()?.json().await.ok()
}

fn figure(stats: &Value, name: &str) -> i64 {
    stats[name]
        .as_i64()
        .unwrap_or_else(|| panic!("stats lack {name}: {stats}"))
}

/// On PostgreSQL, then on MariaDB (one after the other: both restart the one broker).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_order_has_one_effect_through_kills_and_a_broker_restart() {
    let Some(amqp) = idem_testkit::conformance::server_url("IDEM_TEST_AMQP_URL", "RabbitMQ") else {
        return;
    };
    let servers = [
        ("postgres", "IDEM_TEST_POSTGRES_URL", "PostgreSQL"),
        ("mariadb", "IDEM_TEST_MYSQL_URL", "MariaDB"),
    ];
    for (name, var, backend) in servers {
        if let Some(server) = idem_testkit::conformance::server_url(var, backend) {
            pipeline_under_kills(&amqp, &server, name).await;
        }
    }
}

async fn pipeline_under_kills(amqp: &str, server: &str, name: &str) {
    let database = fresh_database(server, &format!("pipeline_{name}_{}", std::process::id())).await;
    let queue = format!("pipeline.orders.{name}.{}", std::process::id());
    let binary = ci::example_binary("pipeline");
    let port = harness::free_port();
    let base = format!("http://127.0.0.1:{port}");
    let args: Vec<String> = [
        "--database-url",
        &database,
        "--amqp-url",
        amqp,
        "--queue",
        &queue,
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--effect-delay-ms",
        "100",
    ]
    .map(str::to_owned)
    .to_vec();
    let mut parts = [
        Part::start(&binary, "http", &args),
        Part::start(&binary, "relay", &args),
        Part::start(&binary, "consumer", &args),
        Part::start(&binary, "consumer", &args),
    ];
    harness::until_listening(
        port,
        &format!("the pipeline's HTTP server (see {})", log_path().display()),
    );

    let stop = Arc::new(AtomicBool::new(false));
    let accepted = Arc::new(Mutex::new(BTreeSet::new()));
    let customers: Vec<_> = (0..6)
        .map(|i| tokio::spawn(customer(base.clone(), format!("c{i}"), stop.clone(), accepted.clone())))
        .collect();

    // The kill schedule: at least 24 s of load, and on until the customers have placed
    // 120 orders (a loaded machine places fewer a second; at most 90 s), a kill every
    // 0.4–1.2 s of each part in turn, and the broker killed and started again once, at
    // about 10 s.
    let started = Instant::now();
    let loading = || {
        let elapsed = started.elapsed();
        elapsed < Duration::from_secs(24) || (accepted.lock().unwrap().len() < 120 && elapsed < Duration::from_secs(90))
    };
    let mut broker_restarted = false;
    let mut turn = 0;
    let mut rng = rand::rng();
    while loading() {
        tokio::time::sleep(Duration::from_millis(rng.random_range(400..1200))).await;
        if !broker_restarted && started.elapsed() > Duration::from_secs(10) {
            ci::ci_script("start-rabbitmq", &["kill"]);
            tokio::time::sleep(Duration::from_millis(500)).await;
            ci::ci_script("start-rabbitmq", &["start"]);
            broker_restarted = true;
            continue;
        }
        // Each part in turn, at a random moment.
        let victim = turn % parts.len();
        turn += 1;
        parts[victim].kill_and_restart(&binary);
        if parts[victim].role == "http" {
            harness::until_listening(
                port,
                &format!("the pipeline's HTTP server (see {})", log_path().display()),
            );
        }
    }
    stop.store(true, Ordering::SeqCst);
    let mut retries = 0;
    for customer in customers {
        retries += customer.await.unwrap();
    }
    assert!(broker_restarted, "the broker was restarted");
    let last = kill_a_consumer_holding_deliveries(&mut parts, &binary, &base, &queue).await;
    accepted.lock().unwrap().extend(last);

    // Drain: nothing pending, every order with its effects.
    let deadline = Instant::now() + Duration::from_secs(90);
    let drained = loop {
        let now = stats(&base).await;
        if let Some(now) = &now {
            if figure(now, "pending") == 0 && figure(now, "orders_without_one_effect") == 0 {
                // One more look after the consumers' requeue pause: nothing moves.
                tokio::time::sleep(Duration::from_secs(2)).await;
                break stats(&base).await.unwrap();
            }
        }
        assert!(Instant::now() < deadline, "the pipeline did not drain: {now:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let accepted = accepted.lock().unwrap().clone();
    let kills: Vec<String> = parts.iter().map(|p| format!("{} {}", p.role, p.kills)).collect();
    println!(
        "pipeline under kills on {name}: {} orders accepted, {retries} client retries, kills [{}], broker restarted once; figures {drained}",
        accepted.len(),
        kills.join(", ")
    );

    // Every accepted order exists; every order has exactly one points row and one SMS
    // row; no effect without its order.
    let orders = figure(&drained, "orders");
    assert!(accepted.len() > 100, "the load placed orders: {}", accepted.len());
    assert!(
        orders >= accepted.len() as i64,
        "an accepted order is missing: {drained}"
    );
    assert_eq!(figure(&drained, "orders_without_one_effect"), 0, "{name}: {drained}");
    assert_eq!(figure(&drained, "effects_without_order"), 0, "{name}: {drained}");
    assert_eq!(figure(&drained, "points"), orders, "{name}: {drained}");
    assert_eq!(figure(&drained, "sms"), orders, "{name}: {drained}");
    assert_eq!(figure(&drained, "published"), orders, "{name}: {drained}");
    // The faults happened: the broker delivered some messages again (at least those the
    // slow consumer held when it was killed).
    assert!(
        figure(&drained, "redelivered") > 0,
        "no message was redelivered: {drained}"
    );
    assert!(parts.iter().all(|p| p.kills > 0), "every part was killed: {kills:?}");
    // Every accepted order is in the database under its own reference.
    assert!(
        accepted.is_subset(&stored_orders(&database).await),
        "an accepted order is not stored"
    );
}

//! The example pipeline (`examples/pipeline.rs`) killed end to end: orders posted under
//! load while the HTTP server, the relay and the consumers are SIGKILLed at random
//! moments and a broker node is killed and restarted once; then everything drains, and
//! every order has exactly one effect and no effect lacks its order. Last, a consumer is
//! killed while it holds deliveries it has not settled, so that some are certainly
//! delivered again.
//!
//! Three brokers, each on PostgreSQL (`IDEM_TEST_POSTGRES_URL`) and MariaDB
//! (`IDEM_TEST_MYSQL_URL`): one RabbitMQ node (`IDEM_TEST_AMQP_URL`, `.ci/start-rabbitmq`);
//! a three-node RabbitMQ cluster with a quorum queue, the node the clients connect to
//! first killed (`IDEM_TEST_AMQP_CLUSTER_URLS`, `.ci/start-rabbitmq-cluster`); and a
//! three-node JetStream cluster with a stream of three replicas, the stream's leader
//! killed (`IDEM_TEST_NATS_CLUSTER_URLS`, `.ci/start-nats`). Each prints NOT RUN without
//! its URLs outside CI.

#[path = "../../tests/support/ci.rs"]
mod ci;

use std::collections::BTreeSet;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_testkit::harness;
use rand::{Rng, SeedableRng};
use serde_json::Value;

/// A short name of `broker` for databases, queues and streams.
fn broker_tag(broker: Broker) -> &'static str {
    match broker {
        Broker::RabbitMq => "rmq",
        Broker::RabbitMqCluster => "rmqc",
        Broker::JetStreamCluster => "js",
    }
}

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
    idem_testkit::scratch::path("pipeline.log")
}

/// The last `lines` lines of the parts' log.
fn log_tail(lines: usize) -> String {
    let log = std::fs::read_to_string(log_path()).unwrap_or_default();
    let all: Vec<&str> = log.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
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

/// Why the customers' requests were retried: an HTTP status, or `no answer` (the server
/// down or too slow), and how many times each.
type Retries = std::collections::BTreeMap<String, u32>;

/// Post orders with fresh keys until `stop`, each retried with its own key until it is
/// answered 201; why requests were retried.
async fn customer(
    base: String,
    name: String,
    stop: Arc<AtomicBool>,
    accepted: Arc<Mutex<BTreeSet<String>>>,
) -> Retries {
    let client = client();
    let mut retries = Retries::new();
    let mut n = 0;
    while !stop.load(Ordering::SeqCst) {
        n += 1;
        let order = place_order(&client, &base, &name, n, &mut retries).await;
        accepted.lock().unwrap().insert(order);
    }
    retries
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

/// Order number `n` of customer `name`, retried with its key until it is answered 201,
/// each retry's reason counted in `retries`: the order's reference.
async fn place_order(client: &reqwest::Client, base: &str, name: &str, n: u32, retries: &mut Retries) -> String {
    let key = format!("{name}-{n}");
    loop {
        let answer = client
            .post(format!("{base}/orders"))
            .bearer_auth(name)
            .header("idempotency-key", &key)
            .json(&serde_json::json!({"customer": name, "cents": 100 * n}))
            .send()
            .await;
        let reason = match answer {
            Ok(response) if response.status() == reqwest::StatusCode::CREATED => {
                let placed: Value = response.json().await.unwrap();
                return placed["order"].as_str().unwrap().to_owned();
            }
            Ok(response) => response.status().as_u16().to_string(),
            Err(_) => "no answer".to_owned(),
        };
        *retries.entry(reason).or_default() += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// With both consumers (`parts[2..]`) stopped, a few orders queued behind them; one
/// consumer started with a slow effect and killed once the broker counts deliveries it
/// holds unsettled, so that those are delivered again, for certain; then both consumers
/// as before. The orders placed.
async fn kill_a_consumer_holding_deliveries(
    parts: &mut [Part],
    binary: &str,
    base: &str,
    (broker, url, queue): (Broker, &str, &str),
) -> Vec<String> {
    let client = client();
    for consumer in &mut parts[2..] {
        consumer.kill();
    }
    let mut placed = Vec::new();
    for n in 1..=8 {
        placed.push(place_order(&client, base, "last", n, &mut Retries::new()).await);
    }
    // An effect slower than the wait below: the consumer still holds its deliveries
    // however long the broker's count takes to answer on a loaded machine.
    let mut slow = parts[2].args.clone();
    let delay = slow.iter().position(|arg| arg == "--effect-delay-ms").unwrap() + 1;
    slow[delay] = "600000".into();
    parts[2].restart(binary, &slow);
    let deadline = Instant::now() + Duration::from_secs(60);
    while broker.unacked(url, queue).await == 0 {
        if Instant::now() >= deadline {
            // What the pipeline counted, and what its parts said, to tell a relay that
            // published nothing from a consumer that took nothing.
            let figures = stats(base)
                .await
                .map_or_else(|| "(no answer)".to_owned(), |now| now.to_string());
            panic!(
                "the slow consumer took no delivery of {queue} in 60 s; the pipeline's figures: {figures}; \
                 the end of the parts' log:\n{}",
                log_tail(40)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    parts[2].kill();
    for consumer in &mut parts[2..] {
        let args = consumer.args.clone();
        consumer.restart(binary, &args);
    }
    placed
}

/// The broker a run goes through, and how its faults are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Broker {
    /// One RabbitMQ node, a classic durable queue.
    RabbitMq,
    /// A three-node RabbitMQ cluster, a quorum queue.
    RabbitMqCluster,
    /// A three-node JetStream cluster, a stream with three replicas.
    JetStreamCluster,
}

impl Broker {
    /// Its name in the test's output.
    fn name(self) -> &'static str {
        match self {
            Broker::RabbitMq => "one RabbitMQ node",
            Broker::RabbitMqCluster => "a RabbitMQ cluster (quorum queue)",
            Broker::JetStreamCluster => "a JetStream cluster",
        }
    }

    /// The example's arguments for it, the orders travelling on `queue`.
    fn args(self, url: &str, queue: &str) -> Vec<String> {
        let mut args = vec!["--broker".to_owned(), url.to_owned()];
        match self {
            Broker::RabbitMq => {}
            Broker::RabbitMqCluster => args.push("--quorum".to_owned()),
            Broker::JetStreamCluster => args.extend(["--stream".to_owned(), stream_of(queue)]),
        }
        args
    }

    /// Kill one broker node, wait, and start it again: which node.
    async fn kill_a_node(self, queue: &str) -> String {
        let (script, node) = match self {
            Broker::RabbitMq => ("start-rabbitmq", None),
            // The node every client connects to first.
            Broker::RabbitMqCluster => ("start-rabbitmq-cluster", Some("1".to_owned())),
            Broker::JetStreamCluster => {
                let leader = ci::ci_script("start-nats", &["leader", &stream_of(queue)]);
                ("start-nats", Some(leader.trim().to_owned()))
            }
        };
        let node_args: Vec<&str> = node.iter().map(String::as_str).collect();
        ci::ci_script(script, &[&["kill"], &node_args[..]].concat());
        tokio::time::sleep(Duration::from_millis(if node.is_some() { 2000 } else { 500 })).await;
        ci::ci_script(script, &[&["start"], &node_args[..]].concat());
        match node {
            Some(node) => format!("node {node}"),
            None => "the node".to_owned(),
        }
    }

    /// How many deliveries of `queue` a consumer holds unsettled.
    async fn unacked(self, url: &str, queue: &str) -> u64 {
        let script = match self {
            Broker::RabbitMq => "start-rabbitmq",
            Broker::RabbitMqCluster => "start-rabbitmq-cluster",
            Broker::JetStreamCluster => return ack_pending(url, &stream_of(queue)).await,
        };
        ci::ci_script(script, &["unacked", queue]).trim().parse().unwrap_or(0)
    }
}

/// The JetStream stream a run keeps the subject `queue` in (the run names it).
fn stream_of(queue: &str) -> String {
    queue.replace('.', "_")
}

/// Messages of `stream` delivered to the example's durable consumer and not yet acked
/// (0 while the stream or the consumer is not there yet).
async fn ack_pending(url: &str, stream: &str) -> u64 {
    use idem::nats::async_nats::jetstream::{self, consumer::pull};
    let servers: Vec<idem::nats::async_nats::ServerAddr> = url.split(',').map(|s| s.parse().unwrap()).collect();
    let Ok(client) = idem::nats::async_nats::connect(servers).await else {
        return 0;
    };
    let js = jetstream::new(client);
    let Ok(stream) = js.get_stream(stream).await else {
        return 0;
    };
    let Ok(mut consumer) = stream.get_consumer::<pull::Config>("pipeline").await else {
        return 0;
    };
    consumer
        .info()
        .await
        .map(|info| info.num_ack_pending as u64)
        .unwrap_or(0)
}

async fn stats(base: &str) -> Option<Value> {
    reqwest::get(format!("{base}/stats")).await.ok()?.json().await.ok()
}

fn figure(stats: &Value, name: &str) -> i64 {
    stats[name]
        .as_i64()
        .unwrap_or_else(|| panic!("stats lack {name}: {stats}"))
}

/// The three brokers at once, each on PostgreSQL, then on MariaDB (a broker's two runs
/// one after the other: both kill its nodes). Blocking calls (the scripts, a killed
/// process's wait) take a worker each for a moment: enough workers for the three runs'
/// clients to go on meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn every_order_has_one_effect_through_kills_and_a_broker_node_restart() {
    let brokers = [
        (Broker::RabbitMq, "IDEM_TEST_AMQP_URL", "RabbitMQ"),
        (
            Broker::RabbitMqCluster,
            "IDEM_TEST_AMQP_CLUSTER_URLS",
            "a RabbitMQ cluster",
        ),
        (
            Broker::JetStreamCluster,
            "IDEM_TEST_NATS_CLUSTER_URLS",
            "a NATS JetStream cluster",
        ),
    ];
    let servers = [
        ("postgres", "IDEM_TEST_POSTGRES_URL", "PostgreSQL"),
        ("mariadb", "IDEM_TEST_MYSQL_URL", "MariaDB"),
    ];
    let mut runs = tokio::task::JoinSet::new();
    for (broker, broker_var, broker_name) in brokers {
        let Some(url) = idem_testkit::conformance::server_url(broker_var, broker_name) else {
            continue;
        };
        let databases: Vec<(&str, String)> = servers
            .iter()
            .filter_map(|(name, var, backend)| Some((*name, idem_testkit::conformance::server_url(var, backend)?)))
            .collect();
        runs.spawn(async move {
            for (name, server) in databases {
                pipeline_under_kills(broker, &url, &server, name).await;
            }
        });
    }
    while let Some(run) = runs.join_next().await {
        if let Err(failed) = run {
            std::panic::resume_unwind(failed.into_panic());
        }
    }
}

async fn pipeline_under_kills(broker: Broker, url: &str, server: &str, name: &str) {
    let run = format!("{name}_{}_{}", broker_tag(broker), std::process::id());
    let database = fresh_database(server, &format!("pipeline_{run}")).await;
    let queue = format!("pipeline.orders.{run}");
    let binary = ci::example_binary("pipeline");
    let port = harness::free_port();
    let base = format!("http://127.0.0.1:{port}");
    let mut args: Vec<String> = [
        "--database-url",
        &database,
        "--queue",
        &queue,
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--effect-delay-ms",
        "100",
    ]
    .map(str::to_owned)
    .to_vec();
    args.extend(broker.args(url, &queue));
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
    // 0.4–1.2 s of each part in turn, and a broker node killed and started again once,
    // at about 10 s.
    let started = Instant::now();
    let loading = || {
        let elapsed = started.elapsed();
        elapsed < Duration::from_secs(24) || (accepted.lock().unwrap().len() < 120 && elapsed < Duration::from_secs(90))
    };
    let mut broker_restarted = None;
    let mut turn = 0;
    let mut rng = rand::rngs::StdRng::from_os_rng();
    while loading() {
        tokio::time::sleep(Duration::from_millis(rng.random_range(400..1200))).await;
        if broker_restarted.is_none() && started.elapsed() > Duration::from_secs(10) {
            broker_restarted = Some(broker.kill_a_node(&queue).await);
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
    let mut retries = Retries::new();
    for customer in customers {
        for (reason, count) in customer.await.unwrap() {
            *retries.entry(reason).or_default() += count;
        }
    }
    let killed = broker_restarted.expect("a broker node was killed and restarted");
    let last = kill_a_consumer_holding_deliveries(&mut parts, &binary, &base, (broker, url, &queue)).await;
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
        "pipeline under kills on {name} through {}: {} orders accepted, client retries {retries:?}, kills [{}], {killed} of the broker killed and restarted; figures {drained}",
        broker.name(),
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
    let run = format!("{name} through {}", broker.name());
    assert_eq!(figure(&drained, "orders_without_one_effect"), 0, "{run}: {drained}");
    assert_eq!(figure(&drained, "effects_without_order"), 0, "{run}: {drained}");
    assert_eq!(figure(&drained, "points"), orders, "{run}: {drained}");
    assert_eq!(figure(&drained, "sms"), orders, "{run}: {drained}");
    assert_eq!(figure(&drained, "published"), orders, "{run}: {drained}");
    assert_eq!(figure(&drained, "pending"), 0, "{run}: nothing left unsent: {drained}");
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

//! The RabbitMQ consumer and the outbox relay against a real broker (`IDEM_TEST_AMQP_URL`,
//! started by `.ci/start-rabbitmq`): what each kind of answer does to a delivery, and
//! relays sharing one outbox. Prints NOT RUN without a broker outside CI.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem::amqp::lapin::options::{BasicPublishOptions, QueueDeclareOptions, QueueDeleteOptions};
use idem::amqp::lapin::types::{AMQPValue, FieldTable};
use idem::amqp::lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use idem::amqp::{
    AmqpBroker, Consumer, ConsumerStats, HandlerError, KeySource, Message, OnFailure, Outbox, OutboxMessage, Relay,
};
use idem::{Error, Idempotent, MemoryStore, OnError};
use idem_testkit::conformance::faulty::{Fault, FaultyStore, Op, Store};
use serde_json::{json, Value};

mod proxy;

/// The broker's URL, or `None` (and a line saying so) outside CI.
fn amqp_url() -> Option<String> {
    idem_testkit::conformance::server_url("IDEM_TEST_AMQP_URL", "RabbitMQ")
}

/// A channel, and a fresh durable queue `name` (dead-lettering to `name.dead`, which is
/// made fresh too).
async fn fresh_queue(url: &str, name: &str) -> Channel {
    let connection = Connection::connect(url, ConnectionProperties::default()).await.unwrap();
    let channel = connection.create_channel().await.unwrap();
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    let dead = format!("{name}.dead");
    for queue in [name, dead.as_str()] {
        channel
            .queue_delete(queue.into(), QueueDeleteOptions::default())
            .await
            .unwrap();
    }
    let mut arguments = FieldTable::default();
    arguments.insert("x-dead-letter-exchange".into(), AMQPValue::LongString("".into()));
    arguments.insert(
        "x-dead-letter-routing-key".into(),
        AMQPValue::LongString(dead.as_str().into()),
    );
    channel.queue_declare(name.into(), durable, arguments).await.unwrap();
    channel
        .queue_declare(dead.as_str().into(), durable, FieldTable::default())
        .await
        .unwrap();
    // The connection lives as long as the channel is used: leaked on purpose in tests.
    std::mem::forget(connection);
    channel
}

async fn publish(channel: &Channel, queue: &str, id: Option<&str>, body: &[u8]) {
    let mut properties = BasicProperties::default().with_delivery_mode(2);
    if let Some(id) = id {
        properties = properties.with_message_id(id.into());
    }
    channel
        .basic_publish(
            "".into(),
            queue.into(),
            BasicPublishOptions::default(),
            body,
            properties,
        )
        .await
        .unwrap();
}

/// How many messages wait in `queue`.
async fn waiting(channel: &Channel, queue: &str) -> u32 {
    let passive = QueueDeclareOptions {
        passive: true,
        ..QueueDeclareOptions::default()
    };
    channel
        .queue_declare(queue.into(), passive, FieldTable::default())
        .await
        .unwrap()
        .message_count()
}

/// Run `consumer` with `handler` in the background until the returned sender is
/// dropped or sent to.
fn spawn<F, Fut, E>(consumer: Consumer, handler: F) -> tokio::sync::oneshot::Sender<()>
where
    F: Fn(Message<Value>) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<Value, E>> + Send + 'static,
    E: HandlerError + Send + 'static,
{
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        consumer
            .run_until(
                async {
                    let _ = stopped.await;
                },
                handler,
            )
            .await;
    });
    stop
}

/// Wait (at most 20 s) until `done` holds of the consumer's stats.
async fn until(consumer: &Consumer, done: impl Fn(&ConsumerStats) -> bool) -> ConsumerStats {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let stats = consumer.stats();
        if done(&stats) {
            return stats;
        }
        assert!(Instant::now() < deadline, "consumer stuck: {stats:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A handler's error: idem's, or the business's own refusal.
#[derive(Debug, thiserror::Error)]
enum CreditError {
    #[error(transparent)]
    Idem(#[from] Error),
    #[error("the business refused")]
    Refused,
}

impl HandlerError for CreditError {
    fn idem_error(&self) -> Option<&Error> {
        match self {
            CreditError::Idem(error) => Some(error),
            CreditError::Refused => None,
        }
    }
}

type Answer = std::pin::Pin<Box<dyn std::future::Future<Output = Result<Value, CreditError>> + Send>>;

/// A handler running `op` keyed by the message key; `runs` counts bodies, each taking
/// `pause`, and refusing when `fail`.
fn counted(
    op: Idempotent,
    runs: Arc<AtomicU32>,
    pause: Duration,
    fail: bool,
) -> impl Fn(Message<Value>) -> Answer + Send + Sync + 'static {
    move |message| {
        let (op, runs) = (op.clone(), runs.clone());
        Box::pin(async move {
            op.execute(&message.key, async {
                runs.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(pause).await;
                if fail {
                    return Err(CreditError::Refused);
                }
                Ok(json!({"credited": message.body["points"]}))
            })
            .await
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivered_again_finished_message_is_acked_with_the_first_answer_and_not_run() {
    let Some(url) = amqp_url() else { return };
    let queue = "idem.test.replay";
    let channel = fresh_queue(&url, queue).await;
    for _ in 0..3 {
        publish(&channel, queue, Some("order-1"), br#"{"points": 7}"#).await;
    }
    publish(&channel, queue, Some("order-2"), br#"{"points": 9}"#).await;
    let runs = Arc::new(AtomicU32::new(0));
    let answers = Arc::new(Mutex::new(Vec::new()));
    let op = Idempotent::new("amqp.replay").store(Arc::new(MemoryStore::new()));
    // One delivery at a time: each duplicate meets the finished record.
    let consumer = Consumer::new(&url, queue).prefetch(1);
    let handler = counted(op, runs.clone(), Duration::ZERO, false);
    let seen = answers.clone();
    let _stop = spawn(consumer.clone(), move |message| {
        let (handler, seen) = (handler(message), seen.clone());
        async move {
            let answer = handler.await?;
            seen.lock().unwrap().push(answer.clone());
            Ok::<_, CreditError>(answer)
        }
    });
    let stats = until(&consumer, |s| s.acked == 4).await;
    assert_eq!(runs.load(Ordering::SeqCst), 2, "one body per message id");
    let answers = answers.lock().unwrap().clone();
    assert_eq!(
        answers.iter().filter(|a| **a == json!({"credited": 7})).count(),
        3,
        "{answers:?}"
    );
    assert_eq!((stats.requeued, stats.failed), (0, 0));
    assert_eq!(waiting(&channel, queue).await, 0);
}

/// The broker stops delivering to a session while its connection stays up: its
/// deliveries are swallowed on the way (the broker counts them as made, as a quorum
/// queue whose leader moved can, and sends nothing more once the prefetch is spent).
/// The consumer finds the session stalled, closes it (the swallowed deliveries go back
/// to the queue) and consumes on a new one: every message runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_the_broker_stops_delivering_to_is_replaced() {
    let Some(url) = amqp_url() else { return };
    stalled_session_replaced(&url, "idem.test.stall", proxy::Swallowing::swallow_deliveries).await;
}

/// The connection goes silent one way: nothing the broker sends reaches the consumer
/// (the consumer's frames still reach the broker). The question whether messages are
/// ready goes unanswered; the session is taken for dead and replaced: every message
/// runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_gone_silent_is_replaced() {
    let Some(url) = amqp_url() else { return };
    stalled_session_replaced(&url, "idem.test.silent", proxy::Swallowing::swallow_everything).await;
}

/// The connection dies (the proxy closes both sockets, as a broker node that died does)
/// while a delivery's body runs; the body finishes after it, and its ack has no
/// connection left to go out on. The session ends all the same, the consumer goes on
/// on a new one, and the message, delivered again, is answered from its record: every
/// message runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_settled_after_its_connection_died_does_not_hold_the_session() {
    let Some(url) = amqp_url() else { return };
    let queue = "idem.test.cut";
    let channel = fresh_queue(&url, queue).await;
    const MESSAGES: u64 = 20;
    for i in 0..MESSAGES {
        publish(&channel, queue, Some(&format!("order-{i}")), br#"{"points": 1}"#).await;
    }
    let proxy = proxy::Swallowing::start(&url).await;
    let runs = Arc::new(AtomicU32::new(0));
    let op = Idempotent::new(queue).store(Arc::new(MemoryStore::new()));
    // The first body tells it runs, and finishes 200 ms after the cut.
    let (in_body, cut) = (
        Arc::new(tokio::sync::Notify::new()),
        Arc::new(tokio::sync::Notify::new()),
    );
    let handler = {
        let (runs, in_body, cut) = (runs.clone(), in_body.clone(), cut.clone());
        move |message: Message<Value>| -> Answer {
            let (op, runs, in_body, cut) = (op.clone(), runs.clone(), in_body.clone(), cut.clone());
            Box::pin(async move {
                op.execute(&message.key, async {
                    if runs.fetch_add(1, Ordering::SeqCst) == 0 {
                        in_body.notify_one();
                        cut.notified().await;
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    Ok(json!({"credited": message.body["points"]}))
                })
                .await
            })
        }
    };
    let consumer = Consumer::new(proxy.url(), queue)
        .prefetch(1)
        .stall_check(Duration::from_millis(500));
    let _stop = spawn(consumer.clone(), handler);
    tokio::time::timeout(Duration::from_secs(20), in_body.notified())
        .await
        .expect("the first body ran");
    proxy.cut();
    cut.notify_one();
    let stats = until(&consumer, |s| s.acked >= MESSAGES).await;
    replaced_and_each_run_once(&channel, queue, &runs, MESSAGES, &stats).await;
    println!("{queue}: {MESSAGES} messages, the connection cut under a running body: {stats:?}");
}

/// After a lost session: it was replaced, each of the `messages` ran one body, and
/// none is left in the queue.
async fn replaced_and_each_run_once(
    channel: &Channel,
    queue: &str,
    runs: &AtomicU32,
    messages: u64,
    stats: &ConsumerStats,
) {
    assert!(stats.sessions_lost >= 1, "the lost session was replaced: {stats:?}");
    assert_eq!(
        u64::from(runs.load(Ordering::SeqCst)),
        messages,
        "one body per message: {stats:?}"
    );
    assert_eq!(waiting(channel, queue).await, 0);
}

/// 200 messages consumed through a proxy that starts to `swallow` part of what the
/// broker sends the first session once a quarter are acked: each runs once, and the
/// session is replaced.
async fn stalled_session_replaced(url: &str, queue: &'static str, swallow: fn(&proxy::Swallowing)) {
    let channel = fresh_queue(url, queue).await;
    const MESSAGES: u64 = 200;
    for i in 0..MESSAGES {
        publish(&channel, queue, Some(&format!("order-{i}")), br#"{"points": 1}"#).await;
    }
    let proxy = proxy::Swallowing::start(url).await;
    let runs = Arc::new(AtomicU32::new(0));
    let op = Idempotent::new(queue).store(Arc::new(MemoryStore::new()));
    let consumer = Consumer::new(proxy.url(), queue)
        .prefetch(10)
        .stall_check(Duration::from_millis(500));
    let handler = counted(op, runs.clone(), Duration::from_millis(2), false);
    let _stop = spawn(consumer.clone(), handler);
    until(&consumer, |s| s.acked >= MESSAGES / 4).await;
    swallow(&proxy);
    let stats = until(&consumer, |s| s.acked >= MESSAGES).await;
    assert!(proxy.swallowed() > 0, "the proxy swallowed nothing: {stats:?}");
    replaced_and_each_run_once(&channel, queue, &runs, MESSAGES, &stats).await;
    println!(
        "{queue}: {MESSAGES} messages, {} frames swallowed on the first session: {stats:?}",
        proxy.swallowed()
    );
}

/// Through a sealed store: the first answer is replayed to a redelivery and kept
/// sealed; a redelivery after the `ttl` of an operation keeping tombstones meets the
/// tombstone and is acked, never run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sealed_consumer_replays_and_acks_a_message_that_meets_its_tombstone() {
    use idem::seal::{SealKey, SealedStore, StaticKeyRing, SEALED_PREFIX};
    let Some(url) = amqp_url() else { return };
    let queue = "idem.test.sealed";
    let channel = fresh_queue(&url, queue).await;
    let plain = Arc::new(MemoryStore::new());
    let ring = StaticKeyRing::new(SealKey::new("k1", [5; 32]).unwrap(), []);
    let op = Idempotent::new("amqp.sealed")
        .ttl(Duration::from_millis(800))
        .after_expiry(idem::AfterExpiry::Gone(Duration::from_secs(60)))
        .store(Arc::new(SealedStore::new(plain.clone(), ring)));
    let runs = Arc::new(AtomicU32::new(0));
    let consumer = Consumer::new(&url, queue).prefetch(1);
    let _stop = spawn(consumer.clone(), counted(op, runs.clone(), Duration::ZERO, false));
    for _ in 0..2 {
        publish(&channel, queue, Some("order-1"), br#"{"points": 7}"#).await;
    }
    until(&consumer, |s| s.acked == 2).await;
    let stored = idem::IdempotencyStore::get(plain.as_ref(), "amqp.sealed", "order-1")
        .await
        .unwrap()
        .unwrap();
    let response = stored.response_body.unwrap();
    assert!(
        response.starts_with(SEALED_PREFIX) && !response.contains("credited"),
        "{response}"
    );
    tokio::time::sleep(Duration::from_millis(1000)).await;
    publish(&channel, queue, Some("order-1"), br#"{"points": 7}"#).await;
    let stats = until(&consumer, |s| s.acked == 3).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1, "one body, whatever came after");
    assert_eq!((stats.requeued, stats.failed), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_still_running_elsewhere_is_not_acked_and_comes_back_after_a_pause() {
    let Some(url) = amqp_url() else { return };
    let queue = "idem.test.in_progress";
    let channel = fresh_queue(&url, queue).await;
    publish(&channel, queue, Some("order-1"), br#"{"points": 7}"#).await;
    publish(&channel, queue, Some("order-1"), br#"{"points": 7}"#).await;
    let runs = Arc::new(AtomicU32::new(0));
    let op = Idempotent::new("amqp.in_progress").store(Arc::new(MemoryStore::new()));
    // Two consumers, one delivery each; the body takes 1.5 s, the pause is 300 ms.
    let pause = Duration::from_millis(300);
    let first = Consumer::new(&url, queue).prefetch(1).redeliver_after(pause);
    let second = Consumer::new(&url, queue).prefetch(1).redeliver_after(pause);
    let started = Instant::now();
    let _a = spawn(
        first.clone(),
        counted(op.clone(), runs.clone(), Duration::from_millis(1500), false),
    );
    let _b = spawn(
        second.clone(),
        counted(op, runs.clone(), Duration::from_millis(1500), false),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while first.stats().acked + second.stats().acked < 2 {
        assert!(Instant::now() < deadline, "{:?} {:?}", first.stats(), second.stats());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let requeued = first.stats().requeued + second.stats().requeued;
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the body ran once");
    assert!(requeued >= 1, "the duplicate met the running body and was requeued");
    // Not a hot loop: each requeue waited its pause while the body ran.
    assert!(
        requeued <= 1 + (started.elapsed().as_millis() / pause.as_millis()) as u64,
        "{requeued} requeues"
    );
    assert_eq!(waiting(&channel, queue).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_error_never_acks() {
    let Some(url) = amqp_url() else { return };
    let queue = "idem.test.store_error";
    let channel = fresh_queue(&url, queue).await;
    publish(&channel, queue, Some("order-1"), br#"{"points": 7}"#).await;
    let memory: Store = Arc::new(MemoryStore::new());
    let faulty = FaultyStore::new(&memory);
    faulty.inject(Op::Claim, Fault::Fail, 3);
    let runs = Arc::new(AtomicU32::new(0));
    let op = Idempotent::new("amqp.store_error").store(faulty.shared());
    let consumer = Consumer::new(&url, queue).redeliver_after(Duration::from_millis(100));
    let _stop = spawn(consumer.clone(), counted(op, runs.clone(), Duration::ZERO, false));
    let stats = until(&consumer, |s| s.acked == 1).await;
    assert_eq!(faulty.errors(Op::Claim), 3);
    assert_eq!(
        stats.requeued, 3,
        "each failed claim left the message unacked: {stats:?}"
    );
    assert_eq!(stats.redelivered, 3, "and the broker delivered it again: {stats:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(waiting(&channel, queue).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_failure_follows_the_policy_and_what_cannot_run_is_not_run() {
    let Some(url) = amqp_url() else { return };
    for (queue, policy) in [
        ("idem.test.dead_letter", OnFailure::DeadLetter),
        ("idem.test.ack_and_drop", OnFailure::AckAndDrop),
    ] {
        let channel = fresh_queue(&url, queue).await;
        publish(&channel, queue, Some("order-1"), br#"{"points": 7}"#).await;
        // No key, and a body that is not JSON: never run.
        publish(&channel, queue, None, br#"{"points": 8}"#).await;
        publish(&channel, queue, Some("order-2"), b"not json").await;
        let runs = Arc::new(AtomicU32::new(0));
        let op = Idempotent::new(format!("amqp.{queue}"))
            .store(Arc::new(MemoryStore::new()))
            .on_error(OnError::Record);
        let consumer = Consumer::new(&url, queue)
            .redeliver_after(Duration::from_millis(100))
            .on_failure(policy);
        let _stop = spawn(consumer.clone(), counted(op, runs.clone(), Duration::ZERO, true));
        let stats = until(&consumer, |s| s.failed == 3).await;
        // The body failed once (recorded); its redelivery met the record, final.
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{queue}");
        assert_eq!((stats.requeued, stats.acked), (1, 0), "{queue}: {stats:?}");
        assert_eq!(waiting(&channel, queue).await, 0, "{queue}");
        let dead = waiting(&channel, &format!("{queue}.dead")).await;
        match policy {
            OnFailure::DeadLetter => assert_eq!(dead, 3, "{queue}: dead-lettered"),
            _ => assert_eq!(dead, 0, "{queue}: dropped"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_can_come_from_a_header() {
    let Some(url) = amqp_url() else { return };
    let queue = "idem.test.header_key";
    let channel = fresh_queue(&url, queue).await;
    for n in [41i64, 41, 42] {
        let mut headers = FieldTable::default();
        headers.insert("order".into(), AMQPValue::LongLongInt(n));
        let properties = BasicProperties::default().with_headers(headers);
        channel
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                b"{}",
                properties,
            )
            .await
            .unwrap();
    }
    let keys = Arc::new(Mutex::new(Vec::new()));
    let consumer = Consumer::new(&url, queue).key(KeySource::Header("order".into()));
    let seen = keys.clone();
    let _stop = spawn(consumer.clone(), move |message: Message<Value>| {
        seen.lock().unwrap().push(message.key);
        async { Ok::<_, Error>(Value::Null) }
    });
    until(&consumer, |s| s.acked == 3).await;
    assert_eq!(*keys.lock().unwrap(), ["41", "41", "42"]);
}

/// The consumer connects with the application's connection properties (here a client
/// property of its own), and names its connection; the broker lists both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_connects_with_the_applications_properties() {
    let Some(url) = amqp_url() else { return };
    let queue = "idem.test.properties";
    let channel = fresh_queue(&url, queue).await;
    publish(&channel, queue, Some("m-1"), b"{}").await;
    let mark = format!("app-{}", std::process::id());
    let properties = ConnectionProperties::default().with_client_property("idem-test-app".into(), mark.as_str().into());
    let consumer = Consumer::new(&url, queue).connection_properties(properties);
    let _stop = spawn(consumer.clone(), |_: Message<Value>| async {
        Ok::<_, Error>(Value::Null)
    });
    until(&consumer, |s| s.acked == 1).await;
    // The broker's list, asked again until it shows the connection (at most 10 s).
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../.ci/start-rabbitmq");
    let name = format!("idem consumer of {queue}");
    let deadline = Instant::now() + Duration::from_secs(10);
    let ours = loop {
        let listed = std::process::Command::new("bash")
            .args([script, "connections"])
            .output()
            .expect("run .ci/start-rabbitmq connections");
        let text = String::from_utf8_lossy(&listed.stdout).into_owned();
        if let Some(line) = text.lines().find(|line| line.contains(&name)) {
            break line.to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "the consumer's connection is listed by its name: {text}{}",
            String::from_utf8_lossy(&listed.stderr)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(ours.contains(&mark), "its client property is the application's: {ours}");
}

/// The outbox `table`, made, holding a row no queue takes and then `rows` messages to
/// `queue`.
async fn filled_outbox<DB: idem::amqp::OutboxDatabase>(
    pool: &idem::sqlx::Pool<DB>,
    table: &str,
    queue: &str,
    rows: u64,
) -> Outbox<DB> {
    let outbox = Outbox::<DB>::named(table).unwrap();
    outbox.migrate(pool).await.unwrap();
    // In a transaction, as a business pushes its messages.
    let mut transaction = pool.begin().await.unwrap();
    let nowhere = OutboxMessage::json("", "idem.test.nowhere", &json!({"lost": true})).unwrap();
    outbox.push(&mut transaction, &nowhere).await.unwrap();
    for n in 0..rows {
        let message = OutboxMessage::json("", queue, &json!({"n": n})).unwrap();
        outbox.push(&mut transaction, &message).await.unwrap();
    }
    transaction.commit().await.unwrap();
    outbox
}

/// Run `relay` (a clone of it) in the background until the returned sender is dropped
/// or sent to.
fn spawn_relay<DB: idem::amqp::OutboxDatabase>(relay: &Relay<DB>) -> tokio::sync::oneshot::Sender<()> {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let relay = relay.clone();
    tokio::spawn(async move {
        relay
            .run_until(async {
                let _ = stopped.await;
            })
            .await
    });
    stop
}

/// `$check(&url, pool, name)` on a SQLite file, then on PostgreSQL and MariaDB where
/// their URLs are set (a generic `async fn` is not a value to pass around).
macro_rules! on_every_database {
    ($url:expr, $check:ident) => {{
        let url: &str = $url;
        let file = idem_testkit::scratch::path(&format!("{}.db", stringify!($check)));
        let sqlite = idem::sqlx::SqlitePool::connect(&format!("sqlite://{}?mode=rwc", file.display()))
            .await
            .unwrap();
        $check(url, sqlite, "sqlite").await;
        let _ = std::fs::remove_file(file);
        if let Some(database) = idem_testkit::conformance::server_url("IDEM_TEST_POSTGRES_URL", "PostgreSQL") {
            $check(url, idem::sqlx::PgPool::connect(&database).await.unwrap(), "postgres").await;
        }
        if let Some(database) = idem_testkit::conformance::server_url("IDEM_TEST_MYSQL_URL", "MariaDB") {
            $check(url, idem::sqlx::MySqlPool::connect(&database).await.unwrap(), "mariadb").await;
        }
    }};
}

/// Relays at once on one outbox: every row published once (where rows are locked), in
/// confirmed order of marking; an unroutable row stays unsent and does not hold back
/// the rows behind it.
async fn relays_share_an_outbox<DB: idem::amqp::OutboxDatabase>(
    url: &str,
    pool: idem::sqlx::Pool<DB>,
    name: &str,
    relays: usize,
) {
    let queue = format!("idem.test.relay.{name}");
    let channel = fresh_queue(url, &queue).await;
    let rows = 600;
    let outbox = filled_outbox(&pool, &format!("outbox_{name}_{}", std::process::id()), &queue, rows).await;
    let delivered = Arc::new(Mutex::new(HashMap::<String, u32>::new()));
    let consumer = Consumer::new(url, queue.as_str()).prefetch(64);
    let seen = delivered.clone();
    let _stop_consumer = spawn(consumer.clone(), move |message: Message<Value>| {
        *seen.lock().unwrap().entry(message.key).or_default() += 1;
        async { Ok::<_, Error>(Value::Null) }
    });
    let started = Instant::now();
    let relays: Vec<Relay<DB>> = (0..relays)
        .map(|_| {
            Relay::new(pool.clone(), outbox.clone(), url)
                .batch(50)
                .idle(Duration::from_millis(20))
        })
        .collect();
    let mut stops = Vec::new();
    for relay in &relays {
        stops.push(spawn_relay(relay));
    }
    until(&consumer, |s| s.acked >= rows).await;
    let elapsed = started.elapsed();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let counts = outbox.counts(&pool).await.unwrap();
    assert_eq!(
        (counts.pending, counts.sent),
        (1, rows as i64),
        "{name}: the unroutable row stays unsent"
    );
    let delivered = delivered.lock().unwrap().clone();
    assert_eq!(delivered.len(), rows as usize, "{name}: every row arrived");
    let twice: Vec<_> = delivered.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "{name}: rows published twice by relays at once: {twice:?}"
    );
    let returned: u64 = relays.iter().map(|r| r.stats().returned).sum();
    assert!(returned >= 1, "{name}: the broker returned the unroutable row");
    let published: u64 = relays.iter().map(|r| r.stats().published).sum();
    println!(
        "{name}: {} relays published {rows} rows in {elapsed:?} ({published} publishes, {returned} returned)",
        relays.len()
    );
    drop(channel);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_on_postgres_share_an_outbox() {
    let Some(url) = amqp_url() else { return };
    let Some(database) = idem_testkit::conformance::server_url("IDEM_TEST_POSTGRES_URL", "PostgreSQL") else {
        return;
    };
    let pool = idem::sqlx::PgPool::connect(&database).await.unwrap();
    relays_share_an_outbox(&url, pool, "postgres", 3).await;
}

/// The relays' rounds through PgBouncer in transaction mode (`.ci/start-pgbouncer`), on
/// a pool that keeps no statement: every statement of the outbox is unnamed, and each
/// runs in a transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_behind_a_transaction_pooler_share_an_outbox() {
    let Some(url) = amqp_url() else { return };
    let Some(database) = idem_testkit::conformance::server_url("IDEM_TEST_PGBOUNCER_URL", "PgBouncer") else {
        return;
    };
    let options: idem::sqlx::postgres::PgConnectOptions = database.parse().unwrap();
    let options = options.statement_cache_capacity(0).extra_float_digits(None);
    let pool = idem::sqlx::postgres::PgPoolOptions::new()
        .connect_with(options)
        .await
        .unwrap();
    relays_share_an_outbox(&url, pool, "pgbouncer", 3).await;
}

/// Relay rounds, outbox reads and migrations dropped at every point of their round trips
/// (a relay stopped by `run_until` mid-round, a read or a migration that timed out)
/// leave no connection of the pool inside a transaction: on a pool the relay shares with
/// the application, the next borrower of that connection is the application's own code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_rounds_cut_mid_round_trip_leave_the_connection_usable() {
    let Some(url) = amqp_url() else { return };
    let Some(database) = idem_testkit::conformance::server_url("IDEM_TEST_POSTGRES_URL", "PostgreSQL") else {
        return;
    };
    // One connection: every statement after a cut one runs on it.
    let pool = idem::sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&database)
        .await
        .unwrap();
    let outbox = Outbox::<idem::sqlx::Postgres>::named(&format!("outbox_cut_{}", std::process::id())).unwrap();
    outbox.migrate(&pool).await.unwrap();
    let relay = Relay::new(pool.clone(), outbox.clone(), url.as_str());
    let mut session = relay.connect().await.unwrap();
    let mut cut = 0;
    for round in 0..600u64 {
        // Dropped after its first step, or at the timer's next tick (up to 1 ms): before,
        // during or after the BEGIN, a statement or the COMMIT.
        let after = Duration::from_micros(round * 11 % 500);
        if tokio::time::timeout(after, relay.round(&mut session)).await.is_err() {
            cut += 1;
        }
        if tokio::time::timeout(after, outbox.counts(&pool)).await.is_err() {
            cut += 1;
        }
        // A migration under a timeout (run again: its statements change nothing).
        if tokio::time::timeout(after, outbox.migrate(&pool)).await.is_err() {
            cut += 1;
        }
        if tokio::time::timeout(after, outbox.purge_sent(&pool, Duration::from_secs(3600), 10))
            .await
            .is_err()
        {
            cut += 1;
        }
        assert!(
            !idem_testkit::harness::lends_inside_a_transaction(&pool).await,
            "round {round}: the pooled connection was left inside a transaction"
        );
    }
    println!("{cut} of 2,400 calls cut");
    assert!(cut > 100, "the rounds were cut mid-way ({cut} times)");
}

/// Unroutable rows between routable ones, in batches the broker acknowledges several
/// messages at a time: every unroutable row, and no other, is parked (a return is
/// matched to its row by the message id, not by the confirm the client handed it to).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_return_fails_its_own_row() {
    let Some(url) = amqp_url() else { return };
    let Some(database) = idem_testkit::conformance::server_url("IDEM_TEST_POSTGRES_URL", "PostgreSQL") else {
        return;
    };
    let queue = "idem.test.relay.returns";
    let channel = fresh_queue(&url, queue).await;
    let pool = idem::sqlx::PgPool::connect(&database).await.unwrap();
    let outbox = Outbox::<idem::sqlx::Postgres>::named(&format!("outbox_returns_{}", std::process::id())).unwrap();
    outbox.migrate(&pool).await.unwrap();
    let mut transaction = pool.begin().await.unwrap();
    let mut unroutable = Vec::new();
    for n in 0..300 {
        let to = if n % 3 == 0 { "idem.test.nowhere" } else { queue };
        let id = outbox
            .push(
                &mut transaction,
                &OutboxMessage::json("", to, &json!({"n": n})).unwrap(),
            )
            .await
            .unwrap();
        if n % 3 == 0 {
            unroutable.push(id);
        }
    }
    transaction.commit().await.unwrap();
    let relay = Relay::new(pool.clone(), outbox.clone(), url.as_str())
        .batch(100)
        .max_attempts(1)
        .idle(Duration::from_millis(20));
    let stop = spawn_relay(&relay);
    let deadline = Instant::now() + Duration::from_secs(30);
    let counts = loop {
        let counts = outbox.counts(&pool).await.unwrap();
        if counts.pending == 0 {
            break counts;
        }
        assert!(Instant::now() < deadline, "{counts:?} {:?}", relay.stats());
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    drop(stop);
    let mut dead: Vec<i64> = outbox
        .dead(&pool, 1000)
        .await
        .unwrap()
        .iter()
        .map(|row| row.id)
        .collect();
    dead.sort();
    assert_eq!(dead, unroutable, "exactly the unroutable rows are parked ({counts:?})");
    assert_eq!(
        waiting(&channel, queue).await,
        200,
        "every routable row was published once"
    );
}

/// A relay given a hot standby (a Patroni cluster's replica port behind HAProxy)
/// publishes nothing: its round fails with the server's read-only refusal, and every row
/// stays unsent on the primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_on_a_standby_publishes_nothing() {
    let Some(url) = amqp_url() else { return };
    let server = |var| idem_testkit::conformance::server_url(var, "Patroni");
    let (Some(primary), Some(replica)) = (server("IDEM_TEST_PATRONI_URL"), server("IDEM_TEST_PATRONI_REPLICA_URL"))
    else {
        return;
    };
    let queue = "idem.test.relay.standby";
    let channel = fresh_queue(&url, queue).await;
    channel
        .confirm_select(idem::amqp::lapin::options::ConfirmSelectOptions::default())
        .await
        .unwrap();
    let primary = idem::sqlx::PgPool::connect(&primary).await.unwrap();
    let table = format!("outbox_standby_{}", std::process::id());
    let outbox = filled_outbox(&primary, &table, queue, 20).await;
    // One connection: HAProxy spreads the replica port's connections over both standbys.
    let standby = idem::sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&replica)
        .await
        .unwrap();
    // The standby has replayed the rows (a claim of a table it does not have yet would
    // fail for that reason instead).
    let replayed = format!("SELECT COUNT(*) FROM {table}");
    let since = Instant::now();
    while idem::sqlx::query_scalar::<_, i64>(&replayed)
        .fetch_one(&standby)
        .await
        .ok()
        != Some(21)
    {
        assert!(
            since.elapsed() < Duration::from_secs(30),
            "the standby never replayed the rows"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let relay = Relay::new(standby, outbox.clone(), url.as_str());
    let mut session = relay.connect().await.unwrap();
    for _ in 0..3 {
        let error = relay.round(&mut session).await.unwrap_err().to_string();
        assert!(error.contains("read-only transaction"), "{error}");
    }
    let counts = outbox.counts(&primary).await.unwrap();
    assert_eq!((counts.pending, counts.sent), (21, 0), "every row stays unsent");
    assert_eq!(waiting(&channel, queue).await, 0, "nothing was published");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_on_mariadb_share_an_outbox() {
    let Some(url) = amqp_url() else { return };
    let Some(database) = idem_testkit::conformance::server_url("IDEM_TEST_MYSQL_URL", "MariaDB") else {
        return;
    };
    let pool = idem::sqlx::MySqlPool::connect(&database).await.unwrap();
    relays_share_an_outbox(&url, pool, "mariadb", 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_on_sqlite_publishes_its_outbox() {
    let Some(url) = amqp_url() else { return };
    let file = idem_testkit::scratch::path("outbox.db");
    let pool = idem::sqlx::SqlitePool::connect(&format!("sqlite://{}?mode=rwc", file.display()))
        .await
        .unwrap();
    relays_share_an_outbox(&url, pool, "sqlite", 1).await;
    let _ = std::fs::remove_file(file);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_fails_its_delivery_and_the_queue_goes_on() {
    let Some(url) = amqp_url() else { return };
    let queue = "idem.test.panic";
    let channel = fresh_queue(&url, queue).await;
    publish(&channel, queue, Some("boom"), br#"{"points": 1}"#).await;
    for n in 0..5 {
        publish(&channel, queue, Some(&format!("order-{n}")), br#"{"points": 2}"#).await;
    }
    let panics = Arc::new(AtomicU32::new(0));
    let consumer = Consumer::new(&url, queue)
        .prefetch(1)
        .redeliver_after(Duration::from_millis(50))
        .max_attempts(3);
    let seen = panics.clone();
    let _stop = spawn(consumer.clone(), move |message: Message<Value>| {
        let seen = seen.clone();
        async move {
            if message.key == "boom" {
                seen.fetch_add(1, Ordering::SeqCst);
                panic!("the handler's own bug");
            }
            Ok::<_, CreditError>(message.body)
        }
    });
    let stats = until(&consumer, |s| s.acked == 5 && s.failed == 1).await;
    assert_eq!(
        panics.load(Ordering::SeqCst),
        3,
        "three attempts, then the policy: {stats:?}"
    );
    assert_eq!(waiting(&channel, queue).await, 0);
    assert_eq!(waiting(&channel, &format!("{queue}.dead")).await, 1, "dead-lettered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_message_meets_the_policy_and_never_starves_the_queue() {
    let Some(url) = amqp_url() else { return };
    metrics();
    let queue = "idem.test.poison";
    let channel = fresh_queue(&url, queue).await;
    publish(&channel, queue, Some("poison"), br#"{"points": 1}"#).await;
    publish(&channel, queue, Some("good"), br#"{"points": 2}"#).await;
    let runs = Arc::new(AtomicU32::new(0));
    let poisoned = Idempotent::new("amqp.poison").store(Arc::new(MemoryStore::new()));
    let failing = counted(poisoned.clone(), runs.clone(), Duration::ZERO, true);
    let good_runs = Arc::new(AtomicU32::new(0));
    let working = counted(poisoned, good_runs.clone(), Duration::ZERO, false);
    // One delivery at a time: a requeued poison message comes back first every time.
    let consumer = Consumer::new(&url, queue)
        .prefetch(1)
        .redeliver_after(Duration::from_millis(50))
        .max_attempts(4);
    let _stop = spawn(consumer.clone(), move |message: Message<Value>| {
        if message.key == "poison" {
            failing(message)
        } else {
            working(message)
        }
    });
    let stats = until(&consumer, |s| s.acked == 1 && s.failed == 1).await;
    assert_eq!(
        runs.load(Ordering::SeqCst),
        4,
        "four runs of the poison, then the policy: {stats:?}"
    );
    assert_eq!(good_runs.load(Ordering::SeqCst), 1, "the good message ran");
    assert_eq!(waiting(&channel, &format!("{queue}.dead")).await, 1);
    let counts = metric_counts();
    let deliveries = |outcome: &str| {
        metric_count(
            &counts,
            "idem_amqp_deliveries_total",
            &[("queue", queue), ("outcome", outcome)],
        )
    };
    assert_eq!(
        (deliveries("acked"), deliveries("requeued"), deliveries("failed")),
        (1, 3, 1),
        "the consumer's metrics: {stats:?}"
    );
    assert_eq!(
        metric_count(&counts, "idem_amqp_redeliveries_total", &[("queue", queue)]),
        3
    );
}

/// A relay that keeps sent rows 300 ms deletes them in batches once they are older, and
/// never an unsent row.
async fn a_relay_deletes_old_sent_rows<DB: idem::amqp::OutboxDatabase>(
    url: &str,
    pool: idem::sqlx::Pool<DB>,
    name: &str,
) {
    let queue = format!("idem.test.purge.{name}");
    let _channel = fresh_queue(url, &queue).await;
    let outbox = filled_outbox(
        &pool,
        &format!("outbox_purge_{name}_{}", std::process::id()),
        &queue,
        10,
    )
    .await;
    let relay = Relay::new(pool.clone(), outbox.clone(), url)
        .batch(4)
        .idle(Duration::from_millis(20))
        .keep_sent(Some(Duration::from_millis(300)));
    let stop = spawn_relay(&relay);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut sent_seen = 0;
    loop {
        // The figure first: the relay counts a batch once its delete has returned, so
        // counts read after a figure of 10 can no longer show a row of that batch.
        let purged = relay.stats().purged;
        let counts = outbox.counts(&pool).await.unwrap();
        sent_seen = sent_seen.max(counts.sent);
        if purged == 10 {
            assert_eq!((counts.pending, counts.sent), (1, 0), "{name}: the unsent row is kept");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{name}: not purged: {counts:?} {:?}",
            relay.stats()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(sent_seen > 0, "{name}: rows were kept a while once sent");
    assert_eq!(
        waiting(&_channel, &queue).await,
        10,
        "{name}: every message was published"
    );
    drop(stop);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_deletes_old_sent_rows_on_every_database() {
    let Some(url) = amqp_url() else { return };
    on_every_database!(&url, a_relay_deletes_old_sent_rows);
}

/// The metrics this process records (a global recorder, installed once).
fn metrics() -> &'static metrics_util::debugging::Snapshotter {
    static SNAPSHOTTER: std::sync::OnceLock<metrics_util::debugging::Snapshotter> = std::sync::OnceLock::new();
    SNAPSHOTTER.get_or_init(|| {
        let recorder = metrics_util::debugging::DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::set_global_recorder(recorder).expect("the only recorder of this test binary");
        snapshotter
    })
}

/// A counter's name, labels and value.
type Counted = (String, Vec<(String, String)>, u64);

/// Every counter this process recorded so far: each name, labels and value. A
/// snapshot takes what was counted since the last one, so the totals are kept here,
/// for the tests that look at once.
fn metric_counts() -> Vec<Counted> {
    type Totals = HashMap<(String, Vec<(String, String)>), u64>;
    static TOTALS: Mutex<Option<Totals>> = Mutex::new(None);
    let mut totals = TOTALS.lock().unwrap();
    let totals = totals.get_or_insert_with(HashMap::new);
    for (key, _, _, value) in metrics().snapshot().into_vec() {
        if let metrics_util::debugging::DebugValue::Counter(n) = value {
            let mut labels: Vec<_> = key
                .key()
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            labels.sort();
            *totals.entry((key.key().name().to_owned(), labels)).or_default() += n;
        }
    }
    totals
        .iter()
        .map(|((name, labels), n)| (name.clone(), labels.clone(), *n))
        .collect()
}

/// Of `counts`, counter `name` whose labels include every one of `labels`.
fn metric_count(counts: &[Counted], name: &str, labels: &[(&str, &str)]) -> u64 {
    counts
        .iter()
        .filter(|(counter, has, _)| {
            counter == name
                && labels
                    .iter()
                    .all(|(k, v)| has.iter().any(|(hk, hv)| hk == k && hv == v))
        })
        .map(|(.., n)| n)
        .sum()
}

/// Rows that keep failing at the head of an outbox — one for an exchange that does not
/// exist, one no queue takes — are tried again later, then parked, while the rows behind
/// them are published (with their headers); the missing exchange never breaks the
/// relay's session. Given back after the exchange is declared, the first is published.
async fn failing_rows_are_parked<DB: idem::amqp::OutboxDatabase>(url: &str, pool: idem::sqlx::Pool<DB>, name: &str) {
    let queue = format!("idem.test.park.{name}");
    let exchange = format!("idem.test.park.{name}.{}", std::process::id());
    let channel = fresh_queue(url, &queue).await;
    metrics();
    let table = format!("outbox_park_{name}_{}", std::process::id());
    let outbox = Outbox::<DB>::named(&table).unwrap();
    outbox.migrate(&pool).await.unwrap();
    let mut connection = pool.acquire().await.unwrap();
    let missing = OutboxMessage::json(exchange.as_str(), &queue, &json!({"to": "a missing exchange"})).unwrap();
    let missing_id = outbox.push(&mut connection, &missing).await.unwrap();
    let nowhere = OutboxMessage::json("", "idem.test.nowhere", &json!({"to": "no queue"})).unwrap();
    let nowhere_id = outbox.push(&mut connection, &nowhere).await.unwrap();
    let good = 20;
    for n in 0..good {
        let message = OutboxMessage::json("", queue.as_str(), &json!({"n": n}))
            .unwrap()
            .with_header("correlation-id", format!("order-{n}"));
        outbox.push(&mut connection, &message).await.unwrap();
    }
    drop(connection);

    let relay = Relay::new(pool.clone(), outbox.clone(), url)
        .batch(5)
        .idle(Duration::from_millis(20))
        .max_attempts(3)
        .retry_after(Duration::from_millis(100));
    let stop = spawn_relay(&relay);
    let deadline = Instant::now() + Duration::from_secs(20);
    let counts = loop {
        let counts = outbox.counts(&pool).await.unwrap();
        // The rows in the table, and the relay's figures (counted just after each write).
        let stats = relay.stats();
        if counts.dead == 2 && counts.sent == good && stats.parked == 2 && stats.marked_sent == good as u64 {
            break counts;
        }
        assert!(Instant::now() < deadline, "{name}: {counts:?} {stats:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!((counts.pending, counts.retrying), (0, 0), "{name}: {counts:?}");
    let stats = relay.stats();
    assert_eq!(
        (stats.parked, stats.retried_later, stats.sessions_lost),
        (2, 4, 0),
        "{name}: each failing row tried 3 times, the session never broken: {stats:?}"
    );
    // The same figures in the metrics.
    let counts = metric_counts();
    let rows = |outcome: &str| {
        metric_count(
            &counts,
            "idem_amqp_relay_rows_total",
            &[("outbox", table.as_str()), ("outcome", outcome)],
        )
    };
    assert_eq!(
        (rows("parked"), rows("retried_later"), rows("sent"), rows("returned")),
        (2, 4, good as u64, 3),
        "{name}: the relay's metrics"
    );
    let dead = outbox.dead(&pool, 10).await.unwrap();
    assert_eq!(
        dead.iter().map(|row| (row.id, row.attempts)).collect::<Vec<_>>(),
        vec![(missing_id, 3), (nowhere_id, 3)],
        "{name}"
    );
    assert!(dead[0].error.contains("does not exist"), "{name}: {}", dead[0].error);
    assert!(dead[1].error.contains("NO_ROUTE"), "{name}: {}", dead[1].error);
    assert_eq!(
        waiting(&channel, &queue).await,
        good as u32,
        "{name}: the rows behind went on"
    );
    let first = channel
        .basic_get(queue.as_str().into(), Default::default())
        .await
        .unwrap()
        .expect("a message");
    let header = first
        .properties
        .headers()
        .as_ref()
        .and_then(|headers| headers.inner().get("correlation-id").cloned());
    assert_eq!(
        header,
        Some(AMQPValue::LongString("order-0".into())),
        "{name}: the row's header is published"
    );

    // The cause fixed (the exchange declared and bound), the parked rows given back:
    // the first goes out; the unroutable one is parked again.
    channel
        .exchange_declare(
            exchange.as_str().into(),
            idem::amqp::lapin::ExchangeKind::Direct,
            Default::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    channel
        .queue_bind(
            queue.as_str().into(),
            exchange.as_str().into(),
            queue.as_str().into(),
            Default::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    assert_eq!(outbox.retry_dead(&pool, None).await.unwrap(), 2);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let counts = outbox.counts(&pool).await.unwrap();
        if counts.sent == good + 1 && counts.dead == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "{name}: {counts:?} {:?}", relay.stats());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(outbox.dead(&pool, 10).await.unwrap()[0].id, nowhere_id);
    assert_eq!(
        waiting(&channel, &queue).await,
        good as u32,
        "{name}: 19 left, and the revived one"
    );
    drop(stop);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_rows_are_parked_and_the_rows_behind_go_on_on_every_database() {
    let Some(url) = amqp_url() else { return };
    on_every_database!(&url, failing_rows_are_parked);
}

/// On MariaDB a relay's claim locks the rows it takes and no gap after them: while its
/// batch waits for the broker, business transactions still add rows to the outbox (at
/// InnoDB's default isolation the claim's next-key lock would hold every insert until
/// the batch committed, and the HTTP side of the pipeline crawled).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_claim_never_holds_back_a_business_insert_on_mariadb() {
    use idem::amqp::OutboxDatabase;
    let Some(database) = idem_testkit::conformance::server_url("IDEM_TEST_MYSQL_URL", "MariaDB") else {
        return;
    };
    let pool = idem::sqlx::MySqlPool::connect(&database).await.unwrap();
    let table = format!("outbox_gap_{}", std::process::id());
    let outbox = Outbox::<idem::sqlx::MySql>::named(&table).unwrap();
    outbox.migrate(&pool).await.unwrap();
    let message = OutboxMessage::json("", "idem.test.gap", &json!({"n": 1})).unwrap();
    outbox
        .push(&mut *pool.acquire().await.unwrap(), &message)
        .await
        .unwrap();
    // A claim as the relay makes it, left open as while the broker confirms.
    let mut claim = idem::sqlx::MySql::begin_claim(&pool).await.unwrap();
    let claimed = idem::sqlx::MySql::claim(&mut claim, &table, 100).await.unwrap();
    assert_eq!(claimed.len(), 1);
    let insert = async {
        let mut business = pool.begin().await.unwrap();
        let id = outbox.push(&mut business, &message).await.unwrap();
        business.commit().await.unwrap();
        id
    };
    let inserted = tokio::time::timeout(Duration::from_secs(5), insert).await;
    assert!(inserted.is_ok(), "a business insert waited for the relay's open claim");
    claim.rollback().await.unwrap();
}

/// A poison message on a quorum queue meets the policy after `max_attempts` deliveries
/// in all, however many consumers ran it: the queue's `x-delivery-count` carries the
/// count past a consumer that stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_message_on_a_quorum_queue_is_bounded_across_consumers() {
    let Some(url) = amqp_url() else { return };
    let queue = "idem.test.poison_quorum";
    let connection = Connection::connect(&url, ConnectionProperties::default())
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    let dead = format!("{queue}.dead");
    for name in [queue, dead.as_str()] {
        channel
            .queue_delete(name.into(), QueueDeleteOptions::default())
            .await
            .unwrap();
    }
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    let mut arguments = FieldTable::default();
    arguments.insert("x-queue-type".into(), AMQPValue::LongString("quorum".into()));
    arguments.insert("x-dead-letter-exchange".into(), AMQPValue::LongString("".into()));
    arguments.insert(
        "x-dead-letter-routing-key".into(),
        AMQPValue::LongString(dead.as_str().into()),
    );
    channel.queue_declare(queue.into(), durable, arguments).await.unwrap();
    channel
        .queue_declare(dead.as_str().into(), durable, FieldTable::default())
        .await
        .unwrap();
    publish(&channel, queue, Some("poison"), br#"{"points": 1}"#).await;

    let op = Idempotent::new("amqp.poison_quorum").store(Arc::new(MemoryStore::new()));
    let runs = Arc::new(AtomicU32::new(0));
    // The first consumer fails the body twice, then holds its third delivery until it
    // is stopped: the broker has delivered the message three times.
    let (held_tx, held) = tokio::sync::oneshot::channel::<()>();
    let held_tx = Arc::new(Mutex::new(Some(held_tx)));
    let first = Consumer::new(&url, queue)
        .prefetch(1)
        .redeliver_after(Duration::from_millis(50))
        .max_attempts(4);
    let stop_first = spawn(first.clone(), {
        let (op, runs) = (op.clone(), runs.clone());
        move |message: Message<Value>| {
            let (op, runs, held_tx) = (op.clone(), runs.clone(), held_tx.clone());
            Box::pin(async move {
                if runs.load(Ordering::SeqCst) == 2 {
                    if let Some(held) = held_tx.lock().unwrap().take() {
                        let _ = held.send(());
                    }
                    std::future::pending::<()>().await;
                }
                op.execute(&message.key, async {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Err::<Value, _>(CreditError::Refused)
                })
                .await
            }) as Answer
        }
    });
    held.await.unwrap();
    drop(stop_first);
    // A second consumer, counting afresh in its own process.
    let second = Consumer::new(&url, queue)
        .prefetch(1)
        .redeliver_after(Duration::from_millis(50))
        .max_attempts(4);
    let _stop = spawn(second.clone(), counted(op, runs.clone(), Duration::ZERO, true));
    let stats = until(&second, |s| s.failed == 1).await;
    assert_eq!(
        runs.load(Ordering::SeqCst),
        3,
        "two failed runs in the first consumer, one in the second on the message's fourth delivery: {stats:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while waiting(&channel, &dead).await != 1 {
        assert!(Instant::now() < deadline, "the poison message was not dead-lettered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A node that takes connections and never answers (a paused broker, a half-dead host),
/// and how many connections it took.
struct SilentNode {
    url: String,
    taken: Arc<AtomicU32>,
}

impl SilentNode {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("amqp://guest:guest@{}/%2f", listener.local_addr().unwrap());
        let taken = Arc::new(AtomicU32::new(0));
        let counted = taken.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                // Read what the client sends, and answer nothing.
                tokio::spawn(async move {
                    let mut buffer = [0u8; 1024];
                    while let Ok(1..) = tokio::io::AsyncReadExt::read(&mut socket, &mut buffer).await {}
                });
            }
        });
        SilentNode { url, taken }
    }
}

/// The first node of the cluster takes connections and never answers. The consumer and
/// the relay each give it up after their connect timeout and go on to the next node:
/// every row is published and consumed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_never_answers_is_passed_over_by_the_consumer_and_the_relay() {
    let Some(url) = amqp_url() else { return };
    let queue = "idem.test.silent-node";
    let channel = fresh_queue(&url, queue).await;
    let silent = SilentNode::start().await;
    let cluster = format!("{},{url}", silent.url);
    let limit = Duration::from_millis(500);
    let file = idem_testkit::scratch::path("silent-node.db");
    let pool = idem::sqlx::SqlitePool::connect(&format!("sqlite://{}?mode=rwc", file.display()))
        .await
        .unwrap();
    const ROWS: u64 = 20;
    let outbox = filled_outbox(&pool, "outbox_silent_node", queue, ROWS).await;
    let broker = AmqpBroker::new(cluster.as_str()).connect_timeout(limit);
    let relay = Relay::new(pool.clone(), outbox, broker).idle(Duration::from_millis(20));
    let _stop_relay = spawn_relay(&relay);
    let consumer = Consumer::new(cluster.as_str(), queue).connect_timeout(limit);
    let _stop_consumer = spawn(consumer.clone(), |_: Message<Value>| async {
        Ok::<_, Error>(Value::Null)
    });
    let stats = until(&consumer, |s| s.acked >= ROWS).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while relay.stats().marked_sent < ROWS {
        assert!(
            Instant::now() < deadline,
            "the relay marked its rows sent: {:?}",
            relay.stats()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        silent.taken.load(Ordering::SeqCst) >= 2,
        "both tried the silent node first: {}",
        silent.taken.load(Ordering::SeqCst)
    );
    assert_eq!(waiting(&channel, queue).await, 0);
    println!("{queue}: {ROWS} rows published and consumed past a silent node: {stats:?}");
    drop(pool);
    let _ = std::fs::remove_file(file);
}

/// A node that never answered is put off: when the consumer's session on the next node
/// is lost (its connection cut), the new session goes to the nodes that answered before
/// it tries the silent one again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_never_answered_is_tried_after_the_others() {
    let Some(url) = amqp_url() else { return };
    let queue = "idem.test.silent-node-put-off";
    let channel = fresh_queue(&url, queue).await;
    const MESSAGES: u64 = 20;
    for i in 0..MESSAGES {
        publish(&channel, queue, Some(&format!("order-{i}")), b"{}").await;
    }
    let silent = SilentNode::start().await;
    let proxy = proxy::Swallowing::start(&url).await;
    let consumer = Consumer::new(format!("{},{}", silent.url, proxy.url()), queue)
        .prefetch(1)
        .connect_timeout(Duration::from_millis(500));
    let _stop = spawn(consumer.clone(), |_: Message<Value>| async {
        tokio::time::sleep(Duration::from_millis(20)).await;
        Ok::<_, Error>(Value::Null)
    });
    until(&consumer, |s| s.acked >= 5).await;
    assert_eq!(
        silent.taken.load(Ordering::SeqCst),
        1,
        "the first session tried the silent node"
    );
    proxy.cut();
    let stats = until(&consumer, |s| s.sessions_lost >= 1 && s.acked >= MESSAGES).await;
    assert_eq!(waiting(&channel, queue).await, 0);
    assert_eq!(
        silent.taken.load(Ordering::SeqCst),
        1,
        "the new session tried the silent node again before the one that answered: {stats:?}"
    );
}

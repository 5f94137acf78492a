//! Orders to effects through a real broker, exactly once end to end:
//!
//! ```text
//! POST /orders ──► order row + outbox row + idempotency record (one commit)
//!                       │
//!                  relay (the broker's confirms, row id = message id)
//!                       ▼
//!          RabbitMQ or JetStream ──► consumer (#[idempotent(key, tx = tx)])
//!                                       └─► points row + SMS row + record (one commit)
//! ```
//!
//! ```text
//! cargo run --example pipeline -- --database-url postgres://… --broker amqp://guest:guest@127.0.0.1:5672/%2f
//! cargo run --example pipeline -- --database-url postgres://… --broker nats://127.0.0.1:4222
//! ```
//!
//! `--broker` takes a RabbitMQ URL (`amqp://…`) or a NATS one (`nats://…`), or a
//! cluster's nodes' URLs separated by commas. On RabbitMQ the orders travel on the
//! durable queue `--queue` (a quorum queue with `--quorum`); on NATS on the subject
//! `--queue`, kept by the JetStream stream `--stream` (made if missing, on file, with a
//! replica per server up to three).
//! `--database-url` takes `postgres://…`, `mysql://…` (MariaDB) or `sqlite://…`;
//! `--listen` (default 127.0.0.1:3100) is the HTTP address; `--role` runs one part only
//! (`http`, `relay`, `consumer`; default `all`), so each can run — and be killed — as
//! its own process; `--effect-delay-ms` makes each effect take that long.
//!
//! - `POST /orders` `{"customer": "ada", "cents": 1990}` with `Authorization: Bearer …`
//!   (`SUBJECT.SERIAL`: its subject is the caller) and `Idempotency-Key` → 201
//!   `{"order": "order-…", "message_id": 17, "points": 19}` (the order's reference, a
//!   hash of the caller's key in its scope). The
//!   `Idempotency-Key` layer replays a retry's response; under it the order, its outbox
//!   message and the order's record commit in one transaction, so even a retry that
//!   reaches a restarted server after the first response was lost finds the order.
//! - The relay publishes outbox rows to the queue or subject `pipeline.orders` (`--queue`).
//! - The consumer credits points and writes an SMS row per message, in one transaction
//!   with the message's record: a redelivery (the consumer died before its ack, or the
//!   relay published twice) replays and is acked without a second effect.
//! - `GET /stats` → orders, messages published and pending, deliveries (redelivered,
//!   absorbed as duplicates), effects, and the two checks that must stay 0: orders
//!   without exactly one effect once drained, effects without an order. The process
//!   prints the same line every 2 s while it changes.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use clap::{Parser, ValueEnum};
use idem::amqp::lapin::options::QueueDeclareOptions;
use idem::amqp::lapin::types::{AMQPValue, FieldTable};
use idem::amqp::lapin::Channel;
use idem::amqp::{AmqpBroker, HandlerError, Outbox, OutboxMessage};
use idem::http::IdempotencyLayer;
use idem::nats::async_nats::jetstream;
use idem::nats::JetStreamBroker;
use idem::Idempotent;
use serde::{Deserialize, Serialize};

use idem_examples::bearer;

#[derive(Parser, Debug, Clone)]
#[command(about = "Orders → outbox → relay → RabbitMQ or JetStream → idempotent consumer → effects")]
struct Options {
    /// The database: postgres://…, mysql://… or sqlite://…
    #[arg(long)]
    database_url: String,
    /// The broker: amqp://… (RabbitMQ) or nats://… (NATS JetStream); a cluster's nodes
    /// separated by commas.
    #[arg(long, alias = "amqp-url", default_value = "amqp://guest:guest@127.0.0.1:5672/%2f")]
    broker: String,
    /// The HTTP address (roles `all` and `http`).
    #[arg(long, default_value = "127.0.0.1:3100")]
    listen: SocketAddr,
    /// Which part to run.
    #[arg(long, value_enum, default_value_t = Role::All)]
    role: Role,
    /// The durable queue (RabbitMQ) or the subject (NATS) the orders travel on.
    #[arg(long, default_value = "pipeline.orders")]
    queue: String,
    /// RabbitMQ: declare the queue as a quorum queue (replicated on the cluster's nodes).
    #[arg(long)]
    quorum: bool,
    /// NATS: the JetStream stream that keeps the subject (default: the subject in
    /// capitals, `.` as `_`).
    #[arg(long)]
    stream: Option<String>,
    /// How long each effect takes (the consumer's work), in milliseconds.
    #[arg(long, default_value_t = 0)]
    effect_delay_ms: u64,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    All,
    Http,
    Relay,
    Consumer,
}

impl Role {
    fn runs(self, part: Role) -> bool {
        self == Role::All || self == part
    }
}

/// What `POST /orders` takes.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct NewOrder {
    customer: String,
    cents: i64,
}

/// What it answers (and what the record replays).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Placed {
    order: String,
    message_id: i64,
    points: i64,
}

/// The message on the queue.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct OrderPlaced {
    order: String,
    customer: String,
    points: i64,
}

/// What the consumer's handler answers.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Credited {
    points: i64,
}

/// The figures of `GET /stats`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Stats {
    orders: i64,
    published: i64,
    pending: i64,
    deliveries: i64,
    redelivered: i64,
    duplicates_absorbed: i64,
    points: i64,
    sms: i64,
    orders_without_one_effect: i64,
    effects_without_order: i64,
}

#[derive(Debug, thiserror::Error)]
enum AppError {
    #[error(transparent)]
    Idem(#[from] idem::Error),
    #[error(transparent)]
    Db(#[from] idem::sqlx::Error),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    #[error("{0}")]
    Refused(&'static str),
}

impl HandlerError for AppError {
    fn idem_error(&self) -> Option<&idem::Error> {
        match self {
            AppError::Idem(error) => Some(error),
            _ => None,
        }
    }
}

impl IntoResponse for AppError {
    fn into_response(self) -> axum::response::Response {
        let status = match &self {
            AppError::Refused(_) => StatusCode::BAD_REQUEST,
            AppError::Idem(idem::Error::InProgress { .. }) => StatusCode::CONFLICT,
            _ => StatusCode::SERVICE_UNAVAILABLE,
        };
        (status, self.to_string()).into_response()
    }
}

/// Declare the durable queue on a new channel (relay and consumer alike), as a quorum
/// queue when `quorum`.
async fn declare(channel: Channel, queue: String, quorum: bool) -> Result<(), idem::amqp::lapin::Error> {
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    let mut arguments = FieldTable::default();
    if quorum {
        arguments.insert("x-queue-type".into(), AMQPValue::LongString("quorum".into()));
    }
    channel.queue_declare(queue.into(), durable, arguments).await?;
    Ok(())
}

/// The JetStream stream that keeps `subject` on the servers at `servers`, made if
/// missing: on file, with a replica per server (up to three).
async fn ensure_stream(servers: &str, name: &str, subject: &str) -> Result<(), Box<dyn std::error::Error>> {
    let addresses: Vec<idem::nats::async_nats::ServerAddr> = servers
        .split(',')
        .map(|server| server.trim().parse())
        .collect::<Result<_, _>>()?;
    let replicas = addresses.len().min(3);
    let js = jetstream::new(idem::nats::async_nats::connect(addresses).await?);
    js.get_or_create_stream(jetstream::stream::Config {
        name: name.to_owned(),
        subjects: vec![subject.to_owned()],
        storage: jetstream::stream::StorageType::File,
        num_replicas: replicas,
        ..Default::default()
    })
    .await?;
    Ok(())
}

/// The stream's name for `subject`: `pipeline.orders` → `PIPELINE_ORDERS`.
fn stream_of(subject: &str) -> String {
    subject
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect()
}

/// Which broker `url` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BrokerKind {
    RabbitMq,
    JetStream,
}

impl BrokerKind {
    fn of(url: &str) -> Option<BrokerKind> {
        let scheme = url.trim().split("://").next()?;
        match scheme {
            "amqp" | "amqps" => Some(BrokerKind::RabbitMq),
            "nats" | "tls" => Some(BrokerKind::JetStream),
            _ => None,
        }
    }
}

/// The application's tables and the indexes its figures join on, in SQL every one of the
/// three databases reads.
const TABLES: [&str; 6] = [
    "CREATE TABLE IF NOT EXISTS pipeline_orders (order_ref VARCHAR(200) NOT NULL PRIMARY KEY, \
     customer VARCHAR(64) NOT NULL, cents BIGINT NOT NULL, message_id BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS pipeline_points (order_ref VARCHAR(200) NOT NULL, customer VARCHAR(64) NOT NULL, \
     points BIGINT NOT NULL, message_id VARCHAR(64) NOT NULL)",
    "CREATE TABLE IF NOT EXISTS pipeline_sms (order_ref VARCHAR(200) NOT NULL, customer VARCHAR(64) NOT NULL, \
     text VARCHAR(255) NOT NULL)",
    "CREATE TABLE IF NOT EXISTS pipeline_deliveries (message_id VARCHAR(64) NOT NULL, redelivered INT NOT NULL, \
     ran INT NOT NULL)",
    "CREATE INDEX IF NOT EXISTS pipeline_points_order ON pipeline_points (order_ref)",
    "CREATE INDEX IF NOT EXISTS pipeline_sms_order ON pipeline_sms (order_ref)",
];

/// The counting statements behind `Stats`, in its field order after the outbox's two.
const COUNTS: [&str; 8] = [
    "SELECT COUNT(*) FROM pipeline_orders",
    "SELECT COUNT(*) FROM pipeline_deliveries",
    "SELECT COUNT(*) FROM pipeline_deliveries WHERE redelivered = 1",
    "SELECT COUNT(*) FROM pipeline_deliveries WHERE ran = 0",
    "SELECT COUNT(*) FROM pipeline_points",
    "SELECT COUNT(*) FROM pipeline_sms",
    "SELECT COUNT(*) FROM (SELECT o.order_ref, COUNT(p.order_ref) AS n, \
     (SELECT COUNT(*) FROM pipeline_sms s WHERE s.order_ref = o.order_ref) AS m FROM pipeline_orders o \
     LEFT JOIN pipeline_points p ON p.order_ref = o.order_ref GROUP BY o.order_ref) x WHERE n <> 1 OR m <> 1",
    "SELECT (SELECT COUNT(*) FROM pipeline_points p WHERE NOT EXISTS \
     (SELECT 1 FROM pipeline_orders o WHERE o.order_ref = p.order_ref)) + (SELECT COUNT(*) FROM pipeline_sms s \
     WHERE NOT EXISTS (SELECT 1 FROM pipeline_orders o WHERE o.order_ref = s.order_ref))",
];

/// How long the HTTP layer's claim of an order is held without a renewal. An order
/// commits in milliseconds: a lease of seconds lets a client's retry take over the order
/// of a server that died holding it after the lease and the clock tolerance (10 s),
/// where the default lease would answer 409 for a minute.
const ORDER_LEASE: Duration = Duration::from_secs(5);

/// `?` placeholders as PostgreSQL writes them (`$1`, `$2`, …).
fn numbered(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len() + 8);
    let mut n = 0;
    for c in sql.chars() {
        if c == '?' {
            n += 1;
            out.push_str(&format!("${n}"));
        } else {
            out.push(c);
        }
    }
    out
}

/// The application on one database: `$db` its sqlx type, `$sql` how a statement with
/// `?` placeholders is written for it, `$lock` what serializes creating the tables.
macro_rules! pipeline {
    ($module:ident, $db:ty, $sql:expr, $lock:expr) => {
        mod $module {
            use super::*;
            use idem::idempotent;
            use idem::sqlx::{self, Pool, Transaction};

            type Db = $db;

            fn sql(statement: &str) -> String {
                $sql(statement)
            }

            /// The order, its outbox message and its record: one commit.
            #[idempotent(key = order_ref, biz = "pipeline.order", tx = tx)]
            async fn place(
                tx: &mut Transaction<'_, Db>,
                order_ref: &str,
                order: &NewOrder,
                outbox: &Outbox<Db>,
                queue: &str,
            ) -> Result<Placed, AppError> {
                let points = order.cents / 100;
                let message = OrderPlaced {
                    order: order_ref.to_owned(),
                    customer: order.customer.clone(),
                    points,
                };
                let message_id = outbox.push(tx, &OutboxMessage::json("", queue, &message)?).await?;
                sqlx::query(&sql("INSERT INTO pipeline_orders (order_ref, customer, cents, message_id) VALUES (?, ?, ?, ?)"))
                    .bind(order_ref)
                    .bind(&order.customer)
                    .bind(order.cents)
                    .bind(message_id)
                    .execute(&mut **tx)
                    .await?;
                Ok(Placed {
                    order: order_ref.to_owned(),
                    message_id,
                    points,
                })
            }

            /// The effects of one message (its key, its order) and its record: one
            /// commit.
            #[idempotent(key = key, biz = "pipeline.effects", tx = tx)]
            async fn credit(
                tx: &mut Transaction<'_, Db>,
                key: &str,
                order: &OrderPlaced,
                delay: Duration,
                ran: &AtomicBool,
            ) -> Result<Credited, AppError> {
                ran.store(true, Ordering::SeqCst);
                sqlx::query(&sql("INSERT INTO pipeline_points (order_ref, customer, points, message_id) VALUES (?, ?, ?, ?)"))
                    .bind(&order.order)
                    .bind(&order.customer)
                    .bind(order.points)
                    .bind(key)
                    .execute(&mut **tx)
                    .await?;
                tokio::time::sleep(delay).await;
                sqlx::query(&sql("INSERT INTO pipeline_sms (order_ref, customer, text) VALUES (?, ?, ?)"))
                    .bind(&order.order)
                    .bind(&order.customer)
                    .bind(format!("{} points for order {}", order.points, order.order))
                    .execute(&mut **tx)
                    .await?;
                Ok(Credited { points: order.points })
            }

            /// One delivery (its key, its order, whether the broker delivered it before):
            /// the effects in a transaction, then a line in the deliveries table (for the
            /// figures).
            async fn consume(pool: &Pool<Db>, key: String, order: OrderPlaced, redelivered: bool, delay: Duration) -> Result<Credited, AppError> {
                let ran = AtomicBool::new(false);
                let mut tx = pool.begin().await?;
                let credited = credit(&mut tx, &key, &order, delay, &ran).await?;
                tx.commit().await?;
                sqlx::query(&sql("INSERT INTO pipeline_deliveries (message_id, redelivered, ran) VALUES (?, ?, ?)"))
                    .bind(&key)
                    .bind(i32::from(redelivered))
                    .bind(i32::from(ran.load(Ordering::SeqCst)))
                    .execute(pool)
                    .await?;
                Ok(credited)
            }

            /// Who is calling, as [`authenticate`] verified it.
            #[derive(Clone)]
            struct Customer(String);

            /// The service's authentication, in front of the layer: a bearer token
            /// `SUBJECT.SERIAL` names its subject (a stand-in for verifying a real token
            /// and reading its subject).
            async fn authenticate(mut request: axum::extract::Request, next: axum::middleware::Next) -> axum::response::Response {
                if let Some(subject) = bearer::subject(request.headers()) {
                    request.extensions_mut().insert(Customer(subject));
                }
                next.run(request).await
            }

            #[derive(Clone)]
            struct App {
                pool: Pool<Db>,
                outbox: Outbox<Db>,
                queue: String,
            }

            async fn order(State(app): State<App>, Json(order): Json<NewOrder>) -> Result<impl IntoResponse, AppError> {
                if order.cents <= 0 || order.customer.is_empty() || order.customer.len() > 64 {
                    return Err(AppError::Refused("an order needs a customer (1 to 64 bytes) and cents > 0"));
                }
                // The layer has checked the key and named the caller; the order is this
                // call of the layer's (the caller's key in its scope), by a hash: no
                // credential nor client key is kept in clear, and any key fits.
                let scoped = idem::context().map(|call| call.key().to_owned()).unwrap_or_default();
                let order_ref = format!("order-{}", &idem::digest::sha256_hex(scoped)[..40]);
                let mut tx = app.pool.begin().await?;
                let placed = place(&mut tx, &order_ref, &order, &app.outbox, &app.queue).await?;
                tx.commit().await?;
                Ok((StatusCode::CREATED, Json(placed)))
            }

            async fn stats_of(app: &App) -> Result<Stats, AppError> {
                let counts = app.outbox.counts(&app.pool).await?;
                let mut figures = [0i64; 8];
                for (figure, statement) in figures.iter_mut().zip(COUNTS) {
                    *figure = sqlx::query_scalar(statement).fetch_one(&app.pool).await?;
                }
                let [orders, deliveries, redelivered, duplicates_absorbed, points, sms, orders_without_one_effect, effects_without_order] =
                    figures;
                Ok(Stats {
                    orders,
                    published: counts.sent,
                    pending: counts.pending,
                    deliveries,
                    redelivered,
                    duplicates_absorbed,
                    points,
                    sms,
                    orders_without_one_effect,
                    effects_without_order,
                })
            }

            async fn stats(State(app): State<App>) -> Result<Json<Stats>, AppError> {
                Ok(Json(stats_of(&app).await?))
            }

            pub(super) async fn run(options: Options) -> Result<(), Box<dyn std::error::Error>> {
                let pool = sqlx::pool::PoolOptions::<Db>::new()
                    .max_connections(24)
                    .connect(&options.database_url)
                    .await?;
                let records = idem::sql::open(&options.database_url).await?;
                // Parts starting at once must not race to create the tables: on
                // PostgreSQL, one at a time under an advisory lock.
                let mut tx = pool.begin().await?;
                if let Some(lock) = $lock {
                    sqlx::query(lock).execute(&mut *tx).await?;
                }
                for table in TABLES {
                    sqlx::query(table).execute(&mut *tx).await?;
                }
                tx.commit().await?;
                let outbox = Outbox::<Db>::new();
                outbox.migrate(&pool).await?;
                let app = App { pool: pool.clone(), outbox: outbox.clone(), queue: options.queue.clone() };
                let (queue, quorum) = (options.queue.clone(), options.quorum);
                let declare = move |channel| declare(channel, queue.clone(), quorum);
                let kind = BrokerKind::of(&options.broker).ok_or("--broker must start with amqp://, amqps://, nats:// or tls://")?;
                let stream = options.stream.clone().unwrap_or_else(|| stream_of(&options.queue));
                if kind == BrokerKind::JetStream && (options.role.runs(Role::Relay) || options.role.runs(Role::Consumer)) {
                    ensure_stream(&options.broker, &stream, &options.queue).await?;
                }
                let mut parts = tokio::task::JoinSet::new();
                if options.role.runs(Role::Relay) {
                    let (pool, outbox) = (pool.clone(), outbox.clone());
                    match kind {
                        BrokerKind::RabbitMq => {
                            let broker = AmqpBroker::new(options.broker.clone()).on_connect(declare.clone());
                            let relay = idem::amqp::Relay::new(pool, outbox, broker);
                            parts.spawn(async move { relay.run().await });
                        }
                        BrokerKind::JetStream => {
                            let relay = idem::nats::Relay::new(pool, outbox, JetStreamBroker::new(options.broker.clone()));
                            parts.spawn(async move { relay.run().await });
                        }
                    }
                }
                if options.role.runs(Role::Consumer) {
                    let delay = Duration::from_millis(options.effect_delay_ms);
                    let pool = pool.clone();
                    match kind {
                        BrokerKind::RabbitMq => {
                            let consumer = idem::amqp::Consumer::new(options.broker.clone(), options.queue.clone()).on_connect(declare.clone());
                            parts.spawn(async move {
                                consumer
                                    .run(|m: idem::amqp::Message<OrderPlaced>| consume(&pool, m.key, m.body, m.redelivered, delay))
                                    .await
                            });
                        }
                        BrokerKind::JetStream => {
                            let consumer = idem::nats::Consumer::new(options.broker.clone(), stream.clone(), "pipeline")
                                .ack_wait(Duration::from_secs(5));
                            parts.spawn(async move {
                                consumer
                                    .run(|m: idem::nats::Message<OrderPlaced>| consume(&pool, m.key, m.body, m.delivered > 1, delay))
                                    .await
                            });
                        }
                    }
                }
                if options.role.runs(Role::Http) {
                    let layer = IdempotencyLayer::new(Idempotent::new("pipeline.http").store(records).lease(ORDER_LEASE))
                        .principal(|customer: &Customer| customer.0.clone());
                    let router = Router::new()
                        .route("/orders", post(order).route_layer(layer))
                        .route("/stats", get(stats))
                        .layer(axum::middleware::from_fn(authenticate))
                        .with_state(app.clone());
                    let listener = tokio::net::TcpListener::bind(options.listen).await?;
                    println!("pipeline: listening on http://{}", listener.local_addr()?);
                    parts.spawn(async move { axum::serve(listener, router).await.expect("the HTTP server") });
                }
                println!(
                    "pipeline: role {:?}, database {}, broker {}",
                    options.role,
                    idem::store::redacted_url(&options.database_url),
                    idem::store::redacted_url(&options.broker)
                );
                let mut last = None;
                loop {
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    match stats_of(&app).await {
                        Ok(now) if last.as_ref() != Some(&now) => {
                            println!("pipeline: {}", serde_json::to_string(&now)?);
                            last = Some(now);
                        }
                        Ok(_) => {}
                        Err(error) => eprintln!("pipeline: stats: {error}"),
                    }
                }
            }
        }
    };
}

pipeline!(
    postgres,
    idem::sqlx::Postgres,
    numbered,
    Some("SELECT pg_advisory_xact_lock(hashtext('pipeline'))")
);
pipeline!(mysql, idem::sqlx::MySql, str::to_owned, None::<&str>);
pipeline!(sqlite, idem::sqlx::Sqlite, str::to_owned, None::<&str>);

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let options = Options::parse();
    // The relay's and the consumer's warnings (a lost broker, a message failed for good)
    // on stderr.
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer(std::io::stderr)
        .init();
    let url = options.database_url.clone();
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        postgres::run(options).await
    } else if url.starts_with("mysql://") || url.starts_with("mariadb://") {
        mysql::run(options).await
    } else if url.starts_with("sqlite:") {
        sqlite::run(options).await
    } else {
        eprintln!(
            "pipeline: --database-url must start with postgres://, mysql:// or sqlite: (got {})",
            idem::store::redacted_url(&url)
        );
        std::process::exit(2);
    }
}

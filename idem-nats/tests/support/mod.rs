//! What the JetStream tests share: the servers' URLs, fresh streams, and outboxes on
//! SQLite files of their own.
// Each test binary includes this file and uses part of it.
#![allow(dead_code)]

use idem_nats::async_nats::{self, jetstream};
use idem_nats::{Outbox, OutboxMessage};
use sqlx::SqlitePool;

/// The one server's URL, or `None` (NOT RUN) outside CI.
pub fn nats_url() -> Option<String> {
    idem_testkit::conformance::server_url("IDEM_TEST_NATS_URL", "NATS")
}

/// The stream `config` names, made afresh (deleted first if it is there) on the servers
/// at `url`.
pub async fn fresh_stream(url: &str, config: jetstream::stream::Config) -> jetstream::Context {
    let servers: Vec<async_nats::ServerAddr> = url.split(',').map(|u| u.parse().unwrap()).collect();
    let js = jetstream::new(async_nats::connect(servers).await.unwrap());
    let _ = js.delete_stream(&config.name).await;
    js.create_stream(config).await.unwrap();
    js
}

/// A fresh stream `name` with the defaults, taking the subject `subject`.
pub async fn fresh_stream_of(url: &str, name: &str, subject: String) -> jetstream::Context {
    let config = jetstream::stream::Config {
        name: name.to_owned(),
        subjects: vec![subject],
        ..Default::default()
    };
    fresh_stream(url, config).await
}

/// An outbox in a SQLite file of its own (`name` tells the tests' files apart), holding
/// `messages`, pushed in one transaction.
pub async fn outbox_with(
    name: &str,
    messages: impl IntoIterator<Item = OutboxMessage>,
) -> (SqlitePool, Outbox<sqlx::Sqlite>) {
    let path = idem_testkit::scratch::path(&format!("{name}.db"));
    let _ = std::fs::remove_file(&path);
    let pool = SqlitePool::connect(&format!("sqlite://{}?mode=rwc", path.display()))
        .await
        .unwrap();
    let outbox = Outbox::new();
    outbox.migrate(&pool).await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    for message in messages {
        outbox.push(&mut tx, &message).await.unwrap();
    }
    tx.commit().await.unwrap();
    (pool, outbox)
}

//! Sessions that come back: a consumer or a relay works on one broker connection (a
//! session) until the broker goes away, then starts another after a growing pause.

use std::fmt::Display;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};

use tracing::{info, warn};

use crate::Backoff;

/// Who runs sessions, as logs name it: the consumer of a queue or stream, or the relay
/// of an outbox table.
#[derive(Debug, Clone, Copy)]
pub struct Role<'a> {
    /// `consumer` or `relay`.
    pub kind: &'static str,
    /// The queue or stream, or the outbox table.
    pub name: &'a str,
    /// The broker's address as logs may show it (its credentials hidden).
    pub broker: &'a str,
}

/// Sessions one after another, for ever: each that ends is counted in `lost`, told to
/// `on_lost` (the broker's metrics) and logged, and the next starts after a pause — the
/// shortest again when the session made progress (`progress` grew meanwhile).
pub async fn sessions<F, Fut, E>(
    role: Role<'_>,
    progress: &AtomicU64,
    lost: &AtomicU64,
    on_lost: impl Fn(),
    mut session: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: Display,
{
    let who = format!("{} of {}", role.kind, role.name);
    let mut backoff = Backoff::new();
    loop {
        let before = progress.load(Ordering::Relaxed);
        match session().await {
            Ok(()) => info!(%who, "the broker ended the session; reconnecting"),
            Err(error) => warn!(%who, broker = %role.broker, %error, "session failed; reconnecting"),
        }
        lost.fetch_add(1, Ordering::Relaxed);
        on_lost();
        if progress.load(Ordering::Relaxed) > before {
            backoff.reset();
        }
        backoff.pause().await;
    }
}

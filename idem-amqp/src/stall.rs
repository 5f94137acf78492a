//! A session the broker has stopped delivering to.
//!
//! A connection can stay open while no delivery reaches its consumer: a quorum queue
//! whose leader moved can count deliveries as made to a consumer that never receives
//! them (its prefetch then looks full to the broker, which sends nothing more), and a
//! connection can go silent in one direction only (a middlebox dropping a flow's
//! packets). Neither ends the session by itself, and the queue waits for ever.
//!
//! So a session that has heard no delivery for a while, and has room for more, asks the
//! broker (a passive declare of its queue) whether messages are ready. If they are, or
//! the broker does not answer in time, the session is taken for stalled: it stops
//! taking deliveries, lets those in hand finish, and ends. Its connection's close hands
//! its unacked deliveries back to the queue, and the next session consumes afresh.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use lapin::Channel;
use tokio::time::Instant;

use crate::answer::{within, Unanswered};

/// What a session has heard and holds: when its last delivery came, and how many of
/// its deliveries are in hand.
pub(crate) struct Activity {
    started: Instant,
    /// Milliseconds from `started` to the last delivery (or the last answer that the
    /// queue had nothing ready).
    heard: AtomicU64,
    in_hand: AtomicUsize,
}

impl Activity {
    pub(crate) fn new() -> Self {
        Activity {
            started: Instant::now(),
            heard: AtomicU64::new(0),
            in_hand: AtomicUsize::new(0),
        }
    }

    /// A delivery came (or the queue was found with nothing ready).
    pub(crate) fn heard(&self) {
        let now = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.heard.store(now, Ordering::Relaxed);
    }

    /// A delivery is in hand until the returned guard is dropped.
    pub(crate) fn hold(&self) -> Held<'_> {
        self.in_hand.fetch_add(1, Ordering::Relaxed);
        Held(self)
    }

    fn silent_for(&self) -> Duration {
        self.started
            .elapsed()
            .saturating_sub(Duration::from_millis(self.heard.load(Ordering::Relaxed)))
    }
}

/// One delivery in hand.
pub(crate) struct Held<'a>(&'a Activity);

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.in_hand.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Why a session was taken for stalled.
#[derive(Debug)]
pub(crate) enum Stall {
    /// Messages were ready in the queue, and none was delivered to a consumer with
    /// room for more.
    Withheld { ready: u32, silent: Duration },
    /// The broker did not answer the question in time.
    Unanswered { silent: Duration, waited: Duration },
    /// The question failed: the channel is gone.
    Failed(lapin::Error),
}

impl std::fmt::Display for Stall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stall::Withheld { ready, silent } => write!(
                f,
                "no delivery for {silent:.1?} with room for more, while {ready} messages are ready in the queue: \
                 the broker is not delivering to this session"
            ),
            Stall::Unanswered { silent, waited } => write!(
                f,
                "no delivery for {silent:.1?}, and the broker did not answer a passive declare of the queue \
                 within {waited:.1?}: the connection is taken for dead"
            ),
            Stall::Failed(error) => write!(f, "a passive declare of the queue failed: {error}"),
        }
    }
}

/// Watch a session consuming `queue` on `channel` with room for `room` deliveries at
/// once; resolves when it has stalled. After `quiet` with no delivery and fewer than
/// `room` in hand, the queue is asked (answer awaited for `quiet` too).
pub(crate) async fn watch(channel: &Channel, queue: &str, room: usize, quiet: Duration, activity: &Activity) -> Stall {
    let passive = QueueDeclareOptions {
        passive: true,
        ..QueueDeclareOptions::default()
    };
    loop {
        let silent = activity.silent_for();
        if silent < quiet {
            tokio::time::sleep(quiet - silent).await;
            continue;
        }
        // A full prefetch: the broker is right to send nothing more.
        if activity.in_hand.load(Ordering::Relaxed) >= room {
            tokio::time::sleep(quiet).await;
            continue;
        }
        let asked = channel.queue_declare(queue.into(), passive, FieldTable::default());
        match within(quiet, asked).await {
            Err(Unanswered::Silent(waited)) => return Stall::Unanswered { silent, waited },
            Err(Unanswered::Failed(error)) => return Stall::Failed(error),
            Ok(state) if state.message_count() > 0 => {
                return Stall::Withheld {
                    ready: state.message_count(),
                    silent,
                }
            }
            // Nothing ready: silence is what an idle queue sounds like.
            Ok(_) => activity.heard(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A question the broker refuses (its queue is gone: 404, and the channel closed
    /// with it) ends the watch at once, the session taken for stalled, instead of
    /// asking again on a dead channel for ever.
    #[tokio::test]
    async fn a_refused_question_ends_the_watch() {
        let Some(url) = idem_testkit::conformance::server_url("IDEM_TEST_AMQP_URL", "RabbitMQ") else {
            return;
        };
        let connection = lapin::Connection::connect(&url, lapin::ConnectionProperties::default())
            .await
            .expect("the broker is reachable");
        let channel = connection.create_channel().await.expect("a channel is opened");
        let quiet = Duration::from_millis(100);
        let stall = tokio::time::timeout(
            Duration::from_secs(10),
            watch(&channel, "idem.test.stall.no-such-queue", 1, quiet, &Activity::new()),
        )
        .await
        .expect("a refused question left the watch asking past 10 s");
        assert!(matches!(stall, Stall::Failed(_)), "{stall}");
        assert!(stall.to_string().contains("NOT_FOUND"), "{stall}");
    }
}

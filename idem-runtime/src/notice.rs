//! Completion notices: how a store that can tell when a record finishes (PostgreSQL's
//! `LISTEN/NOTIFY`, Redis pub/sub) wakes the waiters of this process, so that they read
//! once when the record is done instead of polling for it.
//!
//! A store keeps one [`Notices`] and hands a [`Notice`] to each key watched through
//! [`IdempotencyStore::watch`](crate::IdempotencyStore::watch). Whatever listens for the
//! store's messages calls [`Notices::completed`] for each record finished elsewhere, and
//! [`Notices::lost`] when it may have missed some (its connection dropped, the server
//! restarted): every watched key is then read again, so a lost message costs latency,
//! never an answer.
//!
//! A notice is a hint to read, never an answer: the waiter always reads the record
//! and judges it, and still reads before its deadline when no notice comes.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use idem_runtime::notice::Notices;
//!
//! let notices = Notices::new();
//! let mut notice = notices.watch("pay", "order-7");
//! notices.completed("pay", "order-7");
//! notice.arrived().await; // at once: the record finished meanwhile
//! # }
//! ```

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use tokio::sync::watch;

/// A store's completion notices for the keys this process watches. Cheap to clone: the
/// clones share the keys.
#[derive(Clone, Default)]
pub struct Notices {
    hub: Arc<Hub>,
}

/// One bell per watched `(biz, key)`, held by its notices.
type Bells = HashMap<(String, String), Weak<watch::Sender<()>>>;

#[derive(Default)]
struct Hub {
    keys: Mutex<Bells>,
    /// Rung when notices may have been missed: every watcher reads again.
    lost: watch::Sender<u64>,
}

impl Hub {
    fn keys(&self) -> MutexGuard<'_, Bells> {
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl fmt::Debug for Notices {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Notices").field("watched", &self.watched()).finish()
    }
}

impl Notices {
    /// Notices with no key watched.
    pub fn new() -> Notices {
        Notices::default()
    }

    /// Watch `(biz, key)`: the notice arrives at the next [`completed`](Self::completed)
    /// of that key or [`lost`](Self::lost) after this call.
    pub fn watch(&self, biz: &str, key: &str) -> Notice {
        let name = (biz.to_owned(), key.to_owned());
        let mut keys = self.hub.keys();
        let bell = match keys.get(&name).and_then(Weak::upgrade) {
            Some(bell) => bell,
            None => {
                let bell = Arc::new(watch::channel(()).0);
                keys.insert(name.clone(), Arc::downgrade(&bell));
                bell
            }
        };
        drop(keys);
        Notice {
            rings: bell.subscribe(),
            losses: self.hub.lost.subscribe(),
            hub: Arc::clone(&self.hub),
            name,
            bell,
        }
    }

    /// The record of `(biz, key)` finished (or went): its watchers read it.
    pub fn completed(&self, biz: &str, key: &str) {
        let bell = self
            .hub
            .keys()
            .get(&(biz.to_owned(), key.to_owned()))
            .and_then(Weak::upgrade);
        if let Some(bell) = bell {
            bell.send_replace(());
        }
    }

    /// Notices may have been missed: every watcher reads its record again.
    pub fn lost(&self) {
        self.hub.lost.send_modify(|losses| *losses += 1);
    }

    /// How many keys are watched.
    pub fn watched(&self) -> usize {
        self.hub.keys().values().filter(|bell| bell.strong_count() > 0).count()
    }
}

/// The watch on one key: [`arrived`](Self::arrived) resolves when the store says the
/// record finished, or may have. Dropping it stops the watch.
pub struct Notice {
    hub: Arc<Hub>,
    name: (String, String),
    bell: Arc<watch::Sender<()>>,
    rings: watch::Receiver<()>,
    losses: watch::Receiver<u64>,
}

impl fmt::Debug for Notice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Notice")
            .field("biz", &self.name.0)
            .field("key", &self.name.1)
            .finish()
    }
}

impl Notice {
    /// Wait for the next notice of the key (or of a loss) since the last one this
    /// watch saw; at once if one came meanwhile. Cancel-safe.
    pub async fn arrived(&mut self) {
        tokio::select! {
            // Each sender lives as long as this watch (its bell) or its hub.
            _ = self.rings.changed() => {}
            _ = self.losses.changed() => {}
        }
    }
}

impl Drop for Notice {
    fn drop(&mut self) {
        let mut keys = self.hub.keys();
        // The last watch of the key: its bell goes with it.
        if Arc::strong_count(&self.bell) == 1
            && keys
                .get(&self.name)
                .is_some_and(|bell| std::ptr::eq(bell.as_ptr(), Arc::as_ptr(&self.bell)))
        {
            keys.remove(&self.name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn rings(notice: &mut Notice) -> bool {
        tokio::time::timeout(Duration::from_millis(50), notice.arrived())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn a_completion_rings_only_its_key_and_is_kept_until_seen() {
        let notices = Notices::new();
        let mut seven = notices.watch("pay", "order-7");
        let mut eight = notices.watch("pay", "order-8");
        notices.completed("pay", "order-7");
        assert!(rings(&mut seven).await);
        assert!(!rings(&mut seven).await, "a notice is seen once");
        assert!(!rings(&mut eight).await, "another key's completion rings nothing here");
        notices.completed("refund", "order-8");
        assert!(!rings(&mut eight).await, "the biz is part of the key");
    }

    #[tokio::test]
    async fn a_loss_rings_every_watch() {
        let notices = Notices::new();
        let mut seven = notices.watch("pay", "order-7");
        let mut eight = notices.watch("pay", "order-8");
        notices.lost();
        assert!(rings(&mut seven).await);
        assert!(rings(&mut eight).await);
    }

    #[tokio::test]
    async fn dropped_watches_leave_nothing() {
        let notices = Notices::new();
        let first = notices.watch("pay", "order-7");
        let second = notices.watch("pay", "order-7");
        assert_eq!(notices.watched(), 1);
        drop(first);
        assert_eq!(notices.hub.keys().len(), 1, "one watch of the key is left");
        drop(second);
        assert_eq!(notices.hub.keys().len(), 0);
        notices.completed("pay", "order-7");
    }
}

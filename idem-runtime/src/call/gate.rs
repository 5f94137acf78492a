//! The claim gate: the calls of one key in one process send one claim at a time, and
//! the calls that arrive while it is under way take its outcome instead of a claim of
//! their own.
//!
//! Their own claims, sent at the same time, would have met the same record: the first
//! caller's new claim (a `PROCESSING` record with its fingerprint) or the record that
//! stood in its way. So they are answered as those claims would have been, and a burst
//! of a thousand duplicates costs the store one claim. A caller that may wait, arriving
//! while others of the key wait here, joins them without a claim: their next read
//! answers it as its claim would have. A claim that fails, or whose
//! caller is dropped before it answers, hands nothing on: the callers behind it claim
//! again themselves.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, PoisonError};

use tokio::sync::watch;

use crate::record::Record;
use crate::store::OwnedStore;

use super::flight::{self, FlightKey};

/// What a claim met, as the callers behind it take it.
#[derive(Debug)]
pub(super) enum Met {
    /// The claim took the key: its `PROCESSING` record carries this fingerprint.
    Claimed { fingerprint: Option<String> },
    /// The record that stood in its way.
    Existing(Box<Record>),
}

/// An outcome handed on: what the claim met, or `None` when there is nothing to hand
/// on (the claim failed, or its caller went away).
type Handed = Option<Arc<Met>>;

/// The claims under way in this process, by key, with the callers behind each.
static UNDER_WAY: LazyLock<Mutex<HashMap<FlightKey, watch::Sender<Option<Handed>>>>> = LazyLock::new(Default::default);

fn under_way() -> MutexGuard<'static, HashMap<FlightKey, watch::Sender<Option<Handed>>>> {
    UNDER_WAY.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A caller's turn at the gate.
pub(super) enum Turn {
    /// No claim of the key is under way here: claim, and hand the outcome on.
    Claim(Ticket),
    /// The claim under way met this.
    Took(Arc<Met>),
    /// Callers of the key wait here already, on a record that was running: a waiting
    /// caller joins them, and their next read answers it as a claim would.
    Join,
}

/// Wait for a turn: the claim of `(biz, key)` on `store`, or the outcome of the one
/// under way, or (for a caller that `waits`) the waiters already reading.
pub(super) async fn turn(store: &dyn OwnedStore, biz: &str, key: &str, waits: bool) -> Turn {
    loop {
        let flight_key = FlightKey::new(store, biz, key);
        if waits && flight::is_open(&flight_key) {
            return Turn::Join;
        }
        let mut behind = {
            let mut under_way = under_way();
            match under_way.get(&flight_key) {
                Some(claim) => claim.subscribe(),
                None => {
                    under_way.insert(flight_key.clone(), watch::channel(None).0);
                    return Turn::Claim(Ticket { key: Some(flight_key) });
                }
            }
        };
        // The ticket's holder always hands something on, even when dropped.
        let handed = match behind.wait_for(Option::is_some).await {
            Ok(handed) => handed.clone().flatten(),
            Err(_) => None,
        };
        if let Some(met) = handed {
            return Turn::Took(met);
        }
    }
}

/// The right to claim a key: whatever the claim meets is handed to the callers behind.
pub(super) struct Ticket {
    key: Option<FlightKey>,
}

impl Ticket {
    /// Hand on what the claim met.
    pub(super) fn hand_on(mut self, met: Met) {
        self.close(Some(Arc::new(met)));
    }

    /// Close the gate with `handed`: callers behind take it, callers after claim anew.
    fn close(&mut self, handed: Handed) {
        let Some(key) = self.key.take() else { return };
        if let Some(claim) = under_way().remove(&key) {
            claim.send_replace(Some(handed));
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.close(None);
    }
}

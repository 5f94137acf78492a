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
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, PoisonError};

use foldhash::fast::FixedState;
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

/// How many claims are under way here, by a hash of their key: a claim whose slot is
/// empty needs no entry in [`UNDER_WAY`], so a call without duplicates pays two atomic
/// additions and a hash, not an allocation and a lock. A claim that finds its slot
/// taken (by its key, or by another that hashes alike) goes through the map.
static CLAIMING: [AtomicU32; SLOTS] = [const { AtomicU32::new(0) }; SLOTS];
const SLOTS: usize = 4096;

fn slot_of(store: &dyn OwnedStore, biz: &str, key: &str) -> usize {
    let hash = FixedState::with_seed(0).hash_one((store.instance() as usize, biz, key));
    (hash % SLOTS as u64) as usize
}

/// Wait for a turn: the claim of `(biz, key)` on `store`, or the outcome of the one
/// under way, or (for a caller that `waits`) the waiters already reading.
///
/// A caller with no claim of its key under way here gets its turn at once; only one
/// behind a claim waits, in a future of its own (so that every call's future does not
/// carry the waiting's state).
pub(super) async fn turn(store: &dyn OwnedStore, biz: &str, key: &str, waits: bool) -> Turn {
    let slot = slot_of(store, biz, key);
    match look(store, biz, key, waits, slot, false) {
        Ok(turn) => turn,
        Err(behind) => Box::pin(wait_behind(store, biz, key, waits, slot, behind)).await,
    }
}

/// A look at the gate: a turn, or the claim under way to wait behind.
fn look(store: &dyn OwnedStore, biz: &str, key: &str, waits: bool, slot: usize, waited: bool) -> Result<Turn, Behind> {
    if waits && flight::any_open() && flight::is_open(&FlightKey::new(store, biz, key)) {
        return Ok(Turn::Join);
    }
    if CLAIMING[slot].fetch_add(1, Ordering::AcqRel) == 0 {
        return Ok(Turn::Claim(Ticket {
            slot,
            key: None,
            open: true,
            waited,
        }));
    }
    let flight_key = FlightKey::new(store, biz, key);
    let mut under_way = under_way();
    match under_way.get(&flight_key) {
        Some(claim) => {
            CLAIMING[slot].fetch_sub(1, Ordering::AcqRel);
            Err(claim.subscribe())
        }
        None => {
            under_way.insert(flight_key.clone(), watch::channel(None).0);
            Ok(Turn::Claim(Ticket {
                slot,
                key: Some(flight_key),
                open: true,
                waited,
            }))
        }
    }
}

/// The callers behind a claim under way: told what it met.
type Behind = watch::Receiver<Option<Handed>>;

/// Wait `behind` the claim under way for what it met; when it hands nothing on, look
/// at the gate again.
async fn wait_behind(
    store: &dyn OwnedStore,
    biz: &str,
    key: &str,
    waits: bool,
    slot: usize,
    mut behind: Behind,
) -> Turn {
    loop {
        // The ticket's holder always hands something on, even when dropped.
        let handed = match behind.wait_for(Option::is_some).await {
            Ok(handed) => handed.clone().flatten(),
            Err(_) => None,
        };
        if let Some(met) = handed {
            return Turn::Took(met);
        }
        match look(store, biz, key, waits, slot, true) {
            Ok(turn) => return turn,
            Err(next) => behind = next,
        }
    }
}

/// The right to claim a key: whatever the claim meets is handed to the callers behind.
pub(super) struct Ticket {
    slot: usize,
    /// Its entry in [`UNDER_WAY`], when its slot was taken.
    key: Option<FlightKey>,
    open: bool,
    /// Whether its caller waited for another claim of the key before it got it.
    waited: bool,
}

impl Ticket {
    /// Whether the caller waited at the gate (for a claim that handed nothing on)
    /// before it got this ticket.
    pub(super) fn waited(&self) -> bool {
        self.waited
    }

    /// Hand on what the claim met (built only when callers may be behind).
    pub(super) fn hand_on(mut self, met: impl FnOnce() -> Met) {
        let handed = self.key.is_some().then(|| Arc::new(met()));
        self.close(handed);
    }

    /// Close the gate with `handed`: callers behind take it, callers after claim anew.
    fn close(&mut self, handed: Handed) {
        if !std::mem::replace(&mut self.open, false) {
            return;
        }
        if let Some(key) = self.key.take() {
            if let Some(claim) = under_way().remove(&key) {
                claim.send_replace(Some(handed));
            }
        }
        CLAIMING[self.slot].fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.close(None);
    }
}

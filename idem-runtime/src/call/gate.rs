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
//!
//! The first claim of a key here takes a slot of its hash without an entry in the map
//! of claims under way (most keys have no duplicate to hand anything to), and names
//! its key's whole hash there. A duplicate that finds the slot taken by its key's claim
//! and no entry opens one, and waits for that claim's outcome there instead of claiming
//! beside it; when the claim hands nothing on, the duplicate claims then. A claim of
//! another key whose hash takes the same slot holds no one up.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
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

/// How many claims are under way here, by a hash of their key, with [`UNLISTED`] set
/// while one of them took its slot empty: a claim whose slot is empty needs no entry
/// in [`UNDER_WAY`], so a call without duplicates pays a hash and four atomic
/// operations on its slot (take it, name its key in [`HOLDING`], look for duplicates
/// as it hands on, leave it), not an allocation and a lock. A claim that finds its
/// slot taken (by its key, or by another that hashes alike) goes through the map.
static CLAIMING: [AtomicU32; SLOTS] = [const { AtomicU32::new(0) }; SLOTS];
const SLOTS: usize = 4096;
/// The bit of a slot's count set while a claim that took the slot empty (with no
/// entry in [`UNDER_WAY`]) is under way.
const UNLISTED: u32 = 1 << 31;

/// The whole hash of the key whose claim took each slot empty, last: a caller that
/// finds the slot taken waits for that claim only when it is of its own key (a claim
/// of another key that hashes to the slot goes on). Read as the slot is found taken, it
/// may be a moment old: then a caller waits for a claim it need not wait for, or
/// claims beside one of its key, as if the slot had no owner — a turn later or
/// sooner, never a wrong turn.
static HOLDING: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];

/// Moved on each time a claim that took its slot empty ends with others in the slot:
/// the callers waiting for it (see [`wait_for_slot`]) look again.
static UNLISTED_ENDED: LazyLock<watch::Sender<u64>> = LazyLock::new(|| watch::channel(0).0);

/// How many claims a slot's count says are under way.
fn under_way_in(count: u32) -> u32 {
    count & !UNLISTED
}

/// The hash of `key` of `biz` on `store`: its slot, and who holds one.
fn hash_of(store: &dyn OwnedStore, biz: &str, key: &str) -> u64 {
    FixedState::with_seed(0).hash_one((store.instance() as usize, biz, key))
}

/// The slot of a key of hash `hash`.
fn slot_of(hash: u64) -> usize {
    (hash % SLOTS as u64) as usize
}

/// Wait for a turn: the claim of `(biz, key)` on `store`, or the outcome of the one
/// under way, or (for a caller that `waits`) the waiters already reading.
///
/// A caller with no claim of its key under way here gets its turn at once; only one
/// behind a claim waits, in a future of its own (so that every call's future does not
/// carry the waiting's state).
pub(super) async fn turn(store: &dyn OwnedStore, biz: &str, key: &str, waits: bool) -> Turn {
    let hash = hash_of(store, biz, key);
    match look(store, biz, key, waits, hash, false) {
        Ok(turn) => turn,
        Err(Wait::Behind(behind)) => Box::pin(wait_behind(store, biz, key, waits, hash, behind)).await,
        Err(Wait::ForSlot(ticket, behind)) => Box::pin(wait_for_slot(ticket, behind)).await,
    }
}

/// What a caller that may not claim yet waits for.
enum Wait {
    /// The claim of the key under way here.
    Behind(Behind),
    /// The claim of the key that took the slot empty: the caller holds the right to
    /// claim after it, and the entry it opened.
    ForSlot(Ticket, Behind),
}

/// A look at the gate: a turn, or what to wait for.
fn look(store: &dyn OwnedStore, biz: &str, key: &str, waits: bool, hash: u64, waited: bool) -> Result<Turn, Wait> {
    if waits && flight::any_open() && flight::is_open(&FlightKey::new(store, biz, key)) {
        return Ok(Turn::Join);
    }
    let slot = slot_of(hash);
    let ticket = |listed| Ticket {
        slot,
        listed,
        open: true,
        waited,
    };
    let count = &CLAIMING[slot];
    if count
        .compare_exchange(0, UNLISTED | 1, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
    {
        HOLDING[slot].store(hash, Ordering::Release);
        return Ok(Turn::Claim(ticket(None)));
    }
    count.fetch_add(1, Ordering::AcqRel);
    let flight_key = FlightKey::new(store, biz, key);
    let mut under_way = under_way();
    match under_way.get(&flight_key) {
        Some(claim) => {
            count.fetch_sub(1, Ordering::AcqRel);
            Err(Wait::Behind(claim.subscribe()))
        }
        None => {
            let entry = watch::channel(None).0;
            let behind = entry.subscribe();
            under_way.insert(flight_key.clone(), entry);
            let ticket = ticket(Some(Box::new((flight_key, behind.clone()))));
            if count.load(Ordering::Acquire) & UNLISTED != 0 && HOLDING[slot].load(Ordering::Acquire) == hash {
                Err(Wait::ForSlot(ticket, behind))
            } else {
                Ok(Turn::Claim(ticket))
            }
        }
    }
}

/// The callers behind a claim under way: told what it met.
type Behind = watch::Receiver<Option<Handed>>;

/// Wait `behind` the claim under way for what it met; when it hands nothing on, look
/// at the gate again.
async fn wait_behind(store: &dyn OwnedStore, biz: &str, key: &str, waits: bool, hash: u64, mut behind: Behind) -> Turn {
    loop {
        // The ticket's holder always hands something on, even when dropped.
        let handed = match behind.wait_for(Option::is_some).await {
            Ok(handed) => handed.clone().flatten(),
            Err(_) => None,
        };
        if let Some(met) = handed {
            return Turn::Took(met);
        }
        match look(store, biz, key, waits, hash, true) {
            Ok(turn) => return turn,
            Err(Wait::Behind(next)) => behind = next,
            Err(Wait::ForSlot(ticket, behind)) => return wait_for_slot(ticket, behind).await,
        }
    }
}

/// Wait, holding `ticket` and its entry (which `behind` watches), for the claim of its
/// key that took the slot empty: take what it hands on to the entry, or claim once it
/// ended without (it had nothing to hand on, or was of another key after all).
/// Dropped meanwhile, the ticket hands nothing on, and the callers behind it look
/// again.
async fn wait_for_slot(mut ticket: Ticket, mut behind: Behind) -> Turn {
    ticket.waited = true;
    loop {
        let mut ended = UNLISTED_ENDED.subscribe();
        // Read before what it handed on: a claim hands on before it leaves the slot.
        let slot_claim_ended = CLAIMING[ticket.slot].load(Ordering::Acquire) & UNLISTED == 0;
        if let Some(Some(met)) = behind.borrow_and_update().clone() {
            // The claim of the key took the entry out of the map as it handed this on.
            ticket.leave();
            return Turn::Took(met);
        }
        if slot_claim_ended {
            return Turn::Claim(ticket);
        }
        tokio::select! {
            _ = ended.changed() => {}
            _ = behind.changed() => {}
        }
    }
}

/// The right to claim a key: whatever the claim meets is handed to the callers behind.
pub(super) struct Ticket {
    slot: usize,
    /// Its entry in [`UNDER_WAY`] (and a watch of what the entry was handed), when its
    /// slot was taken; `None` when it took the slot empty. (Boxed: a call's future
    /// carries the ticket while it claims, and most tickets have no entry.)
    listed: Option<Box<(FlightKey, Behind)>>,
    open: bool,
    /// Whether its caller waited for another claim before it got it.
    waited: bool,
}

impl Ticket {
    /// Whether the caller waited at the gate (for a claim that handed nothing on)
    /// before it got this ticket.
    pub(super) fn waited(&self) -> bool {
        self.waited
    }

    /// Hand on what the claim of `key` of `biz` on `store` met (built only when
    /// callers may be behind).
    pub(super) fn hand_on(mut self, (store, biz, key): (&dyn OwnedStore, &str, &str), met: impl FnOnce() -> Met) {
        let count = &CLAIMING[self.slot];
        if self.listed.is_none() && under_way_in(count.load(Ordering::Acquire)) > 1 {
            // It took the slot empty: a caller of its key that came meanwhile opened
            // an entry, and waits there for this claim's outcome.
            let met = Arc::new(met());
            let mut under_way = under_way();
            if let Some(claim) = under_way.remove(&FlightKey::new(store, biz, key)) {
                claim.send_replace(Some(Some(met)));
            }
            drop(under_way);
            self.close(None);
            return;
        }
        let handed = self.listed.is_some().then(|| Arc::new(met()));
        self.close(handed);
    }

    /// Leave the slot without a claim: what the ticket's entry waited for was handed
    /// on to it, and the entry is gone.
    fn leave(&mut self) {
        self.open = false;
        CLAIMING[self.slot].fetch_sub(1, Ordering::AcqRel);
    }

    /// Close the gate with `handed`: callers behind take it, callers after claim anew.
    fn close(&mut self, handed: Handed) {
        if !std::mem::replace(&mut self.open, false) {
            return;
        }
        let count = &CLAIMING[self.slot];
        if let Some(listed) = self.listed.take() {
            let (key, own) = *listed;
            let mut under_way = under_way();
            // Its entry was handed an outcome only by the claim that took the slot
            // empty, which took it out of the map: the key's entry now is another's.
            if own.borrow().is_none() {
                if let Some(claim) = under_way.remove(&key) {
                    claim.send_replace(Some(handed));
                }
            }
            drop(under_way);
            count.fetch_sub(1, Ordering::AcqRel);
            return;
        }
        if under_way_in(count.fetch_sub(UNLISTED | 1, Ordering::AcqRel)) > 1 {
            UNLISTED_ENDED.send_modify(|ended| *ended = ended.wrapping_add(1));
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.close(None);
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::time::Duration;

    use super::*;
    use crate::memory::MemoryStore;

    /// Two keys of `biz` whose claims on `store` take one slot. (The tests hold the
    /// store in an `Arc`: the gate knows a store by where it lives, and the handles of
    /// an `Arc` forward to one.)
    fn alike(store: &Arc<MemoryStore>, biz: &str) -> (String, String) {
        let mut seen = std::collections::HashMap::new();
        for n in 0.. {
            let key = format!("key-{n}");
            if let Some(first) = seen.insert(slot_of(hash_of(&**store, biz, &key)), key.clone()) {
                return (first, key);
            }
        }
        unreachable!()
    }

    fn claimed() -> Met {
        Met::Claimed { fingerprint: None }
    }

    /// A turn that must come within a second.
    async fn soon(turn: impl Future<Output = Turn>) -> Turn {
        tokio::time::timeout(Duration::from_secs(1), turn)
            .await
            .expect("the turn came")
    }

    #[tokio::test]
    async fn a_key_that_hashes_alike_claims_beside_the_slots_claim() {
        let store = Arc::new(MemoryStore::new());
        let (first, second) = alike(&store, "gate-alike");
        let Turn::Claim(holder) = turn(&store, "gate-alike", &first, false).await else {
            panic!("the first caller claims")
        };
        assert!(
            matches!(soon(turn(&store, "gate-alike", &second, false)).await, Turn::Claim(_)),
            "the other key claims while the slot's claim is under way"
        );
        drop(holder);
    }

    /// The first caller of key `k` of `biz`, holding its ticket, and a duplicate that
    /// arrives 50 ms later (still waiting then), whose turn `ended` judges.
    async fn a_claim_and_its_duplicate(
        biz: &'static str,
        ended: fn(&Turn) -> bool,
    ) -> (Arc<MemoryStore>, Ticket, tokio::task::JoinHandle<bool>) {
        let store = Arc::new(MemoryStore::new());
        let Turn::Claim(holder) = turn(&store, biz, "k", false).await else {
            panic!("the first caller claims")
        };
        let duplicate = tokio::spawn({
            let store = Arc::clone(&store);
            async move { ended(&soon(turn(&store, biz, "k", false)).await) }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !duplicate.is_finished(),
            "the duplicate did not wait for the claim of its key"
        );
        (store, holder, duplicate)
    }

    #[tokio::test]
    async fn a_duplicate_claims_once_the_slots_claim_of_its_key_handed_nothing_on() {
        let (_, holder, duplicate) =
            a_claim_and_its_duplicate("gate-unhanded", |turn| matches!(turn, Turn::Claim(_))).await;
        // The claim failed, or its caller went: nothing to hand on.
        drop(holder);
        assert!(duplicate.await.unwrap(), "the duplicate claims once the claim ended");
    }

    #[tokio::test]
    async fn a_duplicate_takes_what_the_slots_claim_of_its_key_met() {
        let (store, holder, duplicate) =
            a_claim_and_its_duplicate("gate-same", |turn| matches!(turn, Turn::Took(_))).await;
        holder.hand_on((&*store, "gate-same", "k"), claimed);
        assert!(duplicate.await.unwrap(), "the duplicate took the claim's outcome");
    }

    #[tokio::test]
    async fn a_caller_waiting_for_the_slot_that_goes_leaves_the_key_to_the_next() {
        let store = Arc::new(MemoryStore::new());
        let Turn::Claim(holder) = turn(&store, "gate-handed", "k", false).await else {
            panic!("the first caller claims")
        };
        // A duplicate waits for the slot's claim, which hands its outcome on; the
        // duplicate's caller goes before it took it.
        let hash = hash_of(&store, "gate-handed", "k");
        let Err(Wait::ForSlot(gone, _)) = look(&store, "gate-handed", "k", false, hash, false) else {
            panic!("the duplicate waits for the slot's claim")
        };
        holder.hand_on((&*store, "gate-handed", "k"), claimed);
        // The next caller of the key claims, and opens the key's entry.
        let Ok(Turn::Claim(next)) = look(&store, "gate-handed", "k", false, hash, false) else {
            panic!("the next caller claims")
        };
        drop(gone);
        // The entry is still the next caller's: one more waits behind its claim.
        assert!(
            matches!(
                look(&store, "gate-handed", "k", false, hash, false),
                Err(Wait::Behind(_))
            ),
            "a caller that went took another's entry out of the map"
        );
        drop(next);
    }
}

//! Single flight: the callers of one key that wait in one process share one look at
//! the store.
//!
//! The first waiter of a key on a store opens a flight: one reader task reads the
//! record on a schedule and hands each read to every waiter of the flight, which judges
//! it for itself (its own fingerprint, its own deadline, its own answer type). A
//! thousand duplicates waiting here cost one read per round, not a thousand.
//!
//! The reader's schedule starts at a fraction of how long this biz's waits have lasted
//! (5 ms, then doubling to 100 ms, before any is known) and reads once more
//! [`DEADLINE_MARGIN`] before the earliest waiter's deadline, so no waiter gives up on
//! a record that finished before that read. A call of the key that finishes in this
//! process wakes the reader at once; so does the store's notice where it can give one
//! ([`IdempotencyStore::watch`](crate::IdempotencyStore::watch)): the reader reads once
//! as soon as the store says it will tell (the record may have finished while its watch
//! was set up), and then looks on its own only once a second.
//!
//! A flight lives while a waiter holds a seat on it: the last seat dropped (its caller
//! answered, failed or cancelled) aborts the reader and removes the flight, so nothing
//! is left behind. The reader ends the flight itself when a read settles it (the record
//! finished, went, lapsed, or could not be read); later duplicates open a new one.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::ops::Bound;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio::task::AbortHandle;
// tokio's clock, which a paused test clock moves: a wait's schedule and its deadline
// follow the same clock as the sleeps that keep them.
use tokio::time::Instant;

use crate::clock;
use crate::error::StoreError;
use crate::notice::Notice;
use crate::record::{Record, Status};
use crate::store::{IdempotencyStore, OwnedStore};
use crate::unknown::unsettled;

/// One read of the record: what `get` returned.
pub(super) type Read = Result<Option<Record>, Arc<StoreError>>;

/// Before any wait of a biz has been measured: the first pause and the longest.
const FIRST_PAUSE: Duration = Duration::from_millis(5);
const LONGEST_PAUSE: Duration = Duration::from_millis(100);
/// The bounds of a schedule fitted to measured waits.
const SHORTEST_FIRST_PAUSE: Duration = Duration::from_millis(1);
const SHORTEST_LONGEST_PAUSE: Duration = Duration::from_millis(2);
/// How often a reader the store will tell looks on its own: a lost notice costs at
/// most this, or less where a deadline comes first.
const WATCHED_PAUSE: Duration = Duration::from_secs(1);
/// How far ahead of a waiter's deadline its last read starts, at least: room for the
/// reader's timer to fire late and the read's answer to reach the waiter on a loaded
/// machine (with 5 ms, a waiter on a busy host gave up beside the read that answered
/// it, about once in 30 calls).
const DEADLINE_MARGIN: Duration = Duration::from_millis(20);
/// How many bizes' wait lengths are remembered (a bound, not a working size).
const PACES_KEPT: usize = 1024;

/// Where the waiters of a key meet: the store (by [`IdempotencyStore::instance`] and
/// its kind), the biz and the key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct FlightKey {
    store: usize,
    kind: &'static str,
    biz: String,
    key: String,
}

impl FlightKey {
    pub(super) fn new(store: &dyn IdempotencyStore, biz: &str, key: &str) -> FlightKey {
        FlightKey {
            store: store.instance() as usize,
            kind: store.kind(),
            biz: biz.to_owned(),
            key: key.to_owned(),
        }
    }
}

static FLIGHTS: LazyLock<Mutex<HashMap<FlightKey, Weak<Flight>>>> = LazyLock::new(Default::default);

/// How many flights are open: a completion here looks for one only when some are.
static OPEN: AtomicUsize = AtomicUsize::new(0);

/// How long the waits of each biz lasted, smoothed: what the next schedule starts from.
static PACES: LazyLock<Mutex<HashMap<String, Duration>>> = LazyLock::new(Default::default);

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// How many flights are open in this process: waited keys with a waiter seated.
pub(crate) fn open_flights() -> usize {
    OPEN.load(Ordering::Relaxed)
}

/// Whether any key is waited on here: a cheap look before [`is_open`].
pub(super) fn any_open() -> bool {
    open_flights() > 0
}

/// Whether waiters of `key` are reading here already.
pub(super) fn is_open(key: &FlightKey) -> bool {
    lock(&FLIGHTS).get(key).is_some_and(|open| open.strong_count() > 0)
}

/// This process recorded the outcome of `(biz, key)` on `store`: its waiters here read
/// at once, without waiting for their schedule.
pub(super) fn recorded_here(store: &dyn IdempotencyStore, biz: &str, key: &str) {
    if !any_open() {
        return;
    }
    let flight = lock(&FLIGHTS)
        .get(&FlightKey::new(store, biz, key))
        .and_then(Weak::upgrade);
    if let Some(flight) = flight {
        flight.shared.recorded_here.notify_one();
    }
}

/// A flight: the reads its reader hands out, and the seats of its waiters. Only seats
/// hold it; the registry and the reader hold it weakly.
struct Flight {
    key: FlightKey,
    shared: Arc<Shared>,
    reader: AbortHandle,
}

/// What the reader and the seats share.
struct Shared {
    reads: watch::Sender<Option<Arc<Read>>>,
    /// The seated waiters' deadlines, with how many wait for each.
    deadlines: Mutex<BTreeMap<Instant, usize>>,
    /// A seat came with a deadline earlier than the reader planned for.
    rescheduled: Notify,
    /// This process recorded the call's outcome.
    recorded_here: Notify,
}

impl Drop for Flight {
    fn drop(&mut self) {
        OPEN.fetch_sub(1, Ordering::Relaxed);
        self.reader.abort();
        let mut flights = lock(&FLIGHTS);
        if flights
            .get(&self.key)
            .is_some_and(|open| std::ptr::eq(open.as_ptr(), self))
        {
            flights.remove(&self.key);
        }
    }
}

/// A waiter's place on a flight: the reads it has seen, and its deadline.
pub(super) struct Seat {
    flight: Arc<Flight>,
    reads: watch::Receiver<Option<Arc<Read>>>,
    deadline: Instant,
}

impl Drop for Seat {
    fn drop(&mut self) {
        let mut deadlines = lock(&self.flight.shared.deadlines);
        if let Some(count) = deadlines.get_mut(&self.deadline) {
            *count -= 1;
            if *count == 0 {
                deadlines.remove(&self.deadline);
            }
        }
    }
}

impl Seat {
    /// Take a seat on the flight of `(biz, key)` on `store`, opening it if none is.
    pub(super) fn take(store: &dyn OwnedStore, biz: &str, key: &str, deadline: Instant) -> Seat {
        let flight_key = FlightKey::new(store, biz, key);
        let mut flights = lock(&FLIGHTS);
        let flight = match flights.get(&flight_key).and_then(Weak::upgrade) {
            Some(flight) => flight,
            None => {
                let flight = open(store, flight_key.clone());
                flights.insert(flight_key, Arc::downgrade(&flight));
                flight
            }
        };
        let reads = flight.shared.reads.subscribe();
        drop(flights);
        let earlier = {
            let mut deadlines = lock(&flight.shared.deadlines);
            let earlier = deadlines.first_key_value().is_none_or(|(first, _)| deadline < *first);
            *deadlines.entry(deadline).or_default() += 1;
            earlier
        };
        if earlier {
            flight.shared.rescheduled.notify_one();
        }
        Seat {
            flight,
            reads,
            deadline,
        }
    }

    /// The flight's next read, or `None` if none comes before the deadline.
    pub(super) async fn next(&mut self) -> Option<Arc<Read>> {
        match tokio::time::timeout_at(self.deadline, self.reads.changed()).await {
            Ok(Ok(())) => self.reads.borrow_and_update().clone(),
            // The sender lives as long as the flight, which this seat holds.
            Ok(Err(_)) | Err(_) => None,
        }
    }
}

/// Open a flight: its reader starts at once, on an owned handle of the store.
fn open(store: &dyn OwnedStore, key: FlightKey) -> Arc<Flight> {
    let shared = Arc::new(Shared {
        reads: watch::channel(None).0,
        deadlines: Mutex::new(BTreeMap::new()),
        rescheduled: Notify::new(),
        recorded_here: Notify::new(),
    });
    OPEN.fetch_add(1, Ordering::Relaxed);
    Arc::new_cyclic(|me: &Weak<Flight>| {
        let reader = Reader {
            store: store.to_owned_store(),
            shared: Arc::clone(&shared),
            flight: me.clone(),
            key: key.clone(),
        };
        let reader = tokio::spawn(reader.run()).abort_handle();
        Flight { key, shared, reader }
    })
}

/// The task that reads for a flight.
struct Reader {
    store: Arc<dyn IdempotencyStore>,
    shared: Arc<Shared>,
    flight: Weak<Flight>,
    key: FlightKey,
}

/// A flight's schedule: the first pause and the longest.
struct Pace {
    first: Duration,
    longest: Duration,
}

impl Pace {
    /// The schedule for `biz`: fitted to how long its waits have lasted, when known.
    fn of(biz: &str) -> Pace {
        match lock(&PACES).get(biz) {
            Some(&length) => Pace {
                first: (length / 8).clamp(SHORTEST_FIRST_PAUSE, FIRST_PAUSE),
                longest: (length / 2).clamp(SHORTEST_LONGEST_PAUSE, LONGEST_PAUSE),
            },
            None => Pace {
                first: FIRST_PAUSE,
                longest: LONGEST_PAUSE,
            },
        }
    }

    /// Remember that a wait of `biz` lasted `length`.
    fn measured(biz: &str, length: Duration) {
        let mut paces = lock(&PACES);
        if paces.len() >= PACES_KEPT && !paces.contains_key(biz) {
            paces.clear();
        }
        paces
            .entry(biz.to_owned())
            .and_modify(|smoothed| *smoothed = (*smoothed * 3 + length) / 4)
            .or_insert(length);
    }
}

/// What woke a reader.
enum Woke {
    /// Time to read.
    Read,
    /// The schedule must be worked out again.
    Again,
    /// The store answered whether it will tell of the record's end.
    Watching(Option<Notice>),
}

impl Reader {
    async fn run(self) {
        let opened = Instant::now();
        let pace = Pace::of(&self.key.biz);
        let mut pause = pace.first;
        let mut next_at = opened + pause;
        let mut last_read = Duration::ZERO;
        let mut served_until = opened;
        // Whether the reader has read the record: a watch that answers after a read
        // may answer after the record finished.
        let mut has_read = false;
        // Asked while the schedule runs: the first reads do not wait for the store's
        // answer (a listener may be connecting).
        let mut asking = Some(Box::pin(self.watch()));
        let mut notice = None;
        loop {
            let margin = (last_read * 2).max(DEADLINE_MARGIN);
            let due = self
                .earliest_deadline(served_until + margin)
                .map_or(next_at, |deadline| {
                    next_at.min(deadline.checked_sub(margin).unwrap_or(deadline))
                });
            match self.until(due, &mut asking, notice.as_mut()).await {
                Woke::Read => {}
                Woke::Again => continue,
                Woke::Watching(watching) => {
                    asking = None;
                    // Told from now on, the reader reads at once: a record that
                    // finished while the store was setting up its watch was told to
                    // no one, and the schedule could be a pause away. It reads at once
                    // too when the store will not tell after the reader has read the
                    // record (PostgreSQL's and Redis's watch finds the record no longer
                    // running, or the watch failed): the record may have finished
                    // since that read. A store that never tells answers before any read,
                    // and the schedule stands.
                    if watching.is_some() || has_read {
                        next_at = Instant::now();
                    }
                    notice = watching;
                    continue;
                }
            }
            let started = Instant::now();
            let read = self.store.get(&self.key.biz, &self.key.key).await.map_err(Arc::new);
            last_read = started.elapsed();
            served_until = started;
            has_read = true;
            if settles(&read) {
                if matches!(&read, Ok(Some(record)) if record.status != Status::Processing) {
                    Pace::measured(&self.key.biz, opened.elapsed());
                }
                // The watch ends before any waiter hears the answer: a caller that
                // was answered leaves no watch behind it.
                drop((notice, asking));
                self.settle(read);
                return;
            }
            self.shared.reads.send_replace(Some(Arc::new(read)));
            // Told when the record finishes, the reader looks on its own only now and
            // then, in case the store could not tell.
            pause = match notice {
                Some(_) => WATCHED_PAUSE,
                None => (pause * 2).min(pace.longest),
            };
            next_at = Instant::now() + pause;
        }
    }

    /// Ask the store to say when the record finishes; `None` where it cannot (or the
    /// asking failed: the reader then reads on its schedule).
    async fn watch(&self) -> Option<Notice> {
        match self.store.watch(&self.key.biz, &self.key.key).await {
            Ok(notice) => notice,
            Err(error) => {
                tracing::debug!(target: "idem", %error, biz = self.key.biz, "could not watch a record; reading it on a schedule");
                None
            }
        }
    }

    /// Wait until `due`, a completion here, the store's notice, or its answer to
    /// `asking`.
    async fn until<F>(&self, due: Instant, asking: &mut Option<Pin<Box<F>>>, notice: Option<&mut Notice>) -> Woke
    where
        F: Future<Output = Option<Notice>>,
    {
        let noticed = async {
            match notice {
                Some(notice) => notice.arrived().await,
                None => std::future::pending().await,
            }
        };
        let answered = async {
            match asking.as_mut() {
                Some(asking) => asking.await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = tokio::time::sleep_until(due) => Woke::Read,
            () = self.shared.recorded_here.notified() => Woke::Read,
            () = noticed => Woke::Read,
            watching = answered => Woke::Watching(watching),
            () = self.shared.rescheduled.notified() => Woke::Again,
        }
    }

    /// The earliest deadline of a seated waiter that no read has served yet: one after
    /// `after` (a read that starts a margin before a deadline serves it).
    fn earliest_deadline(&self, after: Instant) -> Option<Instant> {
        lock(&self.shared.deadlines)
            .range((Bound::Excluded(after), Bound::Unbounded))
            .next()
            .map(|(deadline, _)| *deadline)
    }

    /// Hand out the read that settles the flight, and close it to newcomers in the same
    /// step: a waiter either got this read or opens a flight of its own.
    fn settle(&self, read: Read) {
        let mut flights = lock(&FLIGHTS);
        if flights
            .get(&self.key)
            .is_some_and(|open| Weak::ptr_eq(open, &self.flight))
        {
            flights.remove(&self.key);
        }
        self.shared.reads.send_replace(Some(Arc::new(read)));
    }
}

/// Whether a read ends the wait for every waiter: the record finished, went, expired,
/// lapsed or holds an unsettled effect, or could not be read.
fn settles(read: &Read) -> bool {
    let now = clock::now();
    match read {
        Err(_) | Ok(None) => true,
        Ok(Some(record)) => record.status != Status::Processing || !stands(record, now) || unsettled(record).is_some(),
    }
}

/// Whether a record read at `now` still stands in the way of a claim: neither expired
/// nor with its lease lapsed.
pub(super) fn stands(record: &Record, now: std::time::SystemTime) -> bool {
    !record.is_expired(now) && !record.lease_lapsed(now)
}

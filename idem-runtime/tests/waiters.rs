//! Duplicates that wait: the callers of one key in one process share one claim and one
//! read a round, a waiter dropped mid-wait leaves nothing behind, and a waiter reads
//! once more just before its deadline. Where the store tells of completions, a notice
//! wakes the waiters at once, one lost or never sent costs a read, never an answer, and
//! a record that finished while the store set up its watch is read as soon as it has.
//!
//! The store is a `MemoryStore` behind a wrapper that counts what reaches it. The tests
//! run one at a time: the count of waited keys is the process's.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use idem_runtime::notice::{Notice, Notices};
use idem_runtime::{
    observe, Claim, ClaimOutcome, Error, FenceCheck, IdempotencyStore, Idempotent, Lease, MemoryStore, Record,
    StoreError,
};

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A `MemoryStore` that counts its claims and reads, and the most reads at once.
#[derive(Debug, Default)]
struct Counting {
    inner: MemoryStore,
    claims: AtomicUsize,
    reads: AtomicUsize,
    reading: AtomicUsize,
    most_reading: AtomicUsize,
    /// The store's notices, where it gives them; with `rings`, its completions ring
    /// them (a store whose messages get through).
    notices: Option<Notices>,
    rings: bool,
    /// Its watch is set up only once the record watched has finished (a listener that
    /// connects late): the completion's notice went to no one.
    watches_late: bool,
    /// How long a claim takes beyond a millisecond (a claim on a connection of its own
    /// that the pool must first open).
    claims_slowly: Duration,
    /// When each read started, on tokio's clock.
    read_at: std::sync::Mutex<Vec<tokio::time::Instant>>,
}

impl Counting {
    fn on(inner: MemoryStore) -> Arc<Counting> {
        Arc::new(Counting {
            inner,
            ..Counting::default()
        })
    }

    /// A handle that watches through `notices` and, when it `rings`, tells of its
    /// completions there.
    fn told_by(inner: MemoryStore, notices: &Notices, rings: bool) -> Arc<Counting> {
        Arc::new(Counting {
            inner,
            notices: Some(notices.clone()),
            rings,
            ..Counting::default()
        })
    }
}

#[async_trait]
impl IdempotencyStore for Counting {
    async fn claim(&self, claim: &Claim<'_>) -> Result<ClaimOutcome, StoreError> {
        self.claims.fetch_add(1, Ordering::SeqCst);
        // A claim that takes a moment, as a server's does, so claims could overlap.
        tokio::time::sleep(Duration::from_millis(1) + self.claims_slowly).await;
        self.inner.claim(claim).await
    }
    async fn renew(&self, lease: &Lease, now: SystemTime, lease_for: Duration) -> Result<FenceCheck, StoreError> {
        self.inner.renew(lease, now, lease_for).await
    }
    async fn complete(
        &self,
        lease: &Lease,
        response: &str,
        now: SystemTime,
        ttl: Duration,
    ) -> Result<FenceCheck, StoreError> {
        let written = self.inner.complete(lease, response, now, ttl).await;
        if let Some(notices) = self.notices.as_ref().filter(|_| self.rings) {
            notices.completed(&lease.biz, &lease.key);
        }
        written
    }
    async fn fail(
        &self,
        lease: &Lease,
        message: &str,
        now: SystemTime,
        ttl: Duration,
    ) -> Result<FenceCheck, StoreError> {
        self.inner.fail(lease, message, now, ttl).await
    }
    async fn release(&self, lease: &Lease) -> Result<FenceCheck, StoreError> {
        self.inner.release(lease).await
    }
    async fn watch(&self, biz: &str, key: &str) -> Result<Option<Notice>, StoreError> {
        if self.watches_late {
            let finished = || async {
                let record = self.inner.get(biz, key).await.unwrap();
                record.is_some_and(|record| record.status != idem_runtime::Status::Processing)
            };
            while !finished().await {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        Ok(self.notices.as_ref().map(|notices| notices.watch(biz, key)))
    }
    async fn get(&self, biz: &str, key: &str) -> Result<Option<Record>, StoreError> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.read_at.lock().unwrap().push(tokio::time::Instant::now());
        let now = self.reading.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_reading.fetch_max(now, Ordering::SeqCst);
        // A read that takes a moment, as a server's does, so reads could overlap.
        tokio::time::sleep(Duration::from_millis(1)).await;
        let record = self.inner.get(biz, key).await;
        self.reading.fetch_sub(1, Ordering::SeqCst);
        record
    }
    async fn purge_expired(&self, now: SystemTime, limit: u64) -> Result<u64, StoreError> {
        self.inner.purge_expired(now, limit).await
    }
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let given_up = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < given_up, "waited 10 s for {what}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// An operation of `biz` on `store` whose callers wait up to `wait`.
fn waiting(biz: &'static str, store: &Arc<Counting>, wait: Duration) -> Idempotent {
    Idempotent::new(biz).store(store.clone()).wait(wait)
}

/// `op`'s holder of key `k`, returned once its body runs (so its claim stands); the
/// body then goes on with `rest`.
async fn holder<E, F>(op: &Arc<Idempotent>, rest: F) -> tokio::task::JoinHandle<Result<String, E>>
where
    E: From<Error> + Send + 'static,
    F: Future<Output = Result<String, E>> + Send + 'static,
{
    let (running, claimed) = tokio::sync::oneshot::channel();
    let op = op.clone();
    let holder = tokio::spawn(async move {
        op.execute("k", async move {
            running.send(()).unwrap();
            rest.await
        })
        .await
    });
    claimed.await.expect("the holder's body runs");
    holder
}

/// `n` callers of `op`'s key `k`, each body counted in `bodies` and answering with its
/// caller's number after `body`.
fn waiters(
    op: &Arc<Idempotent>,
    n: usize,
    bodies: &Arc<AtomicUsize>,
    body: Duration,
) -> Vec<tokio::task::JoinHandle<Result<String, Error>>> {
    (0..n)
        .map(|i| {
            let (op, bodies) = (op.clone(), bodies.clone());
            tokio::spawn(async move {
                op.execute("k", async move {
                    bodies.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(body).await;
                    Ok::<_, Error>(format!("answer of waiter {i}"))
                })
                .await
            })
        })
        .collect()
}

/// Every waiter's answer, which must be one and the same.
async fn one_answer(waiters: Vec<tokio::task::JoinHandle<Result<String, Error>>>) -> String {
    let mut answers = Vec::new();
    for waiter in waiters {
        answers.push(waiter.await.unwrap().expect("every waiter is answered"));
    }
    assert!(
        answers.iter().all(|answer| *answer == answers[0]),
        "the waiters got different answers"
    );
    answers.swap_remove(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_waiters_share_one_claim_and_one_read_a_round() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let store = Counting::on(MemoryStore::new());
    let op = Arc::new(waiting("shared-waits", &store, Duration::from_secs(20)));
    let bodies = Arc::new(AtomicUsize::new(0));
    one_answer(waiters(&op, 1000, &bodies, Duration::from_millis(200))).await;
    assert_eq!(bodies.load(Ordering::SeqCst), 1, "one body ran");
    let (claims, reads, most) = (
        store.claims.load(Ordering::SeqCst),
        store.reads.load(Ordering::SeqCst),
        store.most_reading.load(Ordering::SeqCst),
    );
    // The holder's claim, and the few that arrive between a claim handing on its
    // outcome and the first waiter's reader opening (one or two on a loaded machine);
    // the others took a claim's outcome or joined the waiters reading. Without either,
    // hundreds claim.
    assert!(claims <= 5, "the thousand callers sent {claims} claims");
    assert_eq!(most, 1, "{most} reads at once: the waiters did not share them");
    // The reads of one schedule over 200 ms: 5, 15, 35, 75, 155 ms, and the one the
    // completion here asks for.
    assert!(reads <= 10, "{reads} reads for a thousand waiters of one 200 ms body");
    assert_eq!(observe::waited_keys(), 0, "the flight closed");
}

/// Duplicates that arrive while the first claim of their key is on its way (a claim the
/// pool must first open a connection for) send none of their own: they take its
/// outcome, and wait with the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_arriving_during_the_first_claim_send_none() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let store = Arc::new(Counting {
        claims_slowly: Duration::from_millis(100),
        ..Counting::default()
    });
    let op = Arc::new(waiting("first-claim-waits", &store, Duration::from_secs(20)));
    let bodies = Arc::new(AtomicUsize::new(0));
    one_answer(waiters(&op, 200, &bodies, Duration::from_millis(50))).await;
    assert_eq!(bodies.load(Ordering::SeqCst), 1, "one body ran");
    let claims = store.claims.load(Ordering::SeqCst);
    assert_eq!(claims, 1, "the 200 callers sent {claims} claims");
    assert_eq!(observe::waited_keys(), 0, "the flight closed");
}

/// Callers that arrive while others of the key wait here join them: no claim of theirs
/// reaches the store, and the waiters' next read answers them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_arriving_while_others_wait_join_them_without_a_claim() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let store = Counting::on(MemoryStore::new());
    let op = Arc::new(waiting("joining-waits", &store, Duration::from_secs(10)));
    let (finish, finished) = tokio::sync::oneshot::channel::<()>();
    let holder = holder(&op, async move {
        let _ = finished.await;
        Ok::<_, Error>("first".to_owned())
    })
    .await;
    let bodies = Arc::new(AtomicUsize::new(0));
    let first = waiters(&op, 3, &bodies, Duration::ZERO);
    until("a reader for the waiters", || observe::waited_keys() == 1).await;
    until("a first read", || store.reads.load(Ordering::SeqCst) > 0).await;
    let claims = store.claims.load(Ordering::SeqCst);
    let later = waiters(&op, 50, &bodies, Duration::ZERO);
    tokio::time::sleep(Duration::from_millis(300)).await;
    finish.send(()).unwrap();
    assert_eq!(holder.await.unwrap().unwrap(), "first");
    assert_eq!(one_answer(first).await, "first");
    assert_eq!(one_answer(later).await, "first");
    assert_eq!(bodies.load(Ordering::SeqCst), 0, "no waiter ran");
    assert_eq!(
        store.claims.load(Ordering::SeqCst),
        claims,
        "callers arriving while others waited sent claims"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_waiter_leaves_nothing_behind() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let store = Counting::on(MemoryStore::new());
    let op = Arc::new(waiting("dropped-waits", &store, Duration::from_secs(30)));
    let (finish, finished) = tokio::sync::oneshot::channel::<()>();
    let holder = holder(&op, async move {
        let _ = finished.await;
        Ok::<_, Error>("first".to_owned())
    })
    .await;
    let waiters = waiters(&op, 3, &Arc::default(), Duration::ZERO);
    until("a reader for the waiters", || observe::waited_keys() == 1).await;
    until("a first read", || store.reads.load(Ordering::SeqCst) > 0).await;
    for waiter in &waiters {
        waiter.abort();
    }
    for waiter in waiters {
        assert!(waiter.await.unwrap_err().is_cancelled());
    }
    until("the flight to close", || observe::waited_keys() == 0).await;
    let reads = store.reads.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        store.reads.load(Ordering::SeqCst),
        reads,
        "the store was still read for waiters that had gone"
    );
    finish.send(()).unwrap();
    assert_eq!(holder.await.unwrap().unwrap(), "first");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_reads_once_more_before_its_deadline() {
    let _serial = ONE_AT_A_TIME.lock().await;
    // Two handles of one store: the holder's completion is not this process's news to
    // the waiter's reader, which must find it by reading.
    let records = MemoryStore::new();
    let (holding, waiting) = (Counting::on(records.clone()), Counting::on(records));
    let (holder, _) = hold(
        "deadline-waits",
        holding,
        tokio::time::sleep(Duration::from_millis(100)),
    )
    .await;
    // The schedule reads at 5, 15, 35 and 75 ms, and next at 155 ms: past the waiter's
    // 150 ms. The read just before its deadline (at 130 ms) meets the record finished at
    // 100 ms.
    let waited = wait_on("deadline-waits", waiting, Duration::from_millis(150)).await;
    assert_eq!(waited.expect("the last read before the deadline answers"), "first");
    assert_eq!(holder.await.unwrap().unwrap(), "first");
}

/// The read before a waiter's deadline starts 20 ms before it, on tokio's paused clock
/// (no timer fires late there): 20 ms for the reader's timer to fire late and the read's
/// answer to reach the waiter on a loaded host. A holder that outlives the wait; the
/// schedule reads at 5, 15, 35 and 75 ms, then at 130 ms, and no more.
#[tokio::test(start_paused = true)]
async fn the_read_before_the_deadline_starts_twenty_milliseconds_before_it() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let records = MemoryStore::new();
    let (holding, waiting) = (Counting::on(records.clone()), Counting::on(records));
    let (holder, _) = hold("margin-waits", holding, tokio::time::sleep(Duration::from_millis(400))).await;
    let started = tokio::time::Instant::now();
    let waited = wait_on("margin-waits", waiting.clone(), Duration::from_millis(150)).await;
    assert!(
        matches!(waited, Err(Error::InProgress { .. })),
        "the holder outlives the wait: {waited:?}"
    );
    let reads: Vec<Duration> = waiting
        .read_at
        .lock()
        .unwrap()
        .iter()
        .map(|at| at.duration_since(started))
        .collect();
    // The claim took 1 ms, each read 1 ms: the schedule's reads start at 6, 17, 38 and
    // 79 ms, the deadline's at 130 ms — once, and none after it.
    let near_the_deadline: Vec<&Duration> = reads.iter().filter(|at| **at > Duration::from_millis(100)).collect();
    assert!(
        matches!(near_the_deadline[..], [at] if *at >= Duration::from_millis(129) && *at <= Duration::from_millis(131)),
        "one read, 20 ms before the 150 ms deadline: reads at {reads:?}"
    );
    assert_eq!(holder.await.unwrap().unwrap(), "first");
}

/// A holder on one handle of the store (its completion is news to the waiter's reader
/// only through the store's notices) whose body lasts until `body` resolves; it is
/// returned once the holder's body runs (so its claim stands), with how it is awaited
/// and when the body ended.
async fn hold(
    biz: &'static str,
    holding: Arc<Counting>,
    body: impl Future<Output = ()> + Send + 'static,
) -> (
    tokio::task::JoinHandle<Result<String, Error>>,
    Arc<std::sync::OnceLock<Instant>>,
) {
    let ended = Arc::new(std::sync::OnceLock::new());
    let op = Arc::new(Idempotent::new(biz).store(holding));
    let holder = holder(&op, {
        let ended = ended.clone();
        async move {
            body.await;
            ended.set(Instant::now()).unwrap();
            Ok::<_, Error>("first".to_owned())
        }
    })
    .await;
    (holder, ended)
}

/// A waiter of `biz`'s key `k` on `waiting`, for at most `wait`.
async fn wait_on(biz: &'static str, on: Arc<Counting>, wait: Duration) -> Result<String, Error> {
    waiting(biz, &on, wait)
        .execute("k", async { Ok::<_, Error>("second".to_owned()) })
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notice_wakes_the_waiters_at_once() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let (records, notices) = (MemoryStore::new(), Notices::new());
    let waiting = Counting::told_by(records.clone(), &notices, false);
    let (holder, ended) = hold(
        "noticed-waits",
        Counting::told_by(records, &notices, true),
        tokio::time::sleep(Duration::from_millis(1500)),
    )
    .await;
    let waited = wait_on("noticed-waits", waiting.clone(), Duration::from_secs(10)).await;
    let answered = Instant::now();
    assert_eq!(waited.expect("the waiter is answered"), "first");
    assert_eq!(holder.await.unwrap().unwrap(), "first");
    let late = answered - *ended.get().unwrap();
    // Without the notice, the next look on its own is a second after the last.
    assert!(
        late < Duration::from_millis(300),
        "answered {late:?} after the body ended"
    );
    // The first look, one a second later, and the one the notice asked for; a reader
    // on a schedule reads about twenty times in 1.5 s.
    let reads = waiting.reads.load(Ordering::SeqCst);
    assert!(reads <= 4, "{reads} reads for a waiter the store tells");
    assert_eq!(notices.watched(), 0, "the watch ended with the flight");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_notice_costs_a_read_not_an_answer() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let (records, notices) = (MemoryStore::new(), Notices::new());
    let waiting = Counting::told_by(records.clone(), &notices, false);
    // The holder's completion rings nothing: its message was lost.
    let (holder, ended) = hold(
        "lost-notices",
        Counting::told_by(records, &notices, false),
        tokio::time::sleep(Duration::from_millis(1200)),
    )
    .await;
    let waiter = tokio::spawn(wait_on("lost-notices", waiting, Duration::from_secs(10)));
    assert_eq!(holder.await.unwrap().unwrap(), "first");
    // What a listener does when its connection dropped: every watched key is read.
    notices.lost();
    let told = Instant::now();
    assert_eq!(waiter.await.unwrap().expect("the waiter is answered"), "first");
    let late = told.elapsed();
    assert!(
        late < Duration::from_millis(300),
        "answered {late:?} after the loss was told"
    );
    assert!(ended.get().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notice_never_sent_still_answers_before_the_deadline() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let (records, notices) = (MemoryStore::new(), Notices::new());
    let waiting = Counting::told_by(records.clone(), &notices, false);
    let (holder, _) = hold(
        "unsent-notices",
        Counting::told_by(records, &notices, false),
        tokio::time::sleep(Duration::from_millis(300)),
    )
    .await;
    // The reader looks on its own a second after its first look: past this waiter's
    // 700 ms. Its read just before the deadline meets the record finished at 300 ms.
    let waited = wait_on("unsent-notices", waiting, Duration::from_millis(700)).await;
    assert_eq!(waited.expect("the last read before the deadline answers"), "first");
    assert_eq!(holder.await.unwrap().unwrap(), "first");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_finished_while_its_watch_was_set_up_is_read_at_once() {
    finished_while_the_watch_was_set_up("late-watches", true).await;
}

/// PostgreSQL's and Redis's watch, set up late, finds the record no longer running and
/// answers that it will not tell: the record finished since the reader's last read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_that_found_the_record_finished_has_it_read_at_once() {
    finished_while_the_watch_was_set_up("late-refused-watches", false).await;
}

/// The reader's store sets up its watch only once the record has finished, and then
/// gives a notice (`told`) or answers that it will not tell: either way the waiter is
/// answered at once, not at the schedule's next read.
async fn finished_while_the_watch_was_set_up(biz: &'static str, told: bool) {
    let _serial = ONE_AT_A_TIME.lock().await;
    let (records, notices) = (MemoryStore::new(), Notices::new());
    let waiting = Arc::new(Counting {
        inner: records.clone(),
        notices: told.then(|| notices.clone()),
        watches_late: true,
        ..Counting::default()
    });
    let (finish, finishing) = tokio::sync::oneshot::channel::<()>();
    let (holder, ended) = hold(biz, Counting::told_by(records, &notices, true), async move {
        finishing.await.unwrap()
    })
    .await;
    let waiter = tokio::spawn(wait_on(biz, waiting.clone(), Duration::from_secs(10)));
    // By its sixth read (at about 255 ms) the reader's schedule has backed off to 100 ms
    // between reads: the body ends just after that read, and the watch is set up only
    // then.
    until("six reads on the schedule, the last one done", || {
        waiting.reads.load(Ordering::SeqCst) >= 6 && waiting.reading.load(Ordering::SeqCst) == 0
    })
    .await;
    finish.send(()).unwrap();
    assert_eq!(waiter.await.unwrap().expect("the waiter is answered"), "first");
    let late = ended.get().unwrap().elapsed();
    assert_eq!(holder.await.unwrap().unwrap(), "first");
    // On the schedule, the next read is about 100 ms after the last.
    assert!(
        late < Duration::from_millis(50),
        "answered {late:?} after the body ended"
    );
    assert_eq!(notices.watched(), 0, "the watch ended with the flight");
}

/// The holder of a key that hundreds wait on is dropped mid-body (its task cancelled):
/// its lease lapses, one waiter takes the key over and runs its body once, and every
/// waiter gets that run's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_dropped_under_a_storm_is_taken_over_by_one_waiter() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let store = Counting::on(MemoryStore::new());
    let op =
        Arc::new(waiting("dropped-holder-storm", &store, Duration::from_secs(10)).lease(Duration::from_millis(300)));
    let holder = holder(&op, async {
        std::future::pending::<()>().await;
        Ok::<_, Error>("never".to_owned())
    })
    .await;
    let bodies = Arc::new(AtomicUsize::new(0));
    let storm = waiters(&op, 300, &bodies, Duration::from_millis(50));
    until("the waiters to read", || store.reads.load(Ordering::SeqCst) > 0).await;
    holder.abort();
    assert!(holder.await.unwrap_err().is_cancelled());
    let answer = one_answer(storm).await;
    assert_eq!(bodies.load(Ordering::SeqCst), 1, "one waiter took the key over and ran");
    assert!(answer.starts_with("answer of waiter"), "{answer}");
    until("the flight to close", || observe::waited_keys() == 0).await;
}

/// A business's failure, or idem's error.
#[derive(Debug)]
enum Declined {
    ByTheBank,
    #[allow(dead_code)]
    Idem(Error),
}

impl From<Error> for Declined {
    fn from(error: Error) -> Self {
        Declined::Idem(error)
    }
}

/// The holder's body fails, and its claim is released (the default): one waiter runs
/// its body in its place, and every waiter gets that run's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_holder_under_a_storm_is_followed_by_one_run() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let store = Counting::on(MemoryStore::new());
    let op = Arc::new(waiting("failed-holder-storm", &store, Duration::from_secs(10)));
    let (fail, failing) = tokio::sync::oneshot::channel::<()>();
    let holder = holder(&op, async move {
        let _ = failing.await;
        Err::<String, _>(Declined::ByTheBank)
    })
    .await;
    let bodies = Arc::new(AtomicUsize::new(0));
    let storm = waiters(&op, 300, &bodies, Duration::from_millis(50));
    until("the waiters to read", || store.reads.load(Ordering::SeqCst) > 0).await;
    fail.send(()).unwrap();
    assert!(
        matches!(holder.await.unwrap(), Err(Declined::ByTheBank)),
        "the holder's own call fails"
    );
    let answer = one_answer(storm).await;
    assert_eq!(
        bodies.load(Ordering::SeqCst),
        1,
        "one waiter ran in the failed holder's place"
    );
    assert!(answer.starts_with("answer of waiter"), "{answer}");
    until("the flight to close", || observe::waited_keys() == 0).await;
}

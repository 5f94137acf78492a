//! Scenarios of a store that tells waiters when a record finishes
//! ([`IdempotencyStore::watch`](idem::IdempotencyStore::watch)): the waiter is told at
//! once, and a notice lost to a dropped listener costs a read, never an answer.
//!
//! Each takes two stores on the same records — the holder's and the waiter's, as two
//! processes' would be — so the holder's completion is news to the waiter only through
//! the store.

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use idem::{Error, Idempotent};

use super::calls::Store;
use super::unique;

/// How late after the news a waiter may be answered: without it, the waiter's next look
/// on its own comes about a second after its last.
const PROMPT: Duration = Duration::from_millis(300);

/// A holder of `(biz, key)` whose body takes `body`, returned once its body runs (so its
/// claim stands): its task, and when the body ended.
async fn hold(
    store: Store,
    biz: &'static str,
    key: &str,
    body: Duration,
) -> (tokio::task::JoinHandle<Result<String, Error>>, Arc<OnceLock<Instant>>) {
    let ended = Arc::new(OnceLock::new());
    let (key, told) = (key.to_owned(), ended.clone());
    let (running, claimed) = tokio::sync::oneshot::channel();
    let holder = tokio::spawn(async move {
        Idempotent::new(biz)
            .store(store)
            .execute(key, async move {
                running.send(()).unwrap();
                tokio::time::sleep(body).await;
                told.set(Instant::now()).unwrap();
                Ok::<_, Error>("first".to_owned())
            })
            .await
    });
    claimed.await.expect("the holder's body runs");
    (holder, ended)
}

/// A waiter of `(biz, key)`, for at most 10 s.
async fn wait_for(store: Store, biz: &'static str, key: String) -> Result<String, Error> {
    Idempotent::new(biz)
        .store(store)
        .wait(Duration::from_secs(10))
        .execute(key, async { Ok::<_, Error>("second".to_owned()) })
        .await
}

/// The waiter is told when the holder's record finishes: answered within 300 ms of the
/// body's end, not at its next look on its own.
pub async fn a_waiter_elsewhere_is_told(holding: Store, waiting: Store) {
    let key = unique("told");
    let (holder, ended) = hold(holding, "notices.told", &key, Duration::from_millis(1500)).await;
    let waited = wait_for(waiting, "notices.told", key).await;
    let answered = Instant::now();
    assert_eq!(waited.expect("the waiter is answered"), "first");
    assert_eq!(holder.await.unwrap().unwrap(), "first");
    let late = answered - *ended.get().unwrap();
    assert!(late < PROMPT, "answered {late:?} after the body ended");
}

/// The waiter's listener loses its connection (`cut`: drop it and keep it from
/// connecting again) while the holder finishes, so the notice is lost; `mend` lets it
/// connect again. Once it listens again the waiter reads, and is answered within 300 ms
/// — before its next look on its own.
pub async fn a_lost_notice_costs_a_read<Cut, Mend>(
    holding: Store,
    waiting: Store,
    cut: impl FnOnce() -> Cut,
    mend: impl FnOnce() -> Mend,
) where
    Cut: Future<Output = ()>,
    Mend: Future<Output = ()>,
{
    let key = unique("lost");
    let (holder, ended) = hold(holding, "notices.lost", &key, Duration::from_millis(1250)).await;
    let started = Instant::now();
    let waiter = tokio::spawn(wait_for(waiting, "notices.lost", key));
    // The waiter looks on its own at once and about a second later: cut after that.
    tokio::time::sleep_until((started + Duration::from_millis(1100)).into()).await;
    cut().await;
    assert_eq!(holder.await.unwrap().unwrap(), "first");
    assert!(ended.get().is_some());
    tokio::time::sleep_until((started + Duration::from_millis(1500)).into()).await;
    mend().await;
    let mended = Instant::now();
    assert_eq!(waiter.await.unwrap().expect("the waiter is answered"), "first");
    // Without the read once it listens again, the next look is at about 2 s.
    let late = mended.elapsed();
    assert!(
        late < PROMPT,
        "answered {late:?} after its listener could connect again"
    );
}

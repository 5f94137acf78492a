//! Tombstones: a record kept past its `ttl` answers `Expired` instead of running again
//! until its window ends (the purge strips it, then removes it), and an erased data
//! subject's records answer `Erased`, hold nothing of the call, and never run again.

use std::time::Duration;

use idem::subject::{self, SubjectKey};
use idem::{AfterExpiry, Error, Idempotent, OnError, Status, Tombstone};

use super::calls::{Runs, Store};
use super::unique;

/// The subject key every scenario of the kit hashes with (installed for the process).
fn key() -> SubjectKey {
    let key = SubjectKey::new([42; 32]);
    subject::install_key(key.clone());
    key
}

/// What `op` answers for `key` with a body that records `answer` (and counts its runs).
async fn call(op: &Idempotent, store: &Store, key: &str, runs: &Runs, answer: &str) -> Result<String, Error> {
    op.execute_on(store, key, async {
        runs.hit();
        Ok::<_, Error>(answer.to_owned())
    })
    .await
}

/// Everything stored about the call as one string, to search for plaintext.
async fn stored(store: &Store, biz: &str, key: &str) -> String {
    let record = store.get(biz, key).await.unwrap().expect("the record is kept");
    format!(
        "{:?} {:?} {:?} {:?}",
        record.request_body, record.response_body, record.error_message, record.steps
    )
}

/// Purge until a round finds nothing more to delete.
async fn purge(store: &Store) {
    while store.purge_expired(idem::store::now(), 1000).await.unwrap() == 1000 {}
}

/// `AfterExpiry::Gone`: replayed for the `ttl`, then `Expired` (never a run) from a
/// record the purge strips to a tombstone, until the window ends; then purged, and a
/// retry is a new request.
pub async fn a_tombstone_answers_gone_until_its_window_ends(store: &Store) {
    let biz = unique("gone");
    let (ttl, window) = (Duration::from_millis(1500), Duration::from_millis(2500));
    let op = Idempotent::new(biz.clone())
        .ttl(ttl)
        .after_expiry(AfterExpiry::Gone(window))
        .keep_request(true)
        .payload(&"charge ada 199");
    let runs = Runs::default();
    // What earlier runs left expired is purged first: the purges below, inside the
    // tombstone's window, meet only what this test wrote.
    purge(store).await;
    let started = std::time::Instant::now();
    assert_eq!(
        call(&op, store, "k", &runs, "receipt for ada").await.unwrap(),
        "receipt for ada"
    );
    assert_eq!(
        call(&op, store, "k", &runs, "").await.unwrap(),
        "receipt for ada",
        "replayed in the ttl"
    );

    tokio::time::sleep(ttl + Duration::from_millis(300)).await;
    let gone = call(&op, store, "k", &runs, "a second charge").await;
    assert!(matches!(gone, Err(Error::Expired { .. })), "past the ttl: {gone:?}");
    purge(store).await;
    let record = store.get(&biz, "k").await.unwrap().expect("the tombstone is kept");
    assert_eq!(
        (record.status, record.tombstone),
        (Status::Succeeded, Some(Tombstone::Expired)),
        "{record:?}"
    );
    let kept = stored(store, &biz, "k").await;
    assert!(!kept.contains("ada"), "a tombstone holds nothing of the call: {kept}");
    assert!(
        started.elapsed() < ttl + window - Duration::from_millis(300),
        "the test took {:?}, past the tombstone's window: a purge of the store took that long",
        started.elapsed()
    );
    let gone = call(&op, store, "k", &runs, "a second charge").await;
    assert!(matches!(gone, Err(Error::Expired { .. })), "a tombstone: {gone:?}");
    assert_eq!(runs.count(), 1, "no second run while the tombstone stands");

    let window_end = ttl + window + Duration::from_millis(300);
    tokio::time::sleep(window_end.saturating_sub(started.elapsed())).await;
    purge(store).await;
    assert!(
        store.get(&biz, "k").await.unwrap().is_none(),
        "purged at the end of its window"
    );
    assert_eq!(call(&op, store, "k", &runs, "new").await.unwrap(), "new");
    assert_eq!(runs.count(), 2, "after the window a retry is a new request");
}

/// The default, `NewRequest`: no tombstone, the purge deletes the record at its `ttl`.
pub async fn without_a_window_an_expired_key_is_a_new_request(store: &Store) {
    let biz = unique("newrequest");
    let op = Idempotent::new(biz.clone()).ttl(Duration::from_millis(500));
    let runs = Runs::default();
    call(&op, store, "k", &runs, "first").await.unwrap();
    let record = store.get(&biz, "k").await.unwrap().unwrap();
    assert_eq!((record.replay_until, record.tombstone), (None, None), "{record:?}");
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(call(&op, store, "k", &runs, "second").await.unwrap(), "second");
    assert_eq!(runs.count(), 2);
}

/// An erased subject's records, of every biz, success and failure alike, hold nothing
/// of their calls; their retries get `Erased` and never run (also where a copy of one
/// was made by its replay); another subject's records
/// are untouched; erasing again finds nothing.
pub async fn an_erased_subject_is_answered_erased_and_never_run(store: &Store) {
    let key = key();
    let (ada, bob) = (unique("ada"), unique("bob"));
    let (pay, refund) = (unique("erase.pay"), unique("erase.refund"));
    let pay_op = Idempotent::new(pay.clone());
    let refund_op = Idempotent::new(refund.clone()).on_error(OnError::Record);
    let runs = Runs::default();

    let ada_pay = pay_op.clone().subject(&ada).keep_request(true).payload(&"ada's card");
    call(&ada_pay, store, "order-1", &runs, "receipt for ada")
        .await
        .unwrap();
    let failed: Result<String, Error> = refund_op
        .clone()
        .subject(&ada)
        .execute_on(store, "order-1", async {
            runs.hit();
            Err(Error::InvalidStep {
                step: "bank".to_owned(),
                reason: "ada's account is closed".to_owned(),
            })
        })
        .await;
    assert!(failed.is_err());
    call(
        &pay_op.clone().subject(&bob),
        store,
        "order-2",
        &runs,
        "receipt for bob",
    )
    .await
    .unwrap();
    assert_eq!(runs.count(), 3);
    // Replayed once before the erasure: a cache or a pre-check store holds a copy now.
    let replayed = call(&ada_pay, store, "order-1", &runs, "").await.unwrap();
    assert_eq!(replayed, "receipt for ada");
    let record = store.get(&pay, "order-1").await.unwrap().unwrap();
    let hash = record.subject.clone().expect("the subject is kept");
    assert!(!hash.contains(&ada), "only a keyed hash of the subject is stored");
    assert_eq!(hash, key.hash(&ada));

    assert_eq!(
        subject::erase(store.as_ref(), &key, &ada).await.unwrap(),
        2,
        "both of ada's records"
    );
    for (biz, op) in [(&pay, &ada_pay), (&refund, &refund_op.clone().subject(&ada))] {
        let record = store.get(biz, "order-1").await.unwrap().expect("a tombstone is kept");
        assert_eq!(record.tombstone, Some(Tombstone::Erased), "{record:?}");
        assert_ne!(record.status, Status::Processing);
        let kept = stored(store, biz, "order-1").await;
        assert!(
            !kept.contains("ada") && !kept.contains("closed"),
            "nothing of the call is kept: {kept}"
        );
        let retry = call(op, store, "order-1", &runs, "a second charge").await;
        assert!(matches!(retry, Err(Error::Erased { .. })), "{retry:?}");
    }
    assert_eq!(runs.count(), 3, "no erased call ran again");
    let bobs = call(&pay_op.clone().subject(&bob), store, "order-2", &runs, "")
        .await
        .unwrap();
    assert_eq!(bobs, "receipt for bob", "another subject's record is untouched");
    assert_eq!(
        subject::erase(store.as_ref(), &key, &ada).await.unwrap(),
        0,
        "erased once"
    );
}

/// An operation that keeps only a digest of its answer: the store holds no part of it;
/// a duplicate gets `AnswerNotKept` and never runs. Redacted fields of the answer and of
/// a kept request are held as `"[redacted]"`, and the duplicate is answered with them so.
pub async fn what_is_not_kept_is_never_replayed_nor_run_again(store: &Store) {
    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Credential {
        user: String,
        secret: String,
    }
    let biz = unique("digest");
    let runs = Runs::default();
    let issue = |op: Idempotent, key: &'static str| {
        let runs = &runs;
        async move {
            op.execute_on(store, key, async {
                runs.hit();
                Ok::<_, Error>(Credential {
                    user: "ada".to_owned(),
                    secret: "otp-918273".to_owned(),
                })
            })
            .await
        }
    };
    let digest = Idempotent::new(biz.clone()).keep_answer(false);
    let first = issue(digest.clone(), "d").await.unwrap();
    assert_eq!(first.secret, "otp-918273", "the caller gets its answer");
    let kept = stored(store, &biz, "d").await;
    assert!(
        !kept.contains("otp") && !kept.contains("ada"),
        "only a digest is kept: {kept}"
    );
    let again = issue(digest, "d").await;
    assert!(matches!(again, Err(Error::AnswerNotKept { .. })), "{again:?}");
    assert_eq!(runs.count(), 1, "not run again");

    let redacted = Idempotent::new(biz.clone())
        .redact(["/secret"])
        .keep_request(true)
        .payload(&serde_json::json!({"user": "ada", "password": "hunter2"}))
        .redact(["/password"]);
    assert_eq!(issue(redacted.clone(), "r").await.unwrap().secret, "otp-918273");
    let kept = stored(store, &biz, "r").await;
    assert!(!kept.contains("otp") && !kept.contains("hunter2"), "{kept}");
    assert!(
        kept.contains("[redacted]") && kept.contains("ada"),
        "the rest is kept: {kept}"
    );
    let replayed = issue(redacted, "r").await.unwrap();
    assert_eq!(
        replayed,
        Credential {
            user: "ada".to_owned(),
            secret: "[redacted]".to_owned()
        }
    );
    assert_eq!(runs.count(), 2);
    let refused = Idempotent::new(biz.clone()).redact(["secret"]);
    let refused = issue(refused, "x").await;
    assert!(
        matches!(refused, Err(Error::InvalidOption { option: "redact", .. })),
        "{refused:?}"
    );
    assert_eq!(runs.count(), 2, "a bad pointer runs nothing");
}

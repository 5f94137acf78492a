//! Records sealed at rest, on every store: what the store holds is sealed (no plaintext
//! of a known answer, failure text, step value or request), a sealed value moved onto
//! another record is refused, a key the ring lacks or a value that is not sealed is a
//! clear error — never a replay and never a second run — and a rotated ring still opens
//! what the retired key sealed.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use idem::seal::{SealKey, SealedStore, StaticKeyRing, SEALED_PREFIX};
use idem::store::{Claim, ClaimOutcome};
use idem::{Error, IdempotencyStore, Idempotent, OnError};
use idem_testkit::{conformance, harness};

fn key(id: &str, byte: u8) -> SealKey {
    SealKey::new(id, [byte; 32]).unwrap()
}

/// The body's runs.
#[derive(Default)]
struct Runs(AtomicU32);

impl Runs {
    async fn receipt(&self, text: &str) -> Result<String, Error> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(text.to_owned())
    }

    fn count(&self) -> u32 {
        self.0.load(Ordering::SeqCst)
    }
}

/// The stored values of `(biz, key)` as the store holds them.
async fn stored(plain: &Arc<dyn IdempotencyStore>, biz: &str, key: &str) -> String {
    let record = plain.get(biz, key).await.unwrap().expect("a record");
    format!(
        "{:?} {:?} {:?} {:?}",
        record.response_body, record.error_message, record.request_body, record.steps
    )
}

/// A `Decode` error about `key`, whose causes say `why`.
fn decode_about(result: Result<String, Error>, key: &str, why: &str) {
    match result {
        Err(error @ Error::Decode { .. }) => {
            let Error::Decode { key: named, .. } = &error else {
                unreachable!()
            };
            assert_eq!(named, key, "the error names the record");
            let chain = idem::error_chain(&error);
            assert!(chain.contains(why), "{chain}");
        }
        other => panic!("expected Error::Decode about {key}: {other:?}"),
    }
}

async fn sealed_at_rest(plain: Arc<dyn IdempotencyStore>) {
    let biz = conformance::unique("seal");
    let ring = StaticKeyRing::new(key("k1", 1), []);
    let sealed = Arc::new(SealedStore::new(plain.clone(), ring.clone()));
    let op = Idempotent::new(biz.clone()).store(sealed.clone());
    let runs = Runs::default();

    // An answer, a failure's text, a step's value and a kept request: sealed on the way
    // in, opened on the way out.
    let answer: String = op
        .clone()
        .payload(&"ada's order")
        .keep_request(true)
        .execute("a", runs.receipt("receipt for ada, card 4242"))
        .await
        .unwrap();
    let again: String = op.execute("a", runs.receipt("")).await.unwrap();
    assert_eq!(
        (answer.as_str(), again.as_str(), runs.count()),
        ("receipt for ada, card 4242", "receipt for ada, card 4242", 1)
    );
    let failed: Result<String, Error> = op
        .clone()
        .on_error(OnError::Record)
        .execute("f", async {
            Err(Error::NoStore {
                biz: "declined for bob".into(),
            })
        })
        .await;
    assert!(failed.is_err());
    let stepped: String = op
        .execute("s", async {
            let charge: String = idem::step("charge", async { Ok::<_, Error>("charge ch_carol".to_owned()) }).await?;
            Ok::<_, Error>(charge)
        })
        .await
        .unwrap();
    assert_eq!(stepped, "charge ch_carol");
    for (record, secrets) in [
        ("a", ["ada", "4242"]),
        ("f", ["bob", "declined"]),
        ("s", ["carol", "ch_"]),
    ] {
        let held = stored(&plain, &biz, record).await;
        assert!(held.contains(SEALED_PREFIX), "{record}: {held}");
        for secret in secrets {
            assert!(
                !held.contains(secret),
                "{record}: `{secret}` is stored in clear: {held}"
            );
        }
    }
    assert!(
        stored(&plain, &biz, "s").await.contains("charge"),
        "step names stay in clear"
    );

    // A sealed answer copied onto another record does not open there: no replay, no run.
    let raw = plain.get(&biz, "a").await.unwrap().unwrap().response_body.unwrap();
    let claim = Claim::new(
        &biz,
        "moved",
        SystemTime::now(),
        Duration::from_secs(30),
        Duration::from_secs(3600),
    );
    let ClaimOutcome::Acquired(lease) = plain.claim(&claim).await.unwrap() else {
        panic!("a new key is acquired")
    };
    let written = plain
        .complete(&lease, &raw, SystemTime::now(), Duration::from_secs(3600))
        .await
        .unwrap();
    assert_eq!(written, idem::store::FenceCheck::Held);
    decode_about(
        op.execute("moved", runs.receipt("run again")).await,
        "moved",
        "moved from another",
    );
    assert_eq!(runs.count(), 1, "nothing ran");
    assert!(plain.get(&biz, "moved").await.unwrap().is_some(), "the record is kept");

    // The key retired and dropped from the ring: a clear error, never a second run.
    let dropped = Idempotent::new(biz.clone()).store(Arc::new(SealedStore::new(
        plain.clone(),
        StaticKeyRing::new(key("k2", 2), []),
    )));
    decode_about(dropped.execute("a", runs.receipt("run again")).await, "a", "key `k1`");
    assert_eq!(runs.count(), 1, "nothing ran");

    // Rotated: the new key seals, the retired one still opens.
    let rotated = Arc::new(SealedStore::new(
        plain.clone(),
        StaticKeyRing::new(key("k2", 2), [key("k1", 1)]),
    ));
    let rotated = Idempotent::new(biz.clone()).store(rotated);
    let replayed: String = rotated.execute("a", runs.receipt("")).await.unwrap();
    assert_eq!(replayed, "receipt for ada, card 4242");
    let _: String = rotated.execute("b", runs.receipt("receipt for dan")).await.unwrap();
    assert!(stored(&plain, &biz, "b").await.contains(&format!("{SEALED_PREFIX}k2:")));

    // A value written without sealing is refused unless the store accepts it while
    // migrating.
    let unsealed = Idempotent::new(biz.clone()).store(plain.clone());
    let _: String = unsealed.execute("p", runs.receipt("plain answer")).await.unwrap();
    decode_about(op.execute("p", runs.receipt("")).await, "p", "not sealed");
    let migrating =
        Idempotent::new(biz.clone()).store(Arc::new(SealedStore::new(plain.clone(), ring).accept_unsealed(true)));
    assert_eq!(migrating.execute("p", runs.receipt("")).await.unwrap(), "plain answer");
    assert_eq!(runs.count(), 3, "the first answers of a, b and p, and nothing else");
    harness::say(&format!(
        "seal on {}: every value sealed; moved, unkeyed and unsealed values refused",
        plain.kind()
    ));
}

/// A ring rotated during a duplicate storm, in the order the module's docs give: every
/// node first holds the new key as a retired one (`before`), then nodes one by one make
/// it current (`after`). Duplicates of each key land on both kinds of node at once:
/// every call is answered, every answer is the first one, each body ran once.
async fn rotation_in_a_storm(plain: Arc<dyn IdempotencyStore>) {
    const KEYS: usize = 24;
    const CALLERS: usize = 6;
    let biz = conformance::unique("seal-storm");
    let before = StaticKeyRing::new(key("k1", 1), [key("k2", 2)]);
    let after = StaticKeyRing::new(key("k2", 2), [key("k1", 1)]);
    let node = |ring: StaticKeyRing| {
        Idempotent::new(biz.clone())
            .store(Arc::new(SealedStore::new(plain.clone(), ring)))
            .wait(Duration::from_secs(30))
    };
    let nodes = [node(before), node(after)];
    let runs = Arc::new(Runs::default());
    let mut calls = tokio::task::JoinSet::new();
    for caller in 0..CALLERS {
        for record in 0..KEYS {
            let (op, runs) = (nodes[(caller + record) % 2].clone(), runs.clone());
            calls.spawn(async move {
                let answer: Result<String, Error> = op
                    .execute(format!("k{record}"), async {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        runs.receipt(&format!("receipt {record}, run by caller {caller}")).await
                    })
                    .await;
                (record, answer)
            });
        }
    }
    let mut first: Vec<Option<String>> = vec![None; KEYS];
    while let Some(joined) = calls.join_next().await {
        let (record, answer) = joined.unwrap();
        let answer = answer.unwrap_or_else(|error| panic!("k{record} not answered: {}", idem::error_chain(&error)));
        let first = first[record].get_or_insert_with(|| answer.clone());
        assert_eq!(&answer, first, "k{record}: a duplicate got another answer");
    }
    assert_eq!(runs.count() as usize, KEYS, "each body ran once");
    let mut by_key = [0, 0];
    for record in 0..KEYS {
        let held = stored(&plain, &biz, &format!("k{record}")).await;
        by_key[usize::from(held.contains(&format!("{SEALED_PREFIX}k2:")))] += 1;
    }
    harness::say(&format!(
        "seal rotation on {}: {KEYS} keys x {CALLERS} callers on two rings, all answered, {} runs; {} sealed with k1, {} with k2",
        plain.kind(),
        runs.count(),
        by_key[0],
        by_key[1]
    ));
}

async fn on(backend: &str) {
    let Some(url) = harness::backend_url(backend, "seal") else {
        return;
    };
    let store = harness::open_store(&url).await;
    sealed_at_rest(store.clone()).await;
    rotation_in_a_storm(store).await;
}

/// Transactional mode writes its record in the body's transaction, past the seal: a
/// call given a sealed store, or run with one installed, is refused before its body
/// runs and before anything is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transactional_call_refuses_a_sealed_store() {
    let pool = idem::sqlx::SqlitePool::connect("sqlite::memory:").await.unwrap();
    let sealed = Arc::new(SealedStore::new(
        Arc::new(idem::MemoryStore::new()),
        StaticKeyRing::new(key("k1", 1), []),
    ));
    let runs = Runs::default();
    let op = Idempotent::new("seal.tx").store(sealed);
    let mut tx = pool.begin().await.unwrap();
    let refused = idem::sql::execute_in(&op, &mut tx, "order-1", |_tx| {
        Box::pin(async { runs.receipt("charged").await })
    })
    .await;
    match refused {
        Err(Error::InvalidOption { option, reason, .. }) => {
            assert_eq!(option, "store");
            assert!(reason.contains("seals"), "{reason}");
        }
        other => panic!("expected a refusal: {other:?}"),
    }
    assert_eq!(runs.count(), 0, "the body did not run");
    let tables: i64 = idem::sqlx::query_scalar("SELECT count(*) FROM sqlite_master WHERE type = 'table'")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    assert_eq!(tables, 0, "nothing was written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sealed_at_rest_on_memory() {
    let store: Arc<dyn IdempotencyStore> = Arc::new(idem::MemoryStore::new());
    sealed_at_rest(store.clone()).await;
    rotation_in_a_storm(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sealed_at_rest_on_sqlite() {
    on("sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sealed_at_rest_on_postgres() {
    on("postgres").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sealed_at_rest_on_mysql() {
    on("mysql").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sealed_at_rest_on_redis() {
    on("redis").await;
}

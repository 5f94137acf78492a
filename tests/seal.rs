//! Records sealed at rest, on every store: what the store holds is sealed (no plaintext
//! of a known answer, failure text, step value or request), a sealed value moved onto
//! another record is refused, a key the ring lacks or a value that is not sealed is a
//! clear error — never a replay and never a second run — and a rotated ring still opens
//! what the retired key sealed.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use idem::pages::RecordPages;
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
        .keep_request(true)
        .payload(&"ada's order")
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

/// `rekey` over records of every kind sealed with an old key (answers with kept
/// requests, recorded failures, steps): each is re-sealed with the new key, a batch at
/// a time, after which a ring without the old key replays every first answer and runs
/// nothing; a second run re-seals nothing; a record that changed since it was read is
/// not rewritten. `table` is the store's own (the walk covers every record in it).
async fn rekey_then_retire(plain: Arc<dyn IdempotencyStore>, pages: &dyn RecordPages, table: &str) {
    const EACH: usize = 100;
    let biz = conformance::unique("rekey");
    let sealed = |ring: StaticKeyRing| Arc::new(SealedStore::new(plain.clone(), ring).table(table));
    let op = |ring: StaticKeyRing| Idempotent::new(biz.clone()).store(sealed(ring));
    let old = op(StaticKeyRing::new(key("r1", 11), []));
    let runs = Runs::default();
    for n in 0..EACH {
        let request = format!("order {n} for ada");
        let kept = old.clone().keep_request(true).payload(&request);
        let _: String = kept
            .execute(format!("a{n}"), runs.receipt(&format!("receipt {n}")))
            .await
            .unwrap();
        let failed: Result<String, Error> = old
            .clone()
            .on_error(OnError::Record)
            .execute(format!("f{n}"), async {
                Err(Error::NoStore {
                    biz: format!("declined {n}"),
                })
            })
            .await;
        assert!(failed.is_err());
        let _: String = old
            .execute(format!("s{n}"), async {
                idem::step("charge", async { Ok::<_, Error>(format!("ch_{n}")) }).await
            })
            .await
            .unwrap();
    }
    let new_ring = || StaticKeyRing::new(key("r2", 12), [key("r1", 11)]);
    let mut pages_seen = 0;
    let done = sealed(new_ring()).rekey(pages, 64, |_| pages_seen += 1).await.unwrap();
    assert_eq!(
        (done.resealed, done.changed_meanwhile),
        (3 * EACH as u64, 0),
        "{done:?}"
    );
    assert!(
        done.scanned >= 3 * EACH as u64 && pages_seen >= 1,
        "{done:?}, {pages_seen} pages"
    );
    for n in [0, EACH / 2, EACH - 1] {
        let held = stored(&plain, &biz, &format!("s{n}")).await;
        assert!(
            held.contains(&format!("{SEALED_PREFIX}r2:")) && !held.contains("r1:"),
            "{held}"
        );
    }

    // The old key dropped: every first answer replays, nothing runs.
    let retired = op(StaticKeyRing::new(key("r2", 12), []));
    for n in 0..EACH {
        let again: String = retired.execute(format!("a{n}"), runs.receipt("")).await.unwrap();
        assert_eq!(again, format!("receipt {n}"));
        let recorded = retired.execute(format!("f{n}"), runs.receipt("")).await;
        assert!(
            matches!(&recorded, Err(Error::PreviousFailed { message, .. }) if message.contains("error of type")),
            "{recorded:?}"
        );
        let step: String = retired.execute(format!("s{n}"), runs.receipt("")).await.unwrap();
        assert_eq!(step, format!("ch_{n}"));
    }
    assert_eq!(runs.count() as usize, EACH, "only the first answers ran");
    let again = sealed(new_ring()).rekey(pages, 64, |_| {}).await.unwrap();
    assert_eq!(again.resealed, 0, "{again:?}");

    // A record that changed since it was read is not rewritten.
    let read = plain.get(&biz, "a0").await.unwrap().unwrap();
    let mut stale = read.clone();
    stale.response_body = Some("an older answer".to_owned());
    let rewrite = |read: &idem::Record| idem::pages::Rewrite {
        read: read.clone(),
        with: read.clone(),
    };
    let rewrites = [rewrite(&stale), rewrite(&read)];
    assert_eq!(
        pages.replace_values(&rewrites).await.unwrap(),
        1,
        "a stale read rewrites nothing"
    );
    harness::say(&format!(
        "seal rekey on {}: {} records re-sealed in {pages_seen} pages, then read with the new key alone",
        plain.kind(),
        done.resealed
    ));
}

/// The store of `backend` on a table (a key prefix) of its own, and its pages.
async fn own_table(backend: &str, url: &str) -> (Arc<dyn IdempotencyStore>, Arc<dyn RecordPages>, String) {
    let table = conformance::unique("rekey").replace('-', "_");
    macro_rules! sql {
        ($store:ty, $url:expr) => {{
            let store = <$store>::connect($url).await.unwrap().with_table_name(&table).unwrap();
            store.migrate().await.unwrap();
            (
                Arc::new(store.clone()) as Arc<dyn IdempotencyStore>,
                Arc::new(store) as Arc<dyn RecordPages>,
            )
        }};
    }
    let (store, pages) = match backend {
        "sqlite" => sql!(idem::SqliteStore, &format!("{url}?mode=rwc")),
        "postgres" => sql!(idem::PostgresStore, url),
        "mysql" => sql!(idem::MySqlStore, url),
        _ => {
            let store = idem::RedisStore::connect(url)
                .await
                .unwrap()
                .with_prefix(&format!("{table}:"))
                .unwrap();
            (
                Arc::new(store.clone()) as Arc<dyn IdempotencyStore>,
                Arc::new(store) as Arc<dyn RecordPages>,
            )
        }
    };
    (store, pages, table)
}

async fn on(backend: &str) {
    let Some(url) = harness::backend_url(backend, "seal") else {
        return;
    };
    let store = harness::open_store(&url).await;
    sealed_at_rest(store.clone()).await;
    rotation_in_a_storm(store).await;
    let (store, pages, table) = own_table(backend, &url).await;
    rekey_then_retire(store, pages.as_ref(), &table).await;
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
    let own = idem::MemoryStore::new();
    rekey_then_retire(Arc::new(own.clone()), &own, idem::seal::DEFAULT_TABLE).await;
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

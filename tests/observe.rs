//! What an operator sees: the `tracing` span and events of each call (captured by a
//! subscriber layer), and every `metrics` counter after a known mix of calls.

use idem_testkit::conformance;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use conformance::faulty::{Fault, FaultyStore, Op};
use idem::{Error, Idempotent, MemoryStore, Mode};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::{CompositeKey, MetricKind};
use tracing::field::{Field, Visit};
use tracing::{Level, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// One captured event: its level, message and fields, and the fields of its span.
#[derive(Debug, Clone)]
struct Seen {
    level: Level,
    message: String,
    fields: HashMap<String, String>,
    span: HashMap<String, String>,
}

#[derive(Default)]
struct Fields(HashMap<String, String>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(
            field.name().to_owned(),
            format!("{value:?}").trim_matches('"').to_owned(),
        );
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_owned(), value.to_string());
    }
}

/// Keeps every event, with the fields of the `idem.call` span it happened in.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<Seen>>>);

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &tracing::span::Attributes<'_>, id: &tracing::span::Id, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        ctx.span(id).unwrap().extensions_mut().insert(fields);
    }

    fn on_record(&self, id: &tracing::span::Id, values: &tracing::span::Record<'_>, ctx: Context<'_, S>) {
        let span = ctx.span(id).unwrap();
        let mut extensions = span.extensions_mut();
        values.record(extensions.get_mut::<Fields>().unwrap());
    }

    fn on_event(&self, event: &tracing::Event<'_>, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let span = ctx
            .event_span(event)
            .and_then(|span| span.extensions().get::<Fields>().map(|f| f.0.clone()))
            .unwrap_or_default();
        let message = fields.0.remove("message").unwrap_or_default();
        self.0.lock().unwrap().push(Seen {
            level: *event.metadata().level(),
            message,
            fields: fields.0,
            span,
        });
    }
}

/// The tests share process-wide state (tracing's callsite cache, the key-hashing
/// switch): one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn op(biz: &'static str, store: &Arc<MemoryStore>) -> Idempotent {
    Idempotent::new(biz).store(store.clone())
}

#[tokio::test(flavor = "current_thread")]
async fn a_call_is_one_span_and_healthy_calls_log_nothing_above_debug() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let capture = Capture::default();
    let _guard = tracing::subscriber::set_default(tracing_subscriber::registry().with(capture.clone()));
    let store = Arc::new(MemoryStore::new());
    let pay = op("observe.trace", &store);
    let first: u32 = pay.execute("order-7", async { Ok::<_, Error>(1) }).await.unwrap();
    let again: u32 = pay.execute("order-7", async { Ok::<_, Error>(2) }).await.unwrap();
    assert_eq!((first, again), (1, 1));
    let seen = capture.0.lock().unwrap().clone();
    assert!(seen.iter().all(|e| e.level >= Level::DEBUG), "{seen:#?}");
    let claimed = seen
        .iter()
        .find(|e| e.message == "idem: claimed")
        .unwrap_or_else(|| panic!("a claim event: {seen:#?}"));
    assert_eq!(claimed.span["biz"], "observe.trace");
    assert_eq!(claimed.span["key"], idem::observe::shown_key("order-7").to_string());
    assert_eq!(claimed.fields["fence"], claimed.span["fence"]);
    let outcomes: Vec<&str> = seen
        .iter()
        .filter(|e| e.message == "idem: call ended")
        .map(|e| e.fields["outcome"].as_str())
        .collect();
    assert_eq!(outcomes, ["executed", "replayed"]);

    // A mismatch is the client's fault: INFO, once.
    let typed = pay.clone().payload(&5);
    let _ = typed.execute("order-8", async { Ok::<_, Error>(5) }).await.unwrap();
    let mismatch: Result<u32, Error> = pay.clone().payload(&6).execute("order-8", async { Ok(6) }).await;
    assert!(matches!(mismatch, Err(Error::PayloadMismatch { .. })));
    let seen = capture.0.lock().unwrap().clone();
    let infos: Vec<_> = seen.iter().filter(|e| e.level == Level::INFO).collect();
    assert_eq!(infos.len(), 1, "{infos:#?}");
    assert_eq!(infos[0].fields["outcome"], "payload_mismatch");
}

/// Keys may be personal data: by default no span and no event shows one, only its hash
/// (a completion the store failed once is a warning naming the key); asked to, the
/// spans show keys as given.
#[tokio::test(flavor = "current_thread")]
async fn keys_are_hashed_in_traces_and_logs_by_default() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let capture = Capture::default();
    let _guard = tracing::subscriber::set_default(tracing_subscriber::registry().with(capture.clone()));
    let store = Arc::new(MemoryStore::new());
    let _: u32 = op("observe.hashed", &store)
        .execute("ada@example.com", async { Ok::<_, Error>(1) })
        .await
        .unwrap();
    let flaky = FaultyStore::new(&(Arc::new(MemoryStore::new()) as conformance::calls::Store));
    flaky.inject(Op::Complete, Fault::Fail, 1);
    let recorded: u32 = Idempotent::new("observe.hashed")
        .store(flaky.shared())
        .execute("bob@example.com", async { Ok::<_, Error>(1) })
        .await
        .unwrap();
    assert_eq!(recorded, 1);
    let seen = capture.0.lock().unwrap().clone();
    let keys: Vec<&str> = seen
        .iter()
        .filter_map(|e| e.span.get("key"))
        .map(String::as_str)
        .collect();
    assert!(!keys.is_empty());
    assert!(
        keys.iter().all(|key| key.starts_with("sha256:") && key.len() == 23),
        "{keys:?}"
    );
    let warned: Vec<_> = seen
        .iter()
        .filter(|e| e.level == Level::WARN && e.fields.contains_key("key"))
        .collect();
    assert!(
        !warned.is_empty(),
        "the failed completion is a warning naming the key: {seen:#?}"
    );
    assert_eq!(
        warned[0].fields["key"],
        idem::observe::shown_key("bob@example.com").to_string()
    );
    let everything = format!("{seen:?}");
    assert!(
        !everything.contains("ada@example.com") && !everything.contains("bob@example.com"),
        "{seen:#?}"
    );

    // Opaque keys can be shown as given.
    idem::observe::hash_keys_in_traces(false);
    let _: u32 = op("observe.hashed", &store)
        .execute("7c1e2a", async { Ok::<_, Error>(1) })
        .await
        .unwrap();
    idem::observe::hash_keys_in_traces(true);
    let seen = capture.0.lock().unwrap().clone();
    assert!(
        seen.iter()
            .any(|e| e.span.get("key").is_some_and(|key| key == "7c1e2a")),
        "{seen:#?}"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn every_counter_after_a_known_mix_of_calls() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let store = Arc::new(MemoryStore::new());
    let biz = "observe.mix";
    let pay = op(biz, &store);

    for key in ["a", "b", "c"] {
        let _: u32 = pay.execute(key, async { Ok::<_, Error>(1) }).await.unwrap();
        // 3 executed
    }
    for _ in 0..2 {
        let _: u32 = pay.execute("a", async { Ok::<_, Error>(9) }).await.unwrap();
        // 2 replayed
    }
    let rejected: Result<u32, Error> = pay.clone().mode(Mode::Reject).execute("a", async { Ok(9) }).await;
    assert!(matches!(rejected, Err(Error::Duplicate { .. }))); // 1 rejected
    let failed: Result<u32, Error> = pay
        .execute("d", async {
            Err(Error::InvalidStep {
                step: "x".into(),
                reason: "test".into(),
            })
        })
        .await;
    assert!(failed.is_err()); // 1 failed
    let _ = pay
        .clone()
        .payload(&1)
        .execute("e", async { Ok::<_, Error>(1) })
        .await
        .unwrap(); // 1 executed
    let mismatch: Result<u32, Error> = pay.clone().payload(&2).execute("e", async { Ok(2) }).await;
    assert!(matches!(mismatch, Err(Error::PayloadMismatch { .. }))); // 1 payload_mismatch

    // A running call: one duplicate answered in progress, one that waits and replays.
    let slow = pay.execute("f", async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        Ok::<_, Error>(1u32)
    });
    let busy = async {
        tokio::time::sleep(Duration::from_millis(10)).await;
        pay.execute("f", async { Ok::<_, Error>(2u32) }).await
    };
    let waiter = async {
        tokio::time::sleep(Duration::from_millis(10)).await;
        pay.clone()
            .wait(Duration::from_secs(5))
            .execute("f", async { Ok::<_, Error>(3u32) })
            .await
    };
    let (slow, busy, waiter) = tokio::join!(slow, busy, waiter);
    assert_eq!(slow.unwrap(), 1); // 1 executed
    assert!(matches!(busy, Err(Error::InProgress { .. }))); // 1 in_progress
    assert_eq!(waiter.unwrap(), 1); // 1 replayed, 1 wait

    // A holder dropped mid-body: its key is taken over after the lease (no clock
    // tolerance on top).
    let short = pay
        .clone()
        .lease(Duration::from_millis(50))
        .clock_tolerance(Duration::ZERO);
    let abandoned = short.execute("g", async {
        tokio::time::sleep(Duration::from_secs(60)).await;
        Ok::<_, Error>(0u32)
    });
    let _ = tokio::time::timeout(Duration::from_millis(20), abandoned).await;
    tokio::time::sleep(Duration::from_millis(80)).await;
    let _: u32 = short.execute("g", async { Ok::<_, Error>(1) }).await.unwrap(); // 1 executed, 1 takeover

    // A store that keeps refusing the `complete` as if the key had been taken over
    // (one refusal its record contradicts would be written again): the holder's
    // outcome is lost.
    let taken_over = FaultyStore::new(&(Arc::new(MemoryStore::new()) as conformance::calls::Store));
    taken_over.inject(Op::Complete, Fault::Fenced, 10);
    let lost = Idempotent::new(biz).store(taken_over.shared());
    let error: Result<u32, Error> = lost.execute("i", async { Ok(1) }).await;
    assert!(matches!(error, Err(Error::LeaseLost { .. })), "{error:?}"); // 1 executed, 1 lease lost

    // A claim the store fails: counted as a store error of the claim.
    let down = FaultyStore::new(&(Arc::new(MemoryStore::new()) as conformance::calls::Store));
    down.inject(Op::Claim, Fault::Fail, 1);
    let down = Idempotent::new(biz).store(down.shared());
    let error: Result<u32, Error> = down.execute("h", async { Ok(1) }).await;
    assert!(matches!(error, Err(Error::Store { .. }))); // 1 store_error

    // An effect that went unanswered: failed closed (and its duplicate answered so), or
    // reconciled by its lookup.
    let unanswered = || async { Err::<u32, Error>(Error::NoStore { biz: "bank".into() }) };
    for _ in 0..2 {
        let unknown: Result<u32, Error> = pay
            .execute("j", async {
                idem::Step::new("charge").fail_closed().run(unanswered()).await
            })
            .await;
        assert!(matches!(unknown, Err(Error::OutcomeUnknown { .. })), "{unknown:?}");
        // 2 outcome_unknown, 1 body
    }
    let reconciled: u32 = pay
        .execute("k", async {
            idem::Step::new("charge")
                .reconcile(|_| async { Ok::<_, Error>(idem::Lookup::Done(5)) })
                .run(unanswered())
                .await
        })
        .await
        .unwrap(); // 1 executed, 1 reconciled
    assert_eq!(reconciled, 5);

    let mut counters: HashMap<String, u64> = HashMap::new();
    let mut histograms: HashMap<String, usize> = HashMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key: CompositeKey = key;
        let name = key.key().name().to_owned();
        let labels: Vec<String> = key
            .key()
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        assert!(labels.iter().any(|l| l == &format!("biz={biz}")), "{name} {labels:?}");
        assert!(labels.iter().all(|l| !l.starts_with("key")), "never labelled by key");
        let id = format!("{name}{{{}}}", labels.join(","));
        match (key.kind(), value) {
            (MetricKind::Counter, DebugValue::Counter(n)) => drop(counters.insert(id, n)),
            (MetricKind::Histogram, DebugValue::Histogram(values)) => drop(histograms.insert(name, values.len())),
            other => panic!("{id}: {other:?}"),
        }
    }
    let calls = |outcome: &str| {
        counters
            .get(&format!("idem_calls_total{{biz={biz},outcome={outcome}}}"))
            .copied()
    };
    assert_eq!(calls("executed"), Some(8), "{counters:#?}");
    assert_eq!(calls("outcome_unknown"), Some(2));
    assert_eq!(
        counters.get(&format!("idem_outcome_unknown_total{{biz={biz}}}")),
        Some(&1)
    );
    assert_eq!(
        counters.get(&format!("idem_reconciled_total{{biz={biz},found=done}}")),
        Some(&1)
    );
    assert_eq!(calls("replayed"), Some(3));
    assert_eq!(calls("rejected"), Some(1));
    assert_eq!(calls("failed"), Some(1));
    assert_eq!(calls("payload_mismatch"), Some(1));
    assert_eq!(calls("in_progress"), Some(1));
    assert_eq!(calls("store_error"), Some(1));
    assert_eq!(counters.get(&format!("idem_waits_total{{biz={biz}}}")), Some(&1));
    assert_eq!(counters.get(&format!("idem_takeovers_total{{biz={biz}}}")), Some(&1));
    assert_eq!(counters.get(&format!("idem_lease_lost_total{{biz={biz}}}")), Some(&1));
    assert_eq!(
        counters.get(&format!("idem_store_errors_total{{biz={biz},operation=claim}}")),
        Some(&1)
    );
    assert_eq!(histograms.get("idem_body_seconds"), Some(&10), "one per body run");
    assert!(histograms.get("idem_claim_seconds").copied().unwrap_or(0) >= 13);
}

#[tokio::test(flavor = "current_thread")]
async fn transactional_calls_are_counted_too() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let path = idem_testkit::scratch::path("observe.db");
    let store = idem::SqliteStore::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    store.migrate().await.unwrap();
    let op = Idempotent::new("observe.tx").store(Arc::new(store.clone()));
    for _ in 0..2 {
        let mut tx = store.pool().begin().await.unwrap();
        let value = idem::sql::execute_in(&op, &mut tx, "order-1", |_tx| Box::pin(async { Ok::<_, Error>(7u32) }))
            .await
            .unwrap();
        tx.commit().await.unwrap();
        assert_eq!(value, 7);
    }
    let counted: HashMap<String, u64> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| match value {
            DebugValue::Counter(n) => {
                let labels: Vec<String> = key
                    .key()
                    .labels()
                    .map(|l| format!("{}={}", l.key(), l.value()))
                    .collect();
                Some((format!("{}{{{}}}", key.key().name(), labels.join(",")), n))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        counted.get("idem_calls_total{biz=observe.tx,outcome=executed}"),
        Some(&1),
        "{counted:#?}"
    );
    assert_eq!(
        counted.get("idem_calls_total{biz=observe.tx,outcome=replayed}"),
        Some(&1)
    );
}

//! Steps through real SIGKILLs, on every database: a worker process is killed between
//! two steps of a body, again and again, each time on the next key. The retry (the next
//! worker, and at the end this process) takes the claim over after its lease, gets the
//! finished step's value back without running it, and runs the remaining step once.
//! Every effect is a business row: exactly one `charge` and one `notify` row per key,
//! and every answer names the charge of the process that was killed.

use idem_testkit::conformance;
use idem_testkit::harness;

use std::sync::Arc;
use std::time::Duration;

use harness::{AppError, Effects};
use idem::{idempotent, step, IdempotencyStore};

type Store = Arc<dyn IdempotencyStore>;

/// Killed rounds: each kills one worker between the steps of a new key.
const ROUNDS: usize = 5;

/// One step's effect: a business row under `key:name`, and the value recorded for it
/// (who ran it, and the effect key it would hand a downstream service).
async fn effect(effects: &Effects, run: &str, key: &str, name: &str) -> Result<String, AppError> {
    let context = idem::context().expect("inside the body");
    let value = format!("{name} by {} as {}", std::process::id(), context.effect_key(name));
    effects.record(run, &format!("{key}:{name}"), &value).await?;
    Ok(value)
}

/// The body: charge, then (after `between`, long enough to be killed in) notify.
#[idempotent(key = key, biz = "steps.kill", store = store, lease = "1s", wait = "20s")]
async fn charge_and_notify(
    store: &Store,
    effects: &Effects,
    run: &str,
    key: &str,
    between: Duration,
) -> Result<String, AppError> {
    let charge: String = step("charge", effect(effects, run, key, "charge")).await?;
    if !between.is_zero() {
        harness::report("BETWEEN_STEPS");
        tokio::time::sleep(between).await;
    }
    let notify: String = step("notify", effect(effects, run, key, "notify")).await?;
    Ok(format!("{charge} | {notify}"))
}

/// The worker: finishes keys `0..hang_at` (replays, and the takeover of the key the
/// worker before it was killed in), then hangs between the steps of key `hang_at`.
#[test]
fn steps_worker() {
    let Some(_) = harness::worker_settings("steps") else {
        return;
    };
    let (url, run) = (harness::setting("STEPS_URL"), harness::setting("STEPS_RUN"));
    let hang_at: usize = harness::setting("STEPS_HANG_AT").parse().unwrap();
    harness::worker_runtime().block_on(async {
        let store = harness::open_store(&url).await;
        let effects = Effects::open(&url).await;
        for k in 0..=hang_at {
            let between = if k == hang_at {
                Duration::from_secs(600)
            } else {
                Duration::ZERO
            };
            let key = format!("{run}-{k}");
            charge_and_notify(&store, &effects, &run, &key, between).await.unwrap();
        }
    });
}

/// Start a worker, wait until it is between the steps of key `hang_at`, SIGKILL it.
/// Its pid: the one that ran that key's charge.
fn kill_between_steps(url: &str, run: &str, hang_at: usize) -> u32 {
    let settings = [
        ("STEPS_URL", url.to_owned()),
        ("STEPS_RUN", run.to_owned()),
        ("STEPS_HANG_AT", hang_at.to_string()),
    ];
    let (mut child, _, _) = harness::start_worker("steps", "steps_worker", &settings, "BETWEEN_STEPS");
    let pid = child.id();
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    pid
}

fn killed_between_steps(backend: &str) {
    let Some(url) = harness::backend_url(backend, "steps-kill") else {
        return;
    };
    let run = conformance::unique("steps-kill");
    let killed: Vec<u32> = (0..ROUNDS).map(|k| kill_between_steps(&url, &run, k)).collect();

    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let store = harness::open_store(&url).await;
        let effects = Effects::open(&url).await;
        // Every key retried here: the last one is taken over, the others replayed.
        let mut answers = Vec::new();
        for k in 0..ROUNDS {
            let key = format!("{run}-{k}");
            answers.push(
                charge_and_notify(&store, &effects, &run, &key, Duration::ZERO)
                    .await
                    .unwrap(),
            );
        }
        let rows = effects.tokens(&run).await;
        for (k, (answer, pid)) in answers.iter().zip(&killed).enumerate() {
            let key = format!("{run}-{k}");
            let (charges, notices) = (&rows[&format!("{key}:charge")], &rows[&format!("{key}:notify")]);
            assert_eq!(
                (charges.len(), notices.len()),
                (1, 1),
                "key {k}: each effect once, charges {charges:?}, notices {notices:?}"
            );
            assert_eq!(
                answer,
                &format!("{} | {}", charges[0], notices[0]),
                "key {k}: the answer is the recorded effects"
            );
            assert!(
                charges[0].starts_with(&format!("charge by {pid} as ")),
                "key {k}: the charge of the killed worker {pid} is kept: {}",
                charges[0]
            );
            assert!(
                !notices[0].starts_with(&format!("notify by {pid} ")),
                "key {k}: notified by the retry, not the killed worker: {}",
                notices[0]
            );
            let effect_key = |value: &str| {
                value
                    .rsplit(" as ")
                    .next()
                    .unwrap()
                    .rsplit_once(':')
                    .unwrap()
                    .0
                    .to_owned()
            };
            assert_eq!(
                effect_key(&charges[0]),
                effect_key(&notices[0]),
                "key {k}: one life, the same downstream key prefix across the takeover"
            );
        }
    });
    harness::say(&format!(
        "steps kill on {backend}: {ROUNDS} workers SIGKILLed between two steps; every charge kept from the killed worker, every notify run once by the retry"
    ));
}

#[test]
fn killed_between_steps_sqlite() {
    killed_between_steps("sqlite");
}

#[test]
fn killed_between_steps_postgres() {
    killed_between_steps("postgres");
}

#[test]
fn killed_between_steps_mysql() {
    killed_between_steps("mysql");
}

#[test]
fn killed_between_steps_redis() {
    killed_between_steps("redis");
}

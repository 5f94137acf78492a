//! The evening's worst case: a bank that forgets keys, and a process that dies right
//! after a charge and before its record.
//!
//! The bank (`--bank-forgets-keys`) charges whatever it is asked, never deduplicating;
//! its charges are rows of `bank_charges (reference, user_name, cents)` in the same
//! database as the records, so the process that crashed and the one after it see one
//! bank, and it answers "did you charge reference R?". The reference is the charge
//! step's effect key. `--crash-after-charge` aborts the process right after the
//! evening's first charge; `--resume` plays the same evening's requests again, as
//! clients retrying after the crash. `--outcome` says what the charge step does when it
//! finds a charge begun and not finished: `rerun` charges again, `reconcile` asks the
//! bank, `fail-closed` answers `OutcomeUnknown` until an operator settles it.
//!
//! The run ends with `charges=N requests=M doubled=D unknown=U`: the bank's charges of
//! the evening, the requests played (clicks and gateway retries), the users charged
//! more than once, the users whose answer was an unknown outcome.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem::{idempotent, Lookup, Step};

use super::{PayError, PayRequest, USERS};
use serde::{Deserialize, Serialize};
use sqlx::AnyPool;

/// What the charge step does with a charge begun and not finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Rerun,
    Reconcile,
    FailClosed,
}

impl Outcome {
    pub fn parse(text: &str) -> Result<Self, String> {
        match text {
            "rerun" => Ok(Outcome::Rerun),
            "reconcile" => Ok(Outcome::Reconcile),
            "fail-closed" => Ok(Outcome::FailClosed),
            other => Err(format!("--outcome {other:?}: give reconcile, fail-closed or rerun")),
        }
    }
}

/// The options of the worst case.
pub struct Options {
    pub outcome: Outcome,
    pub crash_after_charge: bool,
    pub resume: bool,
}

/// How long the bank takes for one charge (it serves one at a time).
const CHARGE_TIME: Duration = Duration::from_millis(110);

/// What the bank answers a charge: its reference and amount.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Charge {
    reference: String,
    cents: i64,
}

/// The bank that forgets keys.
struct Bank {
    pool: AnyPool,
    numbered: bool,
    /// The bank serves one request at a time: the others wait before they send theirs.
    teller: tokio::sync::Mutex<()>,
    /// Abort the process right after the first charge.
    crash_after_charge: AtomicBool,
}

impl Bank {
    /// `?` placeholders as the database wants them (`$1`, `$2` on PostgreSQL).
    fn sql(&self, text: &str) -> String {
        if self.numbered {
            idem::sql::numbered(text)
        } else {
            text.to_owned()
        }
    }

    async fn charge(&self, reference: &str, user: &str, cents: u64) -> Result<Charge, PayError> {
        let cents = i64::try_from(cents).expect("an amount in cents");
        tokio::time::sleep(CHARGE_TIME).await;
        sqlx::query(&self.sql("INSERT INTO bank_charges (reference, user_name, cents) VALUES (?, ?, ?)"))
            .bind(reference)
            .bind(user)
            .bind(cents)
            .execute(&self.pool)
            .await?;
        if self.crash_after_charge.swap(false, Ordering::SeqCst) {
            eprintln!("payment: crashing right after charging {user} ({reference}), before its record");
            std::process::abort();
        }
        Ok(Charge {
            reference: reference.to_owned(),
            cents,
        })
    }

    /// Did the bank charge `reference`?
    async fn charged(&self, reference: &str) -> Result<Lookup<Charge>, sqlx::Error> {
        let found: Option<(i64,)> = sqlx::query_as(&self.sql("SELECT cents FROM bank_charges WHERE reference = ?"))
            .bind(reference)
            .fetch_optional(&self.pool)
            .await?;
        Ok(match found {
            Some((cents,)) => Lookup::Done(Charge {
                reference: reference.to_owned(),
                cents,
            }),
            None => Lookup::NotDone,
        })
    }
}

struct Service {
    bank: Bank,
    outcome: Outcome,
}

impl Service {
    /// Charge once per `request_id`, the charge a step under the evening's policy. The
    /// lease is short, so that after a crash the retries take over within seconds.
    #[idempotent(key = "req.request_id", biz = "pay", ttl = "24h", lease = "2s", wait = "1s", payload = req)]
    async fn pay(&self, req: PayRequest) -> Result<Charge, PayError> {
        let reference = idem::context().expect("inside the call").effect_key("charge");
        let _teller = self.bank.teller.lock().await;
        let step = Step::new("charge");
        let step = match self.outcome {
            Outcome::Rerun => step,
            Outcome::FailClosed => step.fail_closed(),
            Outcome::Reconcile => step.reconcile(|intent| async move { self.bank.charged(&intent.effect_key).await }),
        };
        step.run(self.bank.charge(&reference, &req.user, req.cents)).await
    }
}

/// The same evening as the main run, at a bank that forgets keys.
pub async fn run(url: &str, options: Options) -> Result<(), Box<dyn std::error::Error>> {
    sqlx::any::install_default_drivers();
    let pool = AnyPool::connect(url).await?;
    let numbered = url.starts_with("postgres");
    for table in [
        "CREATE TABLE IF NOT EXISTS bank_charges (reference VARCHAR(255) NOT NULL, user_name VARCHAR(64) NOT NULL, cents BIGINT NOT NULL)",
        "CREATE TABLE IF NOT EXISTS payment_evenings (evening BIGINT NOT NULL)",
    ] {
        sqlx::query(table).execute(&pool).await?;
    }
    let bank = Bank {
        pool: pool.clone(),
        numbered,
        teller: tokio::sync::Mutex::new(()),
        crash_after_charge: AtomicBool::new(options.crash_after_charge),
    };
    let evening: i64 = if options.resume {
        let (last,): (Option<i64>,) = sqlx::query_as("SELECT MAX(evening) FROM payment_evenings")
            .fetch_one(&pool)
            .await?;
        last.ok_or("--resume: no evening was played on this database yet")?
    } else {
        let evening = i64::try_from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)?
                .as_millis(),
        )?;
        sqlx::query(&bank.sql("INSERT INTO payment_evenings (evening) VALUES (?)"))
            .bind(evening)
            .execute(&pool)
            .await?;
        evening
    };
    println!(
        "The worst case: a bank that forgets keys, outcome policy {:?}{}{}",
        options.outcome,
        if options.crash_after_charge {
            ", crashing after the first charge"
        } else {
            ""
        },
        if options.resume {
            ", resuming the last evening"
        } else {
            ""
        }
    );
    let service = Arc::new(Service {
        bank,
        outcome: options.outcome,
    });

    // The evening's requests: every user clicks, clicks again, and the gateway retries
    // user-0 twice; each client retries an in-progress answer.
    let send = |user: usize| {
        let service = service.clone();
        let req = PayRequest {
            request_id: format!("evening{evening}-user{user}"),
            user: format!("user-{user}"),
            cents: 19_900,
        };
        tokio::spawn(async move {
            loop {
                match service.pay(req.clone()).await {
                    Err(PayError::Idem(idem::Error::InProgress { .. })) => {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    answer => return (user, answer),
                }
            }
        })
    };
    let mut requests: Vec<_> = (0..USERS).map(send).collect();
    tokio::time::sleep(Duration::from_millis(800)).await;
    requests.extend((0..USERS).map(send));
    tokio::time::sleep(Duration::from_millis(200)).await;
    requests.extend([send(0), send(0)]);

    let played = requests.len();
    let mut unknown = std::collections::BTreeSet::new();
    for request in requests {
        let (user, answer) = request.await?;
        match answer {
            Ok(_) => {}
            Err(PayError::Idem(error @ idem::Error::OutcomeUnknown { .. })) => {
                if unknown.insert(user) {
                    println!("user-{user}: {error}");
                }
            }
            Err(error) => return Err(error.into()),
        }
    }
    let prefix = format!("pay:evening{evening}-%");
    let rows: Vec<(String,)> = sqlx::query_as(
        &service
            .bank
            .sql("SELECT user_name FROM bank_charges WHERE reference LIKE ?"),
    )
    .bind(&prefix)
    .fetch_all(&pool)
    .await?;
    let mut per_user = std::collections::BTreeMap::new();
    for (user,) in &rows {
        *per_user.entry(user.as_str()).or_insert(0) += 1;
    }
    let doubled = per_user.values().filter(|charges| **charges > 1).count();
    println!(
        "charges={} requests={played} doubled={doubled} unknown={}",
        rows.len(),
        unknown.len()
    );
    Ok(())
}

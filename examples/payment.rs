//! The double-charge incident, replayed.
//!
//! 22:00 on a sale night: the bank answers in 11 seconds instead of one, users see a
//! spinner, click "pay" again, and the gateway retries too. Without server-side
//! idempotency every one of those requests is a new charge; that evening 3,700 users
//! were charged twice. This program plays the same evening at 1/10 of the time and
//! 1/100 of the users, with `#[idempotent]` — and, with `--without-idem`, without it.
//!
//! ```text
//! cargo run --example payment                    # one charge per user, records in a SQLite file
//! cargo run --example payment -- --without-idem  # the incident
//! cargo run --example payment -- --database-url postgres://user@127.0.0.1/db   # or mysql://…
//! ```
//!
//! The evening's worst case — a bank that never deduplicates, and the process killed
//! right after a charge and before its record — and what each outcome policy makes of
//! it (see `support/evening.rs`):
//!
//! ```text
//! cargo run --example payment -- --bank-forgets-keys --outcome reconcile --crash-after-charge
//! cargo run --example payment -- --bank-forgets-keys --outcome reconcile --resume
//! # charges=37 requests=76 doubled=0 unknown=0   (rerun: doubled=1; fail-closed: unknown=1)
//! ```

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem::idempotent;
use serde::{Deserialize, Serialize};

#[path = "support/evening.rs"]
mod evening;

/// How long the slow bank takes (11 s that evening, at 1/10 scale).
const BANK_DELAY: Duration = Duration::from_millis(1100);
/// Users paying at once (3,700 that evening, at 1/100 scale).
const USERS: usize = 37;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct PayRequest {
    request_id: String,
    user: String,
    cents: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    charge_id: u64,
    cents: u64,
}

#[derive(Debug, thiserror::Error)]
enum PayError {
    #[error(transparent)]
    Idem(#[from] idem::Error),
    /// The worst case's bank, whose charges are rows in the database.
    #[error("the bank failed: {0}")]
    Bank(#[from] sqlx::Error),
}

/// The bank: slow, and it charges whatever it is asked to.
#[derive(Default)]
struct Bank {
    charges: Mutex<Vec<(String, u64)>>,
}

impl Bank {
    async fn charge(&self, user: &str, cents: u64) -> u64 {
        tokio::time::sleep(BANK_DELAY).await;
        let mut charges = self.charges.lock().unwrap();
        charges.push((user.to_owned(), cents));
        charges.len() as u64
    }
}

/// The SMS gateway: drops a message whose key it has seen, when it is given one.
#[derive(Default)]
struct Sms {
    seen: Mutex<HashSet<String>>,
    sent: Mutex<Vec<String>>,
}

impl Sms {
    fn send(&self, dedup_key: Option<String>, text: String) {
        if let Some(key) = dedup_key {
            if !self.seen.lock().unwrap().insert(key) {
                return;
            }
        }
        self.sent.lock().unwrap().push(text);
    }
}

struct PaymentService {
    bank: Bank,
    sms: Sms,
}

impl PaymentService {
    /// Charge once per `request_id`; duplicates wait for and get the first receipt.
    #[idempotent(key = "req.request_id", biz = "pay", ttl = "24h", mode = ReturnFirst, wait = "5s", payload = req)]
    async fn pay(&self, req: PayRequest) -> Result<Receipt, PayError> {
        self.charge(req).await
    }

    /// The same service as it was that evening.
    async fn pay_unprotected(&self, req: PayRequest) -> Result<Receipt, PayError> {
        self.charge(req).await
    }

    async fn charge(&self, req: PayRequest) -> Result<Receipt, PayError> {
        let charge_id = self.bank.charge(&req.user, req.cents).await;
        // The side effect reuses the call's key, so a retry does not text twice.
        let dedup_key = idem::context().map(|call| call.effect_key("sms"));
        self.sms
            .send(dedup_key, format!("{}: you paid ¥{}", req.user, req.cents / 100));
        Ok(Receipt {
            charge_id,
            cents: req.cents,
        })
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match run().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            // The error and each of its causes, in words.
            eprintln!("payment: {}", idem::error_chain(error.as_ref()));
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let protected = !args.iter().any(|arg| arg == "--without-idem");
    let url = match args.iter().position(|arg| arg == "--database-url") {
        Some(at) => args.get(at + 1).ok_or("--database-url needs a value")?.clone(),
        // A file in the system's temporary folder: the example runs from any folder,
        // under any `CARGO_TARGET_DIR`.
        None => format!(
            "sqlite://{}?mode=rwc",
            std::env::temp_dir().join("idem-payment.db").display()
        ),
    };
    let store = idem::sql::open(&url).await?;
    idem::install(store.clone());
    if args.iter().any(|arg| arg == "--bank-forgets-keys") {
        let outcome = match args.iter().position(|arg| arg == "--outcome") {
            Some(at) => evening::Outcome::parse(args.get(at + 1).ok_or("--outcome needs a value")?)?,
            None => evening::Outcome::Reconcile,
        };
        let options = evening::Options {
            outcome,
            crash_after_charge: args.iter().any(|arg| arg == "--crash-after-charge"),
            resume: args.iter().any(|arg| arg == "--resume"),
        };
        return evening::run(&url, options).await;
    }
    // Request ids of this run: the database keeps earlier runs' records (and would
    // rightly replay them).
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis();
    let service = Arc::new(PaymentService {
        bank: Bank::default(),
        sms: Sms::default(),
    });
    let started = Instant::now();
    let at = move || format!("22:00:{:04.1}", 3.0 + started.elapsed().as_secs_f64() * 10.0);

    println!(
        "{}",
        if protected {
            "With #[idempotent]:"
        } else {
            "Without idempotency (--without-idem):"
        }
    );
    println!(
        "{} {USERS} users press \"pay ¥199\"; the bank takes 11 s to answer",
        at()
    );

    let send = |user: usize, attempt: &'static str| {
        let service = service.clone();
        let req = PayRequest {
            request_id: format!("run{run}-user{user}"),
            user: format!("user-{user}"),
            cents: 19_900,
        };
        tokio::spawn(async move {
            let receipt = if protected {
                service.pay(req).await
            } else {
                service.pay_unprotected(req).await
            };
            (user, attempt, receipt)
        })
    };
    let mut requests = Vec::new();
    for user in 0..USERS {
        requests.push(send(user, "first click"));
    }
    tokio::time::sleep(Duration::from_millis(800)).await;
    println!("{} still spinning: every user clicks \"pay\" again", at());
    for user in 0..USERS {
        requests.push(send(user, "second click"));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    println!("{} the gateway times out and retries user-0's request twice", at());
    requests.push(send(0, "gateway retry"));
    requests.push(send(0, "gateway retry"));

    for request in requests {
        let (user, attempt, receipt) = request.await?;
        if user == 0 {
            println!("{} user-0 {attempt:>13} -> {:?}", at(), receipt?);
        } else {
            receipt?;
        }
    }

    let charges = service.bank.charges.lock().unwrap().clone();
    let charged_twice = (0..USERS)
        .filter(|user| charges.iter().filter(|(who, _)| *who == format!("user-{user}")).count() > 1)
        .count();
    let total: u64 = charges.iter().map(|(_, cents)| cents).sum();
    println!();
    println!(
        "bank charges: {} for {USERS} users, ¥{} in all",
        charges.len(),
        total / 100
    );
    println!("users charged more than once: {charged_twice}");
    println!("SMS sent: {}", service.sms.sent.lock().unwrap().len());
    if protected {
        assert_eq!(charges.len(), USERS, "one charge per user");
        println!("every retry got the first receipt; nobody paid twice.");
        println!();
        println!("idempotent_record rows written in {url} (3 of {USERS}):");
        println!(
            "{:<8} {:<22} {:<8} {:>5}  {:<34} expires",
            "biz_type", "idempotent_key", "status", "fence", "response_body"
        );
        for user in 0..3 {
            let key = format!("run{run}-user{user}");
            if let Some(row) = store.get("pay", &key).await? {
                let ttl_left = row
                    .expires_at
                    .duration_since(std::time::SystemTime::now())
                    .unwrap_or_default();
                let expires = format!("in {:.1} h", ttl_left.as_secs_f64() / 3600.0);
                println!(
                    "{:<8} {:<22} {:<8} {:>5}  {:<34} {expires}",
                    row.biz,
                    row.key,
                    row.status,
                    row.fence,
                    row.response_body.unwrap_or_default()
                );
            }
        }
    } else {
        println!("that is the incident: run without --without-idem to see the fix.");
    }
    Ok(())
}

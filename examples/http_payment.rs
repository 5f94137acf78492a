//! A payment API behind the `Idempotency-Key` layer: retries, double clicks and gateway
//! retries get the first response back, and the fake bank charges once.
//!
//! ```text
//! cargo run --example http_payment -- --listen 127.0.0.1:3000 --database-url sqlite://target/http_payment.db \
//!     --ttl 24h --bank-delay-ms 0
//! ```
//!
//! Every flag is optional (those are the defaults); `postgres://…` and `mysql://…` URLs
//! work too. Routes:
//!
//! - `POST /payments` `{"user": "ada", "cents": 1990}` with `Idempotency-Key: "…"` and
//!   `X-Tenant: …` → 201 `{"charge_id": 1, "cents": 1990}`; `cents > 1000000` → 402
//!   problem+json "card declined" (the handler ran: recorded and replayed); `cents <= 0`
//!   → 400 from validation before the handler (not recorded);
//! - `GET /bank/charges` → `{"count": N}`, the charges the fake bank made.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{FromRequest, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use idem::http::IdempotencyLayer;
use idem::Idempotent;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// The bank: slow, and counting what it charged.
struct Bank {
    delay: Duration,
    charges: AtomicU64,
}

impl Bank {
    async fn charge(&self) -> u64 {
        tokio::time::sleep(self.delay).await;
        self.charges.fetch_add(1, Ordering::SeqCst) + 1
    }
}

#[derive(Serialize)]
struct Receipt {
    charge_id: u64,
    cents: i64,
}

#[derive(Deserialize)]
struct Payment {
    #[allow(dead_code)]
    user: String,
    cents: i64,
}

/// Validation, before the handler: a 400 here is not recorded, so a corrected retry
/// with the same key runs.
struct ValidPayment(Payment);

impl<S: Send + Sync> FromRequest<S> for ValidPayment {
    type Rejection = Response;

    async fn from_request(request: Request, state: &S) -> Result<Self, Response> {
        let Json(payment) = Json::<Payment>::from_request(request, state)
            .await
            .map_err(IntoResponse::into_response)?;
        if payment.cents <= 0 {
            let problem = json!({
                "type": "urn:shop:invalid-amount",
                "title": "cents must be positive",
                "status": 400,
            });
            return Err(problem_response(StatusCode::BAD_REQUEST, problem));
        }
        Ok(ValidPayment(payment))
    }
}

fn problem_response(status: StatusCode, problem: serde_json::Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/problem+json")],
        problem.to_string(),
    )
        .into_response()
}

async fn pay(State(bank): State<Arc<Bank>>, ValidPayment(payment): ValidPayment) -> Response {
    // Validated: from here on a 4xx is this handler's answer, recorded and replayed.
    idem::http::started();
    if payment.cents > 1_000_000 {
        let declined = json!({"type": "urn:shop:card-declined", "title": "card declined", "status": 402});
        return problem_response(StatusCode::PAYMENT_REQUIRED, declined);
    }
    let charge_id = bank.charge().await;
    let receipt = Receipt {
        charge_id,
        cents: payment.cents,
    };
    (
        StatusCode::CREATED,
        [(header::LOCATION, format!("/payments/{charge_id}"))],
        Json(receipt),
    )
        .into_response()
}

async fn charges(State(bank): State<Arc<Bank>>) -> Json<serde_json::Value> {
    Json(json!({"count": bank.charges.load(Ordering::SeqCst)}))
}

/// The command line.
struct Options {
    listen: SocketAddr,
    database_url: String,
    ttl: Duration,
    bank_delay: Duration,
}

fn options() -> Result<Options, String> {
    let mut options = Options {
        listen: "127.0.0.1:3000".parse().unwrap(),
        database_url: format!("sqlite://{}/http_payment.db", target_dir()),
        ttl: Duration::from_secs(24 * 3600),
        bank_delay: Duration::ZERO,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--listen" => options.listen = value.parse().map_err(|e| format!("--listen {value}: {e}"))?,
            "--database-url" => options.database_url = value,
            "--ttl" => options.ttl = duration(&value).map_err(|e| format!("--ttl {value}: {e}"))?,
            "--bank-delay-ms" => {
                let millis = value.parse().map_err(|e| format!("--bank-delay-ms {value}: {e}"))?;
                options.bank_delay = Duration::from_millis(millis);
            }
            other => {
                return Err(format!(
                    "unknown flag {other}: use --listen, --database-url, --ttl, --bank-delay-ms"
                ))
            }
        }
    }
    Ok(options)
}

/// `90s`, `15m`, `24h`, `7d`.
fn duration(text: &str) -> Result<Duration, String> {
    let (number, unit) = text.split_at(text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len()));
    let n: u64 = number
        .parse()
        .map_err(|_| "expected a number then s, m, h or d".to_owned())?;
    let secs = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("unknown unit {unit:?}: use s, m, h or d")),
    };
    Ok(Duration::from_secs(n * secs))
}

/// Cargo's target directory, where the default SQLite file goes.
fn target_dir() -> String {
    std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/target").to_owned())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let options = match options() {
        Ok(options) => options,
        Err(problem) => {
            eprintln!("http_payment: {problem}");
            std::process::exit(2);
        }
    };
    let store = idem::sql::open(&options.database_url).await?;
    let payments = IdempotencyLayer::new(Idempotent::new("http.payments").store(store).ttl(options.ttl))
        .tenant(|request| Some(request.headers.get("x-tenant")?.to_str().ok()?.to_owned()))
        .replay_header(header::LOCATION);
    let bank = Arc::new(Bank {
        delay: options.bank_delay,
        charges: AtomicU64::new(0),
    });
    let app = Router::new()
        .route("/payments", post(pay))
        .route_layer(payments)
        .route("/bank/charges", get(charges))
        .with_state(bank);
    let listener = tokio::net::TcpListener::bind(options.listen).await?;
    println!(
        "http_payment: listening on http://{} (records in {})",
        listener.local_addr()?,
        options.database_url
    );
    axum::serve(listener, app).await?;
    Ok(())
}

//! A payment API behind the `Idempotency-Key` layer: retries, double clicks and gateway
//! retries get the first response back, and the fake bank charges once.
//!
//! ```text
//! cargo run --example http_payment -- --listen 127.0.0.1:3000 --database-url sqlite://…/http_payment.db \
//!     --ttl 24h --bank-delay-ms 0
//! ```
//!
//! Every flag is optional (those are the defaults; the SQLite file is in the system's
//! temporary folder); `postgres://…` and `mysql://…` URLs work too.
//!
//! Each caller's keys are its own, and a caller is *who* is signed in — not the bytes of
//! its cookies or token. The example's authentication (a middleware in front of the
//! layer) names the request's [`User`]: the account behind its `session` cookie (a
//! server-side session, made when the page is first rendered), or the subject of its
//! bearer token (`Authorization: Bearer ada.1`, `SUBJECT.SERIAL`: a stand-in for
//! verifying a real token and reading its subject, so `ada.2`, a refreshed token, is
//! still ada). The layer scopes keys by that user
//! (`.principal(|user: &User| user.id.clone())`), narrowed by the `X-Tenant` header when
//! one is sent; a request that is not signed in is refused (401), whatever else it
//! carries. An analytics cookie that changes between two clicks, or a token refreshed
//! before a retry, leaves the caller the same: one charge. Routes:
//!
//! - `GET /` → a payment page: a form (user, amount), a `pay` button and a `receipt`
//!   element. Each rendering mints the key its form sends (and signs the browser in
//!   with a session cookie when it has none), so double clicks and clicks while the
//!   first request runs are one payment, and a freshly rendered form is a new one;
//! - `POST /payments` `{"user": "ada", "cents": 1990}` with `Idempotency-Key` (a UUID,
//!   or a quoted string) → 201 `{"charge_id": 1, "cents": 1990}`; `cents > 1000000` →
//!   402 problem+json "card declined" (the handler ran: recorded and replayed);
//!   `cents <= 0` → 400 from validation before the handler (not recorded); another
//!   method → 405;
//! - `POST /statements` `{"lines": N}` with `Idempotency-Key` → `text/event-stream`,
//!   one event a line, one every 100 ms, passed on as it streams;
//! - `GET /bank/charges` → `{"count": N}`, the charges the fake bank made.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{FromRequest, Request, State};
use axum::http::{header, HeaderMap, HeaderName, StatusCode};
use axum::middleware::Next;
use axum::response::sse::{Event, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::StreamExt;
use idem::http::IdempotencyLayer;
use idem::Idempotent;
use serde::{Deserialize, Serialize};
use serde_json::json;

use idem_examples::bearer;

/// Who is signed in: what [`authenticate`] puts in a request's extensions, and what the
/// idempotency layer keeps each caller's keys apart by.
#[derive(Clone, Debug)]
struct User {
    id: String,
}

/// The server-side sessions: a `session` cookie's value → the user it signed in.
#[derive(Default)]
struct Sessions(Mutex<HashMap<String, String>>);

impl Sessions {
    fn user(&self, session: &str) -> Option<String> {
        self.0.lock().unwrap().get(session).cloned()
    }

    /// Sign a new visitor in: a session for a new account.
    fn open(&self) -> String {
        let session = random_id();
        let user = format!("visitor-{}", &random_id()[..8]);
        self.0.lock().unwrap().insert(session.clone(), user);
        session
    }
}

/// The value of the cookie `name` in `headers`.
fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|line| line.to_str().ok())
        .flat_map(|line| line.split(';'))
        .find_map(|pair| pair.trim().strip_prefix(name)?.strip_prefix('='))
}

/// The application's authentication, in front of the idempotency layer: a bearer token
/// (`SUBJECT.SERIAL`) names its subject, else the `session` cookie names its session's
/// user. A request it cannot sign in carries no [`User`], and the layer refuses it.
async fn authenticate(State(app): State<Arc<App>>, mut request: Request, next: Next) -> Response {
    let headers = request.headers();
    let user = bearer::subject(headers).or_else(|| app.sessions.user(cookie(headers, "session")?));
    if let Some(id) = user {
        request.extensions_mut().insert(User { id });
    }
    next.run(request).await
}

/// What the handlers share.
struct App {
    bank: Bank,
    sessions: Sessions,
}

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

async fn pay(State(app): State<Arc<App>>, ValidPayment(payment): ValidPayment) -> Response {
    // Validated: from here on a 4xx is this handler's answer, recorded and replayed.
    idem::http::started();
    if payment.cents > 1_000_000 {
        let declined = json!({"type": "urn:shop:card-declined", "title": "card declined", "status": 402});
        return problem_response(StatusCode::PAYMENT_REQUIRED, declined);
    }
    let charge_id = app.bank.charge().await;
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

#[derive(Deserialize)]
struct StatementRequest {
    lines: u32,
}

/// A statement as server-sent events, one line every 100 ms: streamed through the
/// layer as it is made.
async fn statement(
    Json(request): Json<StatementRequest>,
) -> Sse<impl futures::Stream<Item = Result<Event, Infallible>>> {
    idem::http::started();
    let lines = futures::stream::iter(1..=request.lines.min(1000)).then(|n| async move {
        if n > 1 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(Event::default().data(format!("line {n}")))
    });
    Sse::new(lines)
}

/// The payment page. Each rendering mints the key its form sends, and signs a browser
/// that has no session in (a session cookie for a new account): the user is the
/// caller, the form the request.
async fn page(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    let key = random_id();
    let html = PAGE.replace("{{KEY}}", &key);
    let signed_in = cookie(&headers, "session").is_some_and(|session| app.sessions.user(session).is_some());
    let mut response = Html(html).into_response();
    if !signed_in {
        let cookie = format!("session={}; Path=/; HttpOnly; SameSite=Strict", app.sessions.open());
        if let Ok(value) = cookie.parse() {
            response.headers_mut().insert(header::SET_COOKIE, value);
        }
    }
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, "no-store".parse().unwrap());
    response
}

/// A random UUID (v4), as a page or a client mints a key.
fn random_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

const PAGE: &str = r#"<!doctype html>
<html><head><meta charset="utf-8"><title>Pay</title></head>
<body>
<form id="payment">
  <label>User <input id="user" name="user" value="ada"></label>
  <label>Amount (cents) <input id="cents" name="cents" type="number" value="1990"></label>
  <button id="pay" type="submit">Pay</button>
</form>
<p id="receipt">not paid yet</p>
<script>
// The key of this form: minted when the page was rendered, the same for every click.
const key = "{{KEY}}";
document.getElementById("payment").addEventListener("submit", async (event) => {
  event.preventDefault();
  const body = JSON.stringify({
    user: document.getElementById("user").value,
    cents: Number(document.getElementById("cents").value),
  });
  // A click while the first request runs is its duplicate: the server answers 409 until
  // the first is done, then the first answer. Ask again after Retry-After.
  for (let attempt = 0; attempt < 50; attempt++) {
    const response = await fetch("/payments", {
      method: "POST",
      headers: {"Content-Type": "application/json", "Idempotency-Key": key},
      body,
    });
    if (response.status === 409) {
      const after = Number(response.headers.get("Retry-After") || "1");
      await new Promise((done) => setTimeout(done, Math.min(after, 1) * 300));
      continue;
    }
    const answer = await response.json();
    const replayed = response.headers.get("Idempotent-Replayed") === "true";
    const receipt = document.getElementById("receipt");
    receipt.textContent = response.ok
      ? `charge ${answer.charge_id}${replayed ? " (replayed)" : ""}`
      : `refused: ${answer.title}`;
    receipt.dataset.chargeId = response.ok ? String(answer.charge_id) : "";
    // Every answer this form was shown, in order, and how many clicks were answered.
    receipt.dataset.shown = `${receipt.dataset.shown || ""}${receipt.dataset.chargeId} `;
    receipt.dataset.answered = String(Number(receipt.dataset.answered || "0") + 1);
    return;
  }
});
</script>
</body></html>
"#;

async fn charges(State(app): State<Arc<App>>) -> Json<serde_json::Value> {
    Json(json!({"count": app.bank.charges.load(Ordering::SeqCst)}))
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
        database_url: format!(
            "sqlite://{}?mode=rwc",
            std::env::temp_dir().join("idem-http_payment.db").display()
        ),
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
    // Each caller's keys are its own: the user the authentication signed in, whatever
    // its cookies or token look like on a retry (narrowed by X-Tenant when sent); a
    // request that is not signed in → 401.
    let layer = |biz: &'static str| {
        IdempotencyLayer::new(Idempotent::new(biz).store(store.clone()).ttl(options.ttl))
            .principal(|user: &User| user.id.clone())
            .tenant_header(HeaderName::from_static("x-tenant"))
            .replay_header(header::LOCATION)
    };
    let app = Arc::new(App {
        bank: Bank {
            delay: options.bank_delay,
            charges: AtomicU64::new(0),
        },
        sessions: Sessions::default(),
    });
    // Each layer on its method router: another method gets axum's own 405. The
    // authentication runs first, outside the layers.
    let router = Router::new()
        .route("/", get(page))
        .route("/payments", post(pay).route_layer(layer("http.payments")))
        .route("/statements", post(statement).route_layer(layer("http.statements")))
        .route("/bank/charges", get(charges))
        .layer(axum::middleware::from_fn_with_state(app.clone(), authenticate))
        .with_state(app);
    let listener = tokio::net::TcpListener::bind(options.listen).await?;
    println!(
        "http_payment: listening on http://{} (records in {})",
        listener.local_addr()?,
        options.database_url
    );
    axum::serve(listener, router).await?;
    Ok(())
}

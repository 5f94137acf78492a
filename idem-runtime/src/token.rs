//! One-shot tokens against resubmission: the page gets a token when it is rendered,
//! the submission consumes it, and only the first consumer of a token gets through.
//!
//! ```
//! use std::{sync::Arc, time::Duration};
//! use idem_runtime::{token, Error, MemoryStore};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Error> {
//! let store = MemoryStore::new();
//! let issued = token::issue_on(&store, "order.submit", Duration::from_secs(600)).await?;
//! // ... rendered into the form; the form is submitted twice:
//! token::consume_on(&store, "order.submit", issued.as_str()).await?;
//! let again = token::consume_on(&store, "order.submit", issued.as_str()).await;
//! assert!(matches!(again, Err(Error::TokenSpent { .. })));
//! # Ok(()) }
//! ```
//!
//! A token is a record of its own, in the namespace `token.<biz>`, on any store: issued
//! as a `Processing` claim whose lease lasts the token's life, consumed by completing
//! that claim — the fenced write every store makes atomic, so of any number of
//! concurrent consumers exactly one gets `Ok`. A consumed token stays until its time
//! runs out and answers [`Error::TokenSpent`]; one never issued, or expired,
//! [`Error::TokenUnknown`].
//!
//! To require a token before a body runs, consume it first thing in the handler (or
//! the body), before any effect:
//!
//! ```ignore
//! async fn submit(form: Form) -> Result<Receipt, AppError> {
//!     idem::token::consume("order.submit", &form.token).await?; // a resubmission stops here
//!     place_order(form).await
//! }
//! ```
//!
//! The token is spent even if the body then fails; issue a new one with the error page
//! when the user should be able to try again. Combined with `#[idempotent(key =
//! form.token, ...)]` instead, a resubmission replays the first answer rather than
//! being refused.

use std::time::Duration;

use crate::claim::{Claim, ClaimOutcome, FenceCheck, Lease};
use crate::clock;
use crate::default_store::installed;
use crate::error::Error;
use crate::key::{biz_problem, TOKEN_NAMESPACE};
use crate::record::Status;
use crate::store::IdempotencyStore;

/// A token, as handed to the client: 32 hex digits from the operating system's
/// random source.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Token(String);

impl Token {
    /// The token's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What the record of a consumed token says.
const SPENT: &str = "\"spent\"";

/// 32 hex digits from the operating system's random source.
fn random_hex() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)?;
    Ok(crate::digest::hex(&bytes))
}

fn namespace(biz: &str) -> Result<String, Error> {
    let namespace = format!("{TOKEN_NAMESPACE}{biz}");
    match biz_problem(&namespace) {
        None => Ok(namespace),
        Some(reason) => Err(Error::InvalidBiz {
            biz: biz.to_owned(),
            reason: format!("as the token namespace {namespace:?}: {reason}"),
        }),
    }
}

fn store_error(biz: &str, token: &str, operation: &'static str, source: crate::StoreError) -> Error {
    Error::Store {
        biz: format!("token.{biz}"),
        key: token.to_owned(),
        operation,
        source,
    }
}

/// Issue a token for `biz` on the installed store, valid for `ttl`.
pub async fn issue(biz: &str, ttl: Duration) -> Result<Token, Error> {
    let store = installed().ok_or_else(|| Error::NoStore { biz: biz.to_owned() })?;
    issue_on(&*store, biz, ttl).await
}

/// Consume `token` for `biz` on the installed store: `Ok` for its first consumer only.
pub async fn consume(biz: &str, token: &str) -> Result<(), Error> {
    let store = installed().ok_or_else(|| Error::NoStore { biz: biz.to_owned() })?;
    consume_on(&*store, biz, token).await
}

/// Issue a token for `biz` on `store`, valid for `ttl` (positive, at most
/// [`MAX_DURATION`](crate::MAX_DURATION)).
pub async fn issue_on(store: &dyn IdempotencyStore, biz: &str, ttl: Duration) -> Result<Token, Error> {
    let namespace = namespace(biz)?;
    if let Some(reason) = crate::bounds::duration_problem("ttl", ttl) {
        return Err(Error::InvalidOption {
            biz: biz.to_owned(),
            option: "ttl",
            reason,
        });
    }
    let token = random_hex().map_err(|e| {
        store_error(
            biz,
            "",
            "issue",
            crate::StoreError::with_source("no random bytes for a token", e),
        )
    })?;
    let claim = Claim::new(&namespace, &token, clock::now(), ttl, ttl);
    match store
        .claim(&claim)
        .await
        .map_err(|e| store_error(biz, &token, "issue", e))?
    {
        ClaimOutcome::Acquired(_) => Ok(Token(token)),
        // 128 random bits met an existing record: never in practice, refused all the same.
        ClaimOutcome::Existing(_) => Err(store_error(
            biz,
            &token,
            "issue",
            crate::StoreError::new("a freshly drawn token already exists"),
        )),
    }
}

/// Consume `token` for `biz` on `store`: `Ok` for exactly one of any number of
/// consumers, [`Error::TokenSpent`] for the others and every later one,
/// [`Error::TokenUnknown`] when it was never issued for `biz` or has expired.
pub async fn consume_on(store: &dyn IdempotencyStore, biz: &str, token: &str) -> Result<(), Error> {
    let namespace = namespace(biz)?;
    let unknown = || Error::TokenUnknown { biz: biz.to_owned() };
    if crate::key::key_problem(token).is_some() {
        return Err(unknown());
    }
    let now = clock::now();
    let record = store
        .get(&namespace, token)
        .await
        .map_err(|e| store_error(biz, token, "consume", e))?
        .ok_or_else(unknown)?;
    if record.is_expired(now) {
        return Err(unknown());
    }
    if record.status != Status::Processing {
        return Err(Error::TokenSpent { biz: biz.to_owned() });
    }
    if record.lease_lapsed(now) {
        return Err(unknown());
    }
    // Kept spent until the token would have expired, so a resubmission says so.
    let left = record
        .expires_at
        .duration_since(now)
        .unwrap_or_default()
        .max(Duration::from_secs(1));
    match store
        .complete(&Lease::of(&record), SPENT, now, left)
        .await
        .map_err(|e| store_error(biz, token, "consume", e))?
    {
        FenceCheck::Held => Ok(()),
        FenceCheck::Lost => Err(Error::TokenSpent { biz: biz.to_owned() }),
    }
}

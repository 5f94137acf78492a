//! The `#[idempotent]` attribute of [`idem`](https://docs.rs/idem). Depend on `idem`,
//! which re-exports it together with the runtime it expands to.
//!
//! ```
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicU32, Ordering};
//! use idem::{idempotent, MemoryStore};
//!
//! #[derive(Debug, thiserror::Error)]
//! enum OrderError {
//!     #[error(transparent)]
//!     Idem(#[from] idem::Error),
//! }
//!
//! static SHIPPED: AtomicU32 = AtomicU32::new(0);
//!
//! #[idempotent(key = order_id, biz = "ship", ttl = "7d")]
//! async fn ship(order_id: &str) -> Result<String, OrderError> {
//!     SHIPPED.fetch_add(1, Ordering::SeqCst); // the courier is called once
//!     Ok(format!("parcel for {order_id}"))
//! }
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), OrderError> {
//! idem::install(Arc::new(MemoryStore::new()));
//! assert_eq!(ship("order-7").await?, ship("order-7").await?); // the second replays
//! assert_eq!(SHIPPED.load(Ordering::SeqCst), 1);
//! # Ok(()) }
//! ```
//!
//! This crate is a thin door: `args` parses and checks the options, `expand`
//! writes the code, both over `proc_macro2` so they are unit-tested without a compiler
//! run. Why `darling`: it reads the attribute's `name = value` list and collects every
//! mistake of one attribute, so all are reported at once; why `strsim`: it picks the
//! nearest option or variant name for "did you mean" hints; why `proc-macro-crate`: it
//! finds what the calling crate named its `idem` dependency, so a renamed dependency
//! needs no `crate = ...`.

use proc_macro::TokenStream;

mod args;
mod duration;
mod expand;
mod item;

/// Make an `async fn` idempotent: claim the key, run the body once, record the result;
/// a duplicate gets the first result replayed (or a clear error).
///
/// ```ignore
/// #[idempotent(key = "req.request_id", biz = "pay", ttl = "24h", mode = ReturnFirst)]
/// async fn pay(&self, req: PayRequest) -> Result<Receipt, PayError> { ... }
/// ```
///
/// The fn must be `async` and return `Result<T, E>`, with `T: Serialize +
/// DeserializeOwned` (the value replayed to duplicates, which must read back equal)
/// and `E: From<idem::Error>`. Methods (`&self`, `&mut self`), generics, `impl Trait`
/// and patterns in parameters work.
///
/// # Options
///
/// Options that take an expression read a string literal as the expression it holds:
/// `key = "req.id"` and `key = req.id` are the same.
///
/// - `key` (required): an expression over the parameters (and `self`), evaluated once by
///   reference before the body; its value must implement `Display`. Non-empty, at most
///   255 bytes, no control characters. `key = format!("{}:{}", user, order)`.
/// - `biz` (required): a string literal of 1 to 64 characters, the business namespace;
///   `(biz, key)` is unique. `biz = "pay"`.
/// - `ttl` (default `"24h"`): how long a finished record answers duplicates, counted
///   from completion. A duration string of `ms`, `s`, `m`, `h`, `d` parts: `"1h30m"`.
///   Positive, at most 100 years (checked at compile time). Or an expression of type
///   `std::time::Duration`, evaluated once per call (a retention that depends on the
///   request: `ttl = req.retention()`); out of range, the call fails with
///   `idem::Error::InvalidOption` before anything is claimed.
/// - `mode` (default `ReturnFirst`): a duplicate of a finished call gets the first `Ok`
///   value (`ReturnFirst`) or `idem::Error::Duplicate` (`Reject`).
/// - `lease` (default `"30s"`): how long a running claim is respected; a heartbeat renews
///   it while the body runs, and after a crash it lapses so a retry takes over.
/// - `clock_tolerance` (default: as long as `lease`): how far the store's clock may jump
///   ahead mid-body (a failover to a server whose clock is ahead) without a duplicate
///   taking the running claim over; a dead holder's claim is taken over `lease` plus this
///   after its last renewal. `"0s"` for none. At most 100 years.
/// - `on_error` (default `Release`): the body returned `Err`: delete the claim so a retry
///   runs again (`Release`), or record FAIL with the error's text so duplicates get
///   `idem::Error::PreviousFailed` until `ttl` (`Record`).
/// - `on_takeover` (default `rerun`): what a call that takes the record over from a
///   holder that died mid-body does before running the body again — for a body that is
///   one call to a service that does not deduplicate (hand it `Context::life_key()`).
///   `fail_closed`: fail with `idem::Error::OutcomeUnknown`, for this call and every
///   duplicate, until an operator settles the record (`idem settle BIZ KEY`).
///   `reconcile(lookup)`: ask `lookup` (a closure or fn from `idem::Intent` to a future
///   of `Result<idem::Lookup<T>, _>`, which may use the parameters) whether the effect
///   happened: `Done(value)` is recorded and returned, `NotDone` runs the body,
///   `CannotTell` fails closed. The intent is one more write before the body. Not with
///   `tx` (a compile error: nothing is taken over there).
/// - `outcome_policy` (default: none): `required` refuses every step of the operation
///   that does not say what to do when its outcome is unknown (`Step::reconcile` or
///   `Step::fail_closed`): it fails with `idem::Error::InvalidStep` before its effect
///   runs. For money-moving operations, so that nobody forgets. Not with `tx`.
/// - `wait` (default: none): a duplicate that finds the first call running waits up to
///   this long for its result instead of failing with `idem::Error::InProgress`.
/// - `payload` (default: none): an expression whose value is `Serialize`; its fingerprint
///   is stored, and the same key with another payload fails with
///   `idem::Error::PayloadMismatch`. Only the fingerprint is stored. `payload = "req"`.
/// - `keep_request` (default `false`): `true` keeps the payload's JSON in the record too
///   (up to `idem::MAX_REQUEST_BODY` bytes), for an operator reading the record and for
///   the HTTP layer's answer naming the fields that differ. Needs `payload`.
/// - `keep_answer` (default `true`): `false` keeps only a digest of the answer: a
///   duplicate learns the call succeeded (it never runs again) but gets
///   `idem::Error::AnswerNotKept` instead of the answer. For one-time credentials.
/// - `redact` (default: none): JSON pointers of fields of the answer (and of a kept
///   request) recorded as `"[redacted]"`: `redact = ["/card/number"]`. A duplicate gets
///   the answer with those fields so written, so they must accept a string (a `String`).
/// - `subject` (default: none): an expression (its value `Display`) naming the person the
///   call is about, so that `idem::subject::erase` (and `idem erase --subject`) can
///   remove what the record keeps of them; only a keyed hash of it is stored (the key is
///   `idem::subject::install_key`'s or `IDEM_SUBJECT_KEY`; without one the call fails
///   with `idem::Error::InvalidOption`). A retry of an erased call gets
///   `idem::Error::Erased` and never runs. `subject = "req.user_id"`.
/// - `after_expiry` (default `NewRequest`): what a retry that comes after `ttl` gets: a
///   new run (`NewRequest`), or for a window past the `ttl` `idem::Error::Expired` from a
///   body-less tombstone the purge keeps until the window ends (`Gone("30d")`).
/// - `store` (default: the store given to `idem::install`): `&S` for a `Clone` store,
///   `Arc<S>` or `Arc<dyn IdempotencyStore>`. `store = "self.store"`.
/// - `tx` (default: none): transactional mode. Names the parameter of type
///   `&mut sqlx::Transaction<'_, DB>` (SQLite, PostgreSQL, MySQL): the claim and the
///   record are written in that transaction and commit or roll back with the body's own
///   writes. `store`, if given, picks the table (a store of the same database); `lease`
///   does not apply (nothing is visible to others before the commit). A duplicate waits
///   for another open transaction holding the key as any statement of the connection
///   waits for a lock; `wait` bounds that wait instead (two more round trips).
///   `tx = tx`.
/// - `crate` (default `::idem`): where `idem` is when the dependency is renamed.
///   `crate = ::my_idem`.
///
/// Every mistake is a compile error on the tokens at fault, with the fix in words.
#[proc_macro_attribute]
pub fn idempotent(attr: TokenStream, item: TokenStream) -> TokenStream {
    let item2 = proc_macro2::TokenStream::from(item.clone());
    match attribute(attr.into(), item2.clone()) {
        Ok(tokens) => tokens.into(),
        // Keep the original fn so that the rest of the crate, and IDEs, still see it.
        Err(mut errors) => {
            errors.extend(item2);
            errors.into()
        }
    }
}

/// The expansion, or the errors to report (as `compile_error!`s, each on its tokens).
fn attribute(
    attr: proc_macro2::TokenStream,
    item: proc_macro2::TokenStream,
) -> Result<proc_macro2::TokenStream, proc_macro2::TokenStream> {
    let func = syn::parse2::<item::IdempotentFn>(item).map_err(|e| e.to_compile_error())?;
    item::check(&func).map_err(|e| e.to_compile_error())?;
    let args = args::Args::parse(attr).map_err(darling::Error::write_errors)?;
    item::check_store(&func, args.store.as_ref()).map_err(|e| e.to_compile_error())?;
    item::check_tx(&func, args.tx.as_ref()).map_err(|e| e.to_compile_error())?;
    Ok(expand::expand(args, func))
}

//! What `#[idempotent]` expands to. Not a public API: names here may change in any
//! release. The traits carry `#[diagnostic::on_unimplemented]` so that a misuse of the
//! attribute is reported in plain words at the user's tokens.

use std::fmt::Display;
use std::future::Future;
use std::ops::Deref;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::call::{call, CallStore};
use crate::store::OwnedStore;
use crate::{Error, IdempotencyStore};

/// The return type of an `#[idempotent]` fn.
#[diagnostic::on_unimplemented(
    message = "an `#[idempotent]` fn must return `Result<T, E>`, not `{Self}`",
    label = "this return type is not a `Result`",
    note = "the `Ok` value is what duplicates get replayed; return `Result<{Self}, YourError>`"
)]
pub trait IdempotentReturn: Sized {
    /// The `Ok` type.
    type Ok;
    /// The `Err` type.
    type Err;
    /// Into a plain `Result`.
    fn into_result(self) -> Result<Self::Ok, Self::Err>;
    /// From a plain `Result`.
    fn from_result(result: Result<Self::Ok, Self::Err>) -> Self;
}

impl<T, E> IdempotentReturn for Result<T, E> {
    type Ok = T;
    type Err = E;
    fn into_result(self) -> Self {
        self
    }
    fn from_result(result: Self) -> Self {
        result
    }
}

/// The `Ok` type of an `#[idempotent]` fn: stored as JSON and replayed.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be stored and replayed by `#[idempotent]`",
    label = "the `Ok` type must implement `Serialize` and `DeserializeOwned`",
    note = "the `Ok` value is stored and replayed to duplicates: on a type of your own, add \
            `#[derive(serde::Serialize, serde::Deserialize)]`",
    note = "it must own its data (`String`, not `&str`); for a type of another crate that does not \
            deserialize (such as `axum::Json<T>`), return the data (`T`) and wrap it in the caller"
)]
pub trait Replayable: Serialize + DeserializeOwned {}
impl<T: Serialize + DeserializeOwned> Replayable for T {}

/// The `Err` type of an `#[idempotent]` fn: must hold the library's own errors.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot carry an `idem::Error`",
    label = "the error type must implement `From<idem::Error>`",
    note = "on an error type of your own, add `impl From<idem::Error> for {Self}` (or a `#[from] idem::Error` \
            variant with thiserror)",
    note = "a type of another crate (`String`, `std::io::Error`) cannot be given that impl: return an error \
            enum of your own, `anyhow::Error` or `Box<dyn std::error::Error + Send + Sync>`"
)]
pub trait CarriesIdemError: From<Error> {}
impl<E: From<Error>> CarriesIdemError for E {}

/// The value of `key = ...`.
#[diagnostic::on_unimplemented(
    message = "the idempotency key must implement `Display`, and `{Self}` does not",
    label = "`key = ...` must evaluate to something printable",
    note = "use a field that is a string or a number, or build one with `format!(..)`"
)]
pub trait KeyValue {
    /// The key as text.
    fn key_string(&self) -> String;
}
impl<K: Display + ?Sized> KeyValue for K {
    fn key_string(&self) -> String {
        self.to_string()
    }
}

/// The value of `payload = ...`.
#[diagnostic::on_unimplemented(
    message = "the payload `{Self}` must implement `Serialize` to be fingerprinted",
    label = "`payload = ...` must evaluate to a `Serialize` value"
)]
pub trait PayloadValue: Serialize {}
impl<P: Serialize + ?Sized> PayloadValue for P {}

/// A store named by `store = ...`, borrowed or shared.
pub enum StoreHandle<'a> {
    /// From `&S`.
    Borrowed(&'a dyn OwnedStore),
    /// From `Arc<S>` or `Arc<dyn IdempotencyStore>` (a clone of the `Arc`, so the
    /// expression's owner is not borrowed while the body runs).
    Shared(Arc<dyn IdempotencyStore>),
}

impl Deref for StoreHandle<'_> {
    type Target = dyn OwnedStore;
    fn deref(&self) -> &Self::Target {
        match self {
            StoreHandle::Borrowed(store) => *store,
            StoreHandle::Shared(store) => store,
        }
    }
}

/// The value of `store = ...`.
#[diagnostic::on_unimplemented(
    message = "`store = ...` must be `&S`, `Arc<S>` or `Arc<dyn IdempotencyStore>`, not `{Self}`",
    label = "not a reference to or `Arc` of a `Clone` `IdempotencyStore`",
    note = "borrow the store (`store = &self.store`) or pass an `Arc` of it; a borrowed store must be `Clone` \
            (a cheap handle) so that a finished call is recorded even if its caller is dropped"
)]
pub trait StoreValue<'a> {
    /// The store to run on.
    fn handle(&self) -> StoreHandle<'a>;
}

impl<'a, S: IdempotencyStore + Clone> StoreValue<'a> for &'a S {
    fn handle(&self) -> StoreHandle<'a> {
        StoreHandle::Borrowed(*self)
    }
}
impl<S: IdempotencyStore> StoreValue<'_> for Arc<S> {
    fn handle(&self) -> StoreHandle<'static> {
        StoreHandle::Shared(self.clone())
    }
}
impl StoreValue<'_> for Arc<dyn IdempotencyStore> {
    fn handle(&self) -> StoreHandle<'static> {
        StoreHandle::Shared(self.clone())
    }
}

/// Evaluate `key = ...` (by reference).
pub fn key<K: KeyValue + ?Sized>(key: &K) -> String {
    key.key_string()
}

/// Add `payload = ...` (by reference) to the operation.
pub fn payload<P: PayloadValue + ?Sized>(op: Idempotent, payload: &P) -> Idempotent {
    op.payload(payload)
}

/// Set `ttl = expression` (a `Duration`, evaluated once per call); out of range, every
/// call fails with `Error::InvalidOption` before anything is claimed.
pub fn ttl(op: Idempotent, ttl: Duration) -> Idempotent {
    op.ttl(ttl)
}

/// Evaluate `store = ...` (by reference).
pub fn store<'a, S: StoreValue<'a> + ?Sized>(store: &S) -> StoreHandle<'a> {
    store.handle()
}

/// Run the body of an `#[idempotent]` fn; `describe` words an `Err` for a `FAIL` record.
///
/// A plain function, not an `async fn`: the body is handed on to the call's future,
/// not held in one more.
pub fn run<'a, R, F>(
    op: &'a Idempotent,
    store: Option<&'a dyn OwnedStore>,
    key: String,
    describe: fn(&R::Err) -> String,
    body: F,
) -> impl Future<Output = R> + use<'a, R, F>
where
    R: IdempotentReturn,
    R::Ok: Replayable,
    R::Err: CarriesIdemError,
    F: Future<Output = R>,
{
    let store = match store {
        Some(store) => CallStore::Given(store),
        None => CallStore::found(op),
    };
    let body = Mapped::new(body, R::into_result);
    Mapped::new(call(op, store, key, body, describe), R::from_result)
}

pin_project_lite::pin_project! {
    /// A future whose output is turned into another by a function, without an `async`
    /// block around it (which would hold the future twice).
    struct Mapped<F, O> where F: Future {
        #[pin]
        future: F,
        map: fn(F::Output) -> O,
    }
}

impl<F: Future, O> Mapped<F, O> {
    fn new(future: F, map: fn(F::Output) -> O) -> Self {
        Mapped { future, map }
    }
}

impl<F: Future, O> Future for Mapped<F, O> {
    type Output = O;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<O> {
        let this = self.project();
        this.future.poll(cx).map(*this.map)
    }
}

/// An error to describe in a `FAIL` record: by its `Display` text where it has one
/// (`(&&Describe(e)).describe()` picks [`DescribeByDisplay`]), else by its type.
pub struct Describe<'a, E>(pub &'a E);

/// The `Display` text of an error.
pub trait DescribeByDisplay {
    /// The description.
    fn describe(&self) -> String;
}
impl<E: Display> DescribeByDisplay for &Describe<'_, E> {
    fn describe(&self) -> String {
        self.0.to_string()
    }
}

/// The type of an error without `Display`.
pub trait DescribeByType {
    /// The description.
    fn describe(&self) -> String;
}
impl<E> DescribeByType for Describe<'_, E> {
    fn describe(&self) -> String {
        crate::call::failure_of_type::<E>()
    }
}

/// A duration of the attribute, checked at compile time against the rule the builder
/// applies at run time.
/// The attribute evaluates it in a `const _` item, so a value out of range stops the
/// build with `problem` (which names the option and its value).
pub const fn check_duration_ms(ms: u64, problem: &'static str) {
    if ms == 0 || ms > crate::bounds::MAX_DURATION_MS {
        panic!("{}", problem);
    }
}

/// The public items the expansion names, here so that it names only this module.
pub use crate::{AfterExpiry, Idempotent, Mode, OnError, Step};
pub use std::time::Duration;

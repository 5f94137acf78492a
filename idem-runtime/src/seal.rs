//! Records sealed at rest: every value idem stores about a call — the response, the
//! failure's text, the request if it is kept, each step's value and intent — encrypted
//! and authenticated with XChaCha20-Poly1305 before it reaches the store, and opened
//! when it is read back.
//!
//! ```
//! use std::sync::Arc;
//! use idem_runtime::seal::{SealKey, SealedStore, StaticKeyRing};
//! use idem_runtime::{Idempotent, IdempotencyStore, MemoryStore};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // In production the keys come from a secret store: `StaticKeyRing::from_env("IDEM_SEAL_KEYS")`.
//! let ring = StaticKeyRing::new(SealKey::new("k1", [7; 32])?, []);
//! let plain = Arc::new(MemoryStore::new());
//! let store = Arc::new(SealedStore::new(plain.clone(), ring));
//! let pay = Idempotent::new("pay").store(store.clone());
//! let receipt: String = pay.execute("order-7", async { Ok::<_, idem_runtime::Error>("card 4242".to_owned()) }).await?;
//! assert_eq!(receipt, "card 4242");
//! // What the store holds is sealed; what the call reads back is the receipt.
//! let stored = plain.get("pay", "order-7").await?.unwrap().response_body.unwrap();
//! assert!(stored.starts_with("idem:sealed:v1:k1:") && !stored.contains("4242"));
//! let again: String = pay.execute("order-7", async { Ok::<_, idem_runtime::Error>(String::new()) }).await?;
//! assert_eq!(again, "card 4242");
//! # Ok(()) }
//! ```
//!
//! A sealed value is `idem:sealed:v1:<key id>:<base64url of nonce and ciphertext>`. Its
//! associated data binds it to the table (the store's name for it, [`SealedStore::table`]),
//! the record's biz and key, the field it was written to and, for the answer and the
//! failure's text, the fence of the life that wrote them: a value copied onto another
//! record, into another field, or from an earlier life of the same key onto a later
//! one, does not open. A value that does not
//! open — moved, tampered with, sealed with a key the ring lacks, or not sealed at all —
//! fails the call with [`Error::Decode`](crate::Error::Decode) naming the biz and the
//! key: nothing is replayed, the body does not run, and the record is left as it is.
//!
//! Rotation: new values are sealed with the ring's current key; values sealed with a
//! retired key still open while the ring holds it. Rotate in two deploys: first give
//! every process the new key as a retired one (`OLD, NEW`), then make it current
//! (`NEW, OLD`); a process that has not yet heard of a key cannot open what another
//! sealed with it (a [`Error::Decode`](crate::Error::Decode), never a run). Drop the
//! old key once no record needs it: every record sealed with it has expired.
//!
//! The key ids, the record's status,
//! fence, instants, fingerprint, the step names and each step's marker (begun, outcome
//! unknown) stay in clear: the store needs them to claim, to expire and to list what
//! waits to be settled.
//!
//! The cipher is the RustCrypto `chacha20poly1305` crate's XChaCha20-Poly1305: its
//! 192-bit nonces are drawn at random (`getrandom`, the operating system's generator)
//! for every value, with no counter to keep across processes.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};

use crate::claim::{Claim, ClaimOutcome, FenceCheck, Lease};
use crate::default_store::IntoSharedStore;
use crate::error::StoreError;
use crate::pages::{RecordPages, Rewrite};
use crate::record::Record;
use crate::store::IdempotencyStore;
use crate::unknown;

/// What every sealed value begins with, before its key id.
pub const SEALED_PREFIX: &str = "idem:sealed:v1:";

/// The table name values are bound to unless [`SealedStore::table`] says another.
pub const DEFAULT_TABLE: &str = "idempotent_record";

const NONCE_LEN: usize = 24;

/// Why a key, a ring or a sealed value could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SealError {
    /// A key id is 1 to 32 letters, digits, `-` or `_`.
    #[error("invalid seal key id {0:?}: use 1 to 32 letters, digits, `-` or `_`")]
    KeyId(String),
    /// A key is 32 bytes (44 characters of standard or URL-safe base64).
    #[error("seal key `{id}`: {problem}; a key is 32 random bytes in base64 (`openssl rand -base64 32`)")]
    KeyBytes {
        /// The key's id.
        id: String,
        /// What was wrong.
        problem: String,
    },
    /// A ring's text (`id:base64` entries) could not be read.
    #[error("seal keys from {source_name}: {problem}; write `ID:BASE64KEY` entries, the current key first")]
    Ring {
        /// Where the text came from (a variable's or a file's name).
        source_name: String,
        /// What was wrong.
        problem: String,
    },
    /// The value was sealed with a key the ring does not hold.
    #[error("the value is sealed with key `{0}`, which the key ring does not hold (retired too early?)")]
    MissingKey(String),
    /// The value is not a sealed value, and unsealed values are refused.
    #[error("the value is not sealed, and this store reads only sealed values (`accept_unsealed` while migrating)")]
    NotSealed,
    /// The value does not open: tampered with, or written for another table, record or field.
    #[error("the sealed value does not open: tampered with, or moved from another table, record or field")]
    Tampered,
    /// The value is not in the sealed format.
    #[error("the sealed value is malformed: {0}")]
    Malformed(&'static str),
}

/// A 256-bit key and its id. Its `Debug` shows the id only.
#[derive(Clone)]
pub struct SealKey {
    id: String,
    cipher: XChaCha20Poly1305,
}

impl SealKey {
    /// The key `bytes` under `id` (1 to 32 letters, digits, `-` or `_`; it is stored
    /// in clear beside every value it seals).
    pub fn new(id: impl Into<String>, bytes: [u8; 32]) -> Result<Self, SealError> {
        let id = id.into();
        let valid =
            !id.is_empty() && id.len() <= 32 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !valid {
            return Err(SealError::KeyId(id));
        }
        Ok(Self {
            cipher: XChaCha20Poly1305::new(&bytes.into()),
            id,
        })
    }

    /// The key written in base64 (standard or URL-safe, padded or not) under `id`.
    pub fn from_base64(id: impl Into<String>, text: &str) -> Result<Self, SealError> {
        let id = id.into();
        let text = text.trim();
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(text)
            .or_else(|_| URL_SAFE_NO_PAD.decode(text.trim_end_matches('=')))
            .map_err(|error| SealError::KeyBytes {
                id: id.clone(),
                problem: format!("not base64 ({error})"),
            })?;
        let bytes: [u8; 32] = decoded.try_into().map_err(|decoded: Vec<u8>| SealError::KeyBytes {
            id: id.clone(),
            problem: format!("{} bytes, not 32", decoded.len()),
        })?;
        Self::new(id, bytes)
    }

    /// The key's id.
    pub fn id(&self) -> &str {
        &self.id
    }
}

impl fmt::Debug for SealKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SealKey").field("id", &self.id).finish_non_exhaustive()
    }
}

/// Where a [`SealedStore`] gets its keys: the application's secret store (a KMS, Vault,
/// a file a secret manager mounts). [`StaticKeyRing`] reads them from a variable or a
/// file; a ring of your own can fetch and cache them.
pub trait KeyRing: Send + Sync + fmt::Debug {
    /// The key new values are sealed with.
    fn current(&self) -> Result<Arc<SealKey>, SealError>;

    /// The key `id`, current or retired, when the ring holds it.
    fn key(&self, id: &str) -> Result<Option<Arc<SealKey>>, SealError>;
}

/// A ring of keys known at start-up: the current one, and the retired ones whose values
/// must still open.
#[derive(Debug, Clone)]
pub struct StaticKeyRing {
    current: Arc<SealKey>,
    keys: HashMap<String, Arc<SealKey>>,
}

impl StaticKeyRing {
    /// `current` seals; it and every key of `retired` open.
    pub fn new(current: SealKey, retired: impl IntoIterator<Item = SealKey>) -> Self {
        let current = Arc::new(current);
        let mut keys: HashMap<String, Arc<SealKey>> =
            retired.into_iter().map(|key| (key.id.clone(), Arc::new(key))).collect();
        keys.insert(current.id.clone(), current.clone());
        Self { current, keys }
    }

    /// The ring written as `ID:BASE64KEY` entries separated by commas, spaces or new
    /// lines (`#` starts a comment), the current key first; `source_name` names where
    /// the text came from in errors.
    pub fn parse(text: &str, source_name: &str) -> Result<Self, SealError> {
        let ring_error = |problem: String| SealError::Ring {
            source_name: source_name.to_owned(),
            problem,
        };
        let mut keys = Vec::new();
        for line in text.lines() {
            let line = line.split('#').next().unwrap_or_default();
            for entry in line.split([',', ' ', '\t']).filter(|entry| !entry.is_empty()) {
                let (id, key) = entry.split_once(':').ok_or_else(|| {
                    ring_error(format!(
                        "`{}…` has no `ID:` before its key",
                        &entry[..entry.len().min(4)]
                    ))
                })?;
                keys.push(SealKey::from_base64(id, key)?);
            }
        }
        let mut keys = keys.into_iter();
        let current = keys.next().ok_or_else(|| ring_error("no key".to_owned()))?;
        Ok(Self::new(current, keys))
    }

    /// The ring in the environment variable `name` (see [`parse`](Self::parse)).
    pub fn from_env(name: &str) -> Result<Self, SealError> {
        let text = std::env::var(name).map_err(|error| SealError::Ring {
            source_name: format!("${name}"),
            problem: error.to_string(),
        })?;
        Self::parse(&text, &format!("${name}"))
    }

    /// The ring in the file at `path` (see [`parse`](Self::parse)).
    pub fn from_file(path: impl AsRef<std::path::Path>) -> Result<Self, SealError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|error| SealError::Ring {
            source_name: path.display().to_string(),
            problem: error.to_string(),
        })?;
        Self::parse(&text, &path.display().to_string())
    }
}

impl KeyRing for StaticKeyRing {
    fn current(&self) -> Result<Arc<SealKey>, SealError> {
        Ok(self.current.clone())
    }

    fn key(&self, id: &str) -> Result<Option<Arc<SealKey>>, SealError> {
        Ok(self.keys.get(id).cloned())
    }
}

/// What [`SealedStore::rekey`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Rekeyed {
    /// Records read.
    pub scanned: u64,
    /// Records whose values were sealed again with the current key.
    pub resealed: u64,
    /// Records that held an older key's values but changed between the read and the
    /// rewrite (a call wrote them): left as they are.
    pub changed_meanwhile: u64,
}

/// A field of a record, as the associated data names it.
#[derive(Debug, Clone, Copy)]
enum Field<'a> {
    /// The answer, written by the holder of this fence.
    Response(u64),
    /// The failure's text, written by the holder of this fence.
    Error(u64),
    Request,
    /// A step's value or an intent: the entry's name in the steps map.
    Step(&'a str),
}

/// A store whose values are sealed: it wraps any store, and every store, the HTTP layer
/// and the consumers work through it unchanged.
///
/// Transactional mode (`tx = …`) would write its record in the body's transaction, past
/// this wrapper and in clear: a transactional call given a sealed store, or run with
/// one installed, fails with [`Error::InvalidOption`](crate::Error::InvalidOption)
/// before its body runs.
#[derive(Debug, Clone)]
pub struct SealedStore {
    inner: Arc<dyn IdempotencyStore>,
    ring: Arc<dyn KeyRing>,
    table: String,
    accept_unsealed: bool,
}

impl SealedStore {
    /// `inner`'s values sealed with `ring`'s keys, bound to the table
    /// [`DEFAULT_TABLE`].
    pub fn new(inner: impl IntoSharedStore, ring: impl KeyRing + 'static) -> Self {
        Self {
            inner: inner.into_shared(),
            ring: Arc::new(ring),
            table: DEFAULT_TABLE.to_owned(),
            accept_unsealed: false,
        }
    }

    /// Bind the values to the table `name` (the SQL table, the Redis key prefix): use
    /// the name the store writes to, so a value copied into another deployment's table
    /// does not open there. Changing it later makes every value sealed before unreadable.
    pub fn table(mut self, name: impl Into<String>) -> Self {
        self.table = name.into();
        self
    }

    /// Read values that are not sealed (written before sealing was turned on) as they
    /// are, while records from before age out (their `ttl`) or are re-sealed. Off by
    /// default: someone who can write the table could otherwise plant a plain answer.
    pub fn accept_unsealed(mut self, accept: bool) -> Self {
        self.accept_unsealed = accept;
        self
    }

    fn associated_data(&self, biz: &str, key: &str, field: Field<'_>) -> Vec<u8> {
        let (name, detail) = match field {
            Field::Response(fence) => ("response", fence.to_string()),
            Field::Error(fence) => ("error", fence.to_string()),
            Field::Request => ("request", String::new()),
            Field::Step(name) => ("step", name.to_owned()),
        };
        // NUL cannot occur in a table name, a biz, a key or a field name: the parts
        // cannot run into each other.
        format!("idem.sealed.v1\0{}\0{biz}\0{key}\0{name}\0{detail}", self.table).into_bytes()
    }

    /// `value` sealed for `field` of the record `(biz, key)`.
    fn seal(&self, biz: &str, key: &str, field: Field<'_>, value: &str) -> Result<String, StoreError> {
        let sealing_key = self
            .ring
            .current()
            .map_err(|error| StoreError::with_source("no key to seal with", error))?;
        let mut nonce = [0u8; NONCE_LEN];
        getrandom::fill(&mut nonce)
            .map_err(|error| StoreError::new(format!("no random nonce to seal with: {error}")))?;
        let aad = self.associated_data(biz, key, field);
        let sealed = sealing_key
            .cipher
            .encrypt(
                XNonce::from_slice(&nonce),
                Payload {
                    msg: value.as_bytes(),
                    aad: &aad,
                },
            )
            .map_err(|_| StoreError::new("sealing failed"))?;
        let mut bytes = Vec::with_capacity(NONCE_LEN + sealed.len());
        bytes.extend_from_slice(&nonce);
        bytes.extend_from_slice(&sealed);
        Ok(format!(
            "{SEALED_PREFIX}{}:{}",
            sealing_key.id,
            URL_SAFE_NO_PAD.encode(bytes)
        ))
    }

    /// The value `stored` in `field` of the record `(biz, key)`, opened.
    fn open(&self, biz: &str, key: &str, field: Field<'_>, stored: &str) -> Result<String, SealError> {
        let Some(sealed) = stored.strip_prefix(SEALED_PREFIX) else {
            return if self.accept_unsealed {
                Ok(stored.to_owned())
            } else {
                Err(SealError::NotSealed)
            };
        };
        let (id, text) = sealed.split_once(':').ok_or(SealError::Malformed("no key id"))?;
        let opening_key = self.ring.key(id)?.ok_or_else(|| SealError::MissingKey(id.to_owned()))?;
        let bytes = URL_SAFE_NO_PAD
            .decode(text)
            .map_err(|_| SealError::Malformed("not base64url"))?;
        if bytes.len() < NONCE_LEN {
            return Err(SealError::Malformed("too short"));
        }
        let (nonce, ciphertext) = bytes.split_at(NONCE_LEN);
        let aad = self.associated_data(biz, key, field);
        let opened = opening_key
            .cipher
            .decrypt(
                XNonce::from_slice(nonce),
                Payload {
                    msg: ciphertext,
                    aad: &aad,
                },
            )
            .map_err(|_| SealError::Tampered)?;
        String::from_utf8(opened).map_err(|_| SealError::Malformed("not UTF-8"))
    }

    /// The steps map `steps` with every entry sealed or opened by `change`. An entry's
    /// marker (an intent, an outcome unknown, a value that could not be recorded) stays
    /// in clear before it, so the store can still list what waits to be settled; what
    /// follows the marker is `change`d.
    fn each_step(
        &self,
        steps: &str,
        mut change: impl FnMut(&str, &str) -> Result<String, StoreError>,
    ) -> Result<String, StoreError> {
        let map: BTreeMap<String, String> = serde_json::from_str(steps)
            .map_err(|error| StoreError::with_source("the record's steps are not a JSON object of strings", error))?;
        let mut changed = BTreeMap::new();
        for (name, entry) in &map {
            let (marker, value) = unknown::split_marker(entry);
            changed.insert(name.clone(), format!("{marker}{}", change(name, value)?));
        }
        serde_json::to_string(&changed).map_err(|error| StoreError::with_source("the steps do not serialize", error))
    }

    /// `record`, as the wrapped store holds it, with every value sealed with another key
    /// than the ring's current one opened and sealed again with the current key (and,
    /// with [`accept_unsealed`](Self::accept_unsealed), every value not sealed yet
    /// sealed); `None` when there is nothing to change. A value that does not open is
    /// an error ([`StoreError::is_unreadable`]).
    pub fn reseal(&self, record: &Record) -> Result<Option<Record>, StoreError> {
        let current = self
            .ring
            .current()
            .map_err(|error| StoreError::with_source("no key to seal with", error))?;
        let (biz, key) = (record.biz.as_str(), record.key.as_str());
        let mut changed = false;
        let mut again = |field: Field<'_>, stored: &str| -> Result<String, StoreError> {
            let sealed_with = stored
                .strip_prefix(SEALED_PREFIX)
                .and_then(|sealed| sealed.split_once(':'))
                .map(|(id, _)| id);
            if sealed_with == Some(current.id()) {
                return Ok(stored.to_owned());
            }
            let opened = self
                .open(biz, key, field, stored)
                .map_err(|error| StoreError::unreadable(biz, key, error))?;
            changed = true;
            self.seal(biz, key, field, &opened)
        };
        let mut resealed = record.clone();
        let fields = [
            (Field::Response(record.fence), &mut resealed.response_body),
            (Field::Error(record.fence), &mut resealed.error_message),
            (Field::Request, &mut resealed.request_body),
        ];
        for (field, value) in fields {
            if let Some(stored) = value.as_deref() {
                *value = Some(again(field, stored)?);
            }
        }
        if let Some(steps) = record.steps.as_deref() {
            resealed.steps = Some(self.each_step(steps, |name, value| again(Field::Step(name), value))?);
        }
        Ok(changed.then_some(resealed))
    }

    /// Re-seal, with the ring's current key, every record of `pages` — the store this
    /// one wraps, walked — that holds a value sealed with another key: `batch` records
    /// at a time, each rewritten only if it is still as it was read (a call that wrote
    /// it meanwhile is left alone, and counted); `progress` is told after each page.
    ///
    /// Rotate in three steps: give every process the new key as current (the old one
    /// retired, still opening), run this, then drop the old key from the rings. A
    /// record written meanwhile by a process still sealing with the old key is counted
    /// in [`Rekeyed::changed_meanwhile`] or sealed with the old key: run it again once
    /// every process seals with the new one, until it re-seals nothing.
    pub async fn rekey(
        &self,
        pages: &dyn RecordPages,
        batch: u32,
        mut progress: impl FnMut(&Rekeyed) + Send,
    ) -> Result<Rekeyed, StoreError> {
        let mut done = Rekeyed::default();
        let mut cursor = String::new();
        loop {
            let page = pages.page(&cursor, batch.max(1)).await?;
            let mut rewrites = Vec::new();
            for record in page.records {
                done.scanned += 1;
                if let Some(with) = self.reseal(&record)? {
                    rewrites.push(Rewrite { read: record, with });
                }
            }
            let replaced = pages.replace_values(&rewrites).await?;
            done.resealed += replaced;
            done.changed_meanwhile += rewrites.len() as u64 - replaced;
            progress(&done);
            match page.next {
                Some(next) => cursor = next,
                None => return Ok(done),
            }
        }
    }

    /// `record`, as the wrapped store returned it, with every sealed value opened: for a
    /// tool that lists records with the store's own queries (`idem unknown`, `idem
    /// failed`) and shows them. A value that does not open is an error
    /// ([`StoreError::is_unreadable`]).
    pub fn open_record(&self, mut record: Record) -> Result<Record, StoreError> {
        let (biz, key) = (record.biz.clone(), record.key.clone());
        let unreadable = |error: SealError| StoreError::unreadable(&biz, &key, error);
        let open = |field, value: &mut Option<String>| -> Result<(), StoreError> {
            if let Some(stored) = value.take() {
                *value = Some(self.open(&biz, &key, field, &stored).map_err(unreadable)?);
            }
            Ok(())
        };
        open(Field::Response(record.fence), &mut record.response_body)?;
        open(Field::Error(record.fence), &mut record.error_message)?;
        open(Field::Request, &mut record.request_body)?;
        if let Some(steps) = record.steps.take() {
            record.steps = Some(self.each_step(&steps, |name, value| {
                self.open(&biz, &key, Field::Step(name), value).map_err(unreadable)
            })?);
        }
        Ok(record)
    }
}

#[async_trait]
impl IdempotencyStore for SealedStore {
    async fn claim(&self, claim: &Claim<'_>) -> Result<ClaimOutcome, StoreError> {
        let sealed_request = claim
            .request_body
            .map(|request| self.seal(claim.biz, claim.key, Field::Request, request))
            .transpose()?;
        let mut sealed = *claim;
        sealed.request_body = sealed_request.as_deref();
        match self.inner.claim(&sealed).await? {
            ClaimOutcome::Existing(record) => Ok(ClaimOutcome::Existing(self.open_record(record)?)),
            acquired => Ok(acquired),
        }
    }

    async fn renew(&self, lease: &Lease, now: SystemTime, lease_for: Duration) -> Result<FenceCheck, StoreError> {
        self.inner.renew(lease, now, lease_for).await
    }

    async fn complete(
        &self,
        lease: &Lease,
        response: &str,
        now: SystemTime,
        ttl: Duration,
    ) -> Result<FenceCheck, StoreError> {
        let sealed = self.seal(&lease.biz, &lease.key, Field::Response(lease.fence), response)?;
        self.inner.complete(lease, &sealed, now, ttl).await
    }

    async fn fail(
        &self,
        lease: &Lease,
        message: &str,
        now: SystemTime,
        ttl: Duration,
    ) -> Result<FenceCheck, StoreError> {
        let sealed = self.seal(&lease.biz, &lease.key, Field::Error(lease.fence), message)?;
        self.inner.fail(lease, &sealed, now, ttl).await
    }

    async fn release(&self, lease: &Lease) -> Result<FenceCheck, StoreError> {
        self.inner.release(lease).await
    }

    async fn record_steps(&self, lease: &Lease, steps: &str) -> Result<FenceCheck, StoreError> {
        let sealed = self.each_step(steps, |name, value| {
            self.seal(&lease.biz, &lease.key, Field::Step(name), value)
        })?;
        self.inner.record_steps(lease, &sealed).await
    }

    fn seals(&self) -> bool {
        true
    }

    async fn watch(&self, biz: &str, key: &str) -> Result<Option<crate::notice::Notice>, StoreError> {
        self.inner.watch(biz, key).await
    }

    async fn get(&self, biz: &str, key: &str) -> Result<Option<Record>, StoreError> {
        self.inner
            .get(biz, key)
            .await?
            .map(|record| self.open_record(record))
            .transpose()
    }

    async fn purge_expired(&self, now: SystemTime, limit: u64) -> Result<u64, StoreError> {
        self.inner.purge_expired(now, limit).await
    }

    /// A subject's hash is keyed already: it is stored as it is.
    async fn erase_subject(&self, subject: &str) -> Result<u64, StoreError> {
        self.inner.erase_subject(subject).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(ring: StaticKeyRing) -> SealedStore {
        SealedStore::new(Arc::new(crate::MemoryStore::new()), ring)
    }

    fn key(id: &str, byte: u8) -> SealKey {
        SealKey::new(id, [byte; 32]).unwrap()
    }

    #[test]
    fn a_value_opens_only_where_it_was_sealed() {
        let sealed_store = store(StaticKeyRing::new(key("k1", 1), []));
        let sealed = sealed_store
            .seal("pay", "o-1", Field::Response(1), "{\"cents\":100}")
            .unwrap();
        assert!(
            sealed.starts_with("idem:sealed:v1:k1:") && !sealed.contains("cents"),
            "{sealed}"
        );
        assert_eq!(
            sealed_store.open("pay", "o-1", Field::Response(1), &sealed).unwrap(),
            "{\"cents\":100}"
        );
        for (biz, key, field) in [
            ("pay", "o-2", Field::Response(1)),
            ("refund", "o-1", Field::Response(1)),
            ("pay", "o-1", Field::Error(1)),
            ("pay", "o-1", Field::Response(2)),
            ("pay", "o-1", Field::Step("charge")),
        ] {
            assert_eq!(
                sealed_store.open(biz, key, field, &sealed),
                Err(SealError::Tampered),
                "{biz} {key} {field:?}"
            );
        }
        let elsewhere = store(StaticKeyRing::new(key("k1", 1), [])).table("other_table");
        assert_eq!(
            elsewhere.open("pay", "o-1", Field::Response(1), &sealed),
            Err(SealError::Tampered)
        );
        // A character of the ciphertext flipped: not the last, whose unused bits a
        // strict base64 decoder refuses before the cipher could.
        let mut flipped = sealed.clone().into_bytes();
        let inside = flipped.len() - 2;
        flipped[inside] = if flipped[inside] == b'A' { b'B' } else { b'A' };
        let flipped = String::from_utf8(flipped).unwrap();
        assert_eq!(
            sealed_store.open("pay", "o-1", Field::Response(1), &flipped),
            Err(SealError::Tampered)
        );
    }

    #[test]
    fn retired_keys_open_and_missing_or_unsealed_values_are_refused() {
        let old = store(StaticKeyRing::new(key("k1", 1), []));
        let sealed = old.seal("pay", "o-1", Field::Response(1), "1").unwrap();
        let rotated = store(StaticKeyRing::new(key("k2", 2), [key("k1", 1)]));
        assert_eq!(rotated.open("pay", "o-1", Field::Response(1), &sealed).unwrap(), "1");
        assert!(rotated
            .seal("pay", "o-1", Field::Response(1), "1")
            .unwrap()
            .starts_with("idem:sealed:v1:k2:"));
        let retired = store(StaticKeyRing::new(key("k2", 2), []));
        assert_eq!(
            retired.open("pay", "o-1", Field::Response(1), &sealed),
            Err(SealError::MissingKey("k1".into()))
        );
        assert_eq!(
            retired.open("pay", "o-1", Field::Response(1), "1"),
            Err(SealError::NotSealed)
        );
        let migrating = store(StaticKeyRing::new(key("k2", 2), [])).accept_unsealed(true);
        assert_eq!(migrating.open("pay", "o-1", Field::Response(1), "1").unwrap(), "1");
    }

    #[test]
    fn a_ring_reads_from_text_and_says_what_is_wrong() {
        let ring = StaticKeyRing::parse(
            "# current first\nk2:AgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgI=\nk1:AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE",
            "test",
        )
        .unwrap();
        assert_eq!(ring.current().unwrap().id(), "k2");
        assert!(ring.key("k1").unwrap().is_some());
        assert!(matches!(StaticKeyRing::parse("", "test"), Err(SealError::Ring { .. })));
        assert!(matches!(
            StaticKeyRing::parse("k1:AQID", "test"),
            Err(SealError::KeyBytes { .. })
        ));
        assert!(matches!(
            StaticKeyRing::parse("AQID", "test"),
            Err(SealError::Ring { .. })
        ));
        assert!(matches!(SealKey::new("a b", [0; 32]), Err(SealError::KeyId(_))));
        assert!(!format!("{:?}", key("k1", 9)).contains('9'));
    }
}

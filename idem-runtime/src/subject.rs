//! Data subjects: the person a call is about, and erasing what the records keep of them.
//!
//! An operation names the subject of each call ([`Idempotent::subject`](crate::Idempotent::subject),
//! the attribute's `subject = "req.user_id"`). The record stores only a keyed hash of
//! it (HMAC-SHA256 under a [`SubjectKey`] the application holds), never the subject:
//! someone who reads the table cannot tell whose records they are, nor test a guess,
//! without the key. [`erase`] (and `idem erase --subject`) strips every finished record
//! of the subject, of every biz, to a tombstone: the request, the answer, the failure's
//! text and the steps are removed; the status, fence and instants stay, so a retry of
//! an erased call still does not run again and gets [`Error::Erased`](crate::Error::Erased)
//! (HTTP 410).
//!
//! ```
//! use std::sync::Arc;
//! use idem_runtime::subject::{self, SubjectKey};
//! use idem_runtime::{Error, Idempotent, MemoryStore};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // In production the key comes from a secret store: `SubjectKey::from_env("IDEM_SUBJECT_KEY")`.
//! let key = SubjectKey::new([9; 32]);
//! subject::install_key(key.clone());
//! let store = Arc::new(MemoryStore::new());
//! let pay = Idempotent::new("pay").store(store.clone());
//! let receipt: String = pay.clone().subject("user-42")
//!     .execute("order-7", async { Ok::<_, Error>("receipt for Ada".to_owned()) }).await?;
//! assert_eq!(subject::erase(store.as_ref(), &key, "user-42").await?, 1);
//! // The retry of the erased call neither runs nor gets the answer back.
//! let again = pay.subject("user-42").execute("order-7", async { Ok::<_, Error>(String::new()) }).await;
//! assert!(matches!(again, Err(Error::Erased { .. })));
//! # Ok(()) }
//! ```
//!
//! A call still running when its subject is erased is not found (its record takes the
//! subject with its outcome): erase again once it has finished. A
//! [`CachedStore`](crate::CachedStore) in another process may answer from its copy of
//! an erased record until that copy's own time runs out; the erasing process's cache is
//! emptied.
//!
//! `hmac` (RustCrypto) computes the keyed hash.

use std::fmt;
use std::sync::{Arc, OnceLock, RwLock};

use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::error::StoreError;
use crate::store::IdempotencyStore;

/// The variable a key is read from when none was [installed](install_key).
pub const SUBJECT_KEY_VAR: &str = "IDEM_SUBJECT_KEY";

/// The secret a subject's keyed hash is computed with: 32 bytes. Its `Debug` shows
/// nothing of it. Keep it as long as any record names a subject hashed with it: a new
/// key hashes the same subject to another value, which finds none of the older records.
#[derive(Clone)]
pub struct SubjectKey {
    bytes: [u8; 32],
}

impl fmt::Debug for SubjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SubjectKey(..)")
    }
}

/// A subject key could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("subject key from {source_name}: {problem}; a key is 32 random bytes in base64 (`openssl rand -base64 32`)")]
pub struct SubjectKeyError {
    /// Where the text came from.
    pub source_name: String,
    /// What was wrong.
    pub problem: String,
}

impl SubjectKey {
    /// The key `bytes`.
    pub fn new(bytes: [u8; 32]) -> Self {
        Self { bytes }
    }

    /// The key written in base64 (standard or URL-safe, padded or not).
    pub fn from_base64(text: &str) -> Result<Self, SubjectKeyError> {
        let problem = |problem: String| SubjectKeyError {
            source_name: "base64 text".to_owned(),
            problem,
        };
        let text = text.trim();
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(text)
            .or_else(|_| base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(text.trim_end_matches('=')))
            .map_err(|e| problem(format!("not base64 ({e})")))?;
        let bytes: [u8; 32] = decoded
            .try_into()
            .map_err(|d: Vec<u8>| problem(format!("{} bytes, not 32", d.len())))?;
        Ok(Self::new(bytes))
    }

    /// The key in the variable `var`; `None` when it is unset.
    pub fn from_env(var: &str) -> Result<Option<Self>, SubjectKeyError> {
        match std::env::var(var) {
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(e) => Err(SubjectKeyError {
                source_name: var.to_owned(),
                problem: e.to_string(),
            }),
            Ok(text) => Self::from_base64(&text).map(Some).map_err(|e| SubjectKeyError {
                source_name: var.to_owned(),
                problem: e.problem,
            }),
        }
    }

    /// The keyed hash of `subject` as records store it: HMAC-SHA256, 64 hex digits.
    pub fn hash(&self, subject: &str) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.bytes).expect("HMAC takes a key of any length");
        mac.update(subject.as_bytes());
        crate::digest::hex(&mac.finalize().into_bytes())
    }
}

fn slot() -> &'static RwLock<Option<Arc<SubjectKey>>> {
    static SLOT: OnceLock<RwLock<Option<Arc<SubjectKey>>>> = OnceLock::new();
    SLOT.get_or_init(RwLock::default)
}

/// Install `key` for every operation of this process that names a subject.
pub fn install_key(key: SubjectKey) {
    *slot().write().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(key));
}

/// The installed key, or else the one in [`SUBJECT_KEY_VAR`] (read once and kept);
/// why there is none otherwise.
pub fn installed_key() -> Result<Arc<SubjectKey>, String> {
    if let Some(key) = slot().read().unwrap_or_else(|p| p.into_inner()).clone() {
        return Ok(key);
    }
    static FROM_ENV: OnceLock<Result<Option<Arc<SubjectKey>>, String>> = OnceLock::new();
    let from_env = FROM_ENV.get_or_init(|| {
        SubjectKey::from_env(SUBJECT_KEY_VAR)
            .map(|key| key.map(Arc::new))
            .map_err(|e| e.to_string())
    });
    match from_env {
        Ok(Some(key)) => Ok(key.clone()),
        Ok(None) => Err(format!(
            "a subject is named but there is no subject key to hash it with: install one with \
             `idem::subject::install_key` or set {SUBJECT_KEY_VAR} (32 random bytes in base64)"
        )),
        Err(problem) => Err(problem.clone()),
    }
}

/// Erase the data subject `subject` from `store`: every finished record whose subject
/// hash under `key` matches is stripped to an erased tombstone
/// ([`IdempotencyStore::erase_subject`]). Returns how many records were erased.
pub async fn erase(store: &dyn IdempotencyStore, key: &SubjectKey, subject: &str) -> Result<u64, StoreError> {
    store.erase_subject(&key.hash(subject)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_is_keyed_and_stable() {
        let (a, b) = (SubjectKey::new([1; 32]), SubjectKey::new([2; 32]));
        assert_eq!(a.hash("user-42"), a.hash("user-42"));
        assert_eq!(a.hash("user-42").len(), 64);
        assert_ne!(a.hash("user-42"), b.hash("user-42"), "another key, another hash");
        assert_ne!(a.hash("user-42"), a.hash("user-43"));
        assert!(!a.hash("user-42").contains("user"));
        // RFC 4231 test case 2 (HMAC pads a short key with zeros, as this one is).
        let mut jefe = [0u8; 32];
        jefe[..4].copy_from_slice(b"Jefe");
        assert_eq!(
            SubjectKey::new(jefe).hash("what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn keys_are_read_from_base64_with_clear_errors() {
        let text = base64::engine::general_purpose::STANDARD.encode([7u8; 32]);
        assert_eq!(
            SubjectKey::from_base64(&text).unwrap().hash("x"),
            SubjectKey::new([7; 32]).hash("x")
        );
        let short = SubjectKey::from_base64("AAAA").unwrap_err().to_string();
        assert!(
            short.contains("3 bytes, not 32") && short.contains("openssl rand"),
            "{short}"
        );
        assert!(SubjectKey::from_base64("not base64!").is_err());
        assert_eq!(format!("{:?}", SubjectKey::new([7; 32])), "SubjectKey(..)");
    }
}

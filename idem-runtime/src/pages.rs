//! Every record of a store, a page at a time, and a record's values rewritten in
//! place: what maintenance that touches every record needs (re-sealing with a new key,
//! [`seal::rekey`](crate::seal)).

use async_trait::async_trait;

use crate::error::StoreError;
use crate::record::Record;

/// One page of records, and where the next begins.
#[derive(Debug, Clone, Default)]
pub struct Page {
    /// The records of this page.
    pub records: Vec<Record>,
    /// The cursor of the next page; `None` after the last.
    pub next: Option<String>,
}

impl Page {
    /// A page of `records` (at most `limit`) in `(biz, key)` order, as a store that
    /// walks its records by key gives it: the next page begins after its last record,
    /// unless it was not full.
    pub fn by_key(records: Vec<Record>, limit: u32) -> Self {
        let next = (records.len() == limit as usize)
            .then(|| records.last().map(|r| format!("{}\n{}", r.biz, r.key)))
            .flatten();
        Page { records, next }
    }

    /// The `(biz, key)` a cursor of [`by_key`](Self::by_key) pages begins after; `None`
    /// for the first page. (The new line between them is in neither: a biz or a key
    /// holds no control character.)
    pub fn after_key(cursor: &str) -> Option<(&str, &str)> {
        cursor.split_once('\n')
    }
}

/// A store whose records can be walked and whose values can be rewritten in place.
#[async_trait]
pub trait RecordPages: Send + Sync {
    /// About `limit` records from `cursor` on (`""` for the first page), in an order of
    /// the store's, each record once in a whole walk (a record written meanwhile may
    /// or may not be in it).
    async fn page(&self, cursor: &str, limit: u32) -> Result<Page, StoreError>;

    /// For each rewrite, write `with`'s request, answer, failure text and steps over
    /// `read`'s, if the record still is as `read` (same life, fence, status and values);
    /// how many were written. Nothing else of a record changes. A store that can writes
    /// them in one transaction.
    async fn replace_values(&self, rewrites: &[Rewrite]) -> Result<u64, StoreError>;
}

/// A record's values to be rewritten: the record as it was read, and with its new
/// values.
#[derive(Debug, Clone)]
pub struct Rewrite {
    /// The record as it was read.
    pub read: Record,
    /// The same record with the values to write.
    pub with: Record,
}

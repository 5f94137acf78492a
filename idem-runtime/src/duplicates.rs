//! How often a store's claims meet a record already there: a hint for a store that has
//! more than one way to start a claim. Where most keys are new, the plain claim (an
//! insert) costs least; where claims often meet records, a claim that also reads the
//! record in its way answers a duplicate in the same round trip; where nearly every
//! claim meets a record (a storm of retries), a plain read of the record first is the
//! cheapest replay there is, and costs a new key a round trip more.
//!
//! The SQL stores and `RedisStore` keep one per store:
//!
//! ```
//! use idem_runtime::duplicates::{Duplicates, FirstLook};
//!
//! let duplicates = Duplicates::default();
//! assert_eq!(duplicates.first_look(true), FirstLook::Insert);
//! for _ in 0..40 {
//!     duplicates.observe(true); // the claim met a record
//! }
//! assert_eq!(duplicates.first_look(true), FirstLook::Read);
//! ```

use std::sync::atomic::{AtomicU32, Ordering};

/// The whole share, in fixed point.
const ALL: u32 = 1 << 16;
/// Each claim moves the share by a sixteenth of the way: it follows the last few
/// dozen claims.
const STEP_SHIFT: u32 = 4;
/// From this share on, the claim reads what stands in its way in the same round trip.
/// Measured on PostgreSQL (p50, durable server): reading too costs a new key about
/// 25 µs and saves a duplicate about 65 µs (a second statement), so it pays from
/// about a duplicate in four claims on.
const READ_TOO_FROM: u32 = ALL * 3 / 10;
/// From this share on, the claim starts with a plain read of the record, and inserts
/// only when none stands. Measured on PostgreSQL (p50, durable server): a replay by
/// the read costs about 30 µs less than by the insert that reads, and a new key pays a
/// whole read (about 155 µs) more, so it pays from about four duplicates in five on.
const READ_FIRST_FROM: u32 = ALL * 8 / 10;

/// A moving share of a store's recent claims that met a record (every clone of the
/// store shares one).
#[derive(Debug, Default)]
pub struct Duplicates {
    share: AtomicU32,
}

impl Duplicates {
    /// One more claim, which `met` a record or inserted one. (Claims that race may
    /// lose one another's step: the share is a hint, not a count.)
    pub fn observe(&self, met: bool) {
        let share = self.share.load(Ordering::Relaxed);
        let towards = if met { ALL } else { 0 };
        let moved = share - (share >> STEP_SHIFT) + (towards >> STEP_SHIFT);
        self.share.store(moved, Ordering::Relaxed);
    }

    /// Whether claims meet records often enough that reading one in the claim's own
    /// statement pays.
    pub fn common(&self) -> bool {
        self.share.load(Ordering::Relaxed) >= READ_TOO_FROM
    }

    /// Whether nearly every claim meets a record: reading it first, with a plain read,
    /// pays even where an insert could read it.
    pub fn nearly_all(&self) -> bool {
        self.share.load(Ordering::Relaxed) >= READ_FIRST_FROM
    }

    /// How a claim starts, where the dialect has an insert that reads (`insert_reads`)
    /// or not.
    pub fn first_look(&self, insert_reads: bool) -> FirstLook {
        match (self.common(), self.nearly_all()) {
            (true, true) => FirstLook::Read,
            (true, false) if insert_reads => FirstLook::InsertThatReads,
            (true, false) => FirstLook::Read,
            (false, _) => FirstLook::Insert,
        }
    }
}

/// What a claim starts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FirstLook {
    /// The plain insert: most keys are new.
    Insert,
    /// The insert that also reads the record in its way.
    InsertThatReads,
    /// A plain read of the record; the insert only when none stands.
    Read,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_share_follows_the_recent_claims() {
        let duplicates = Duplicates::default();
        assert!(!duplicates.common(), "a new store expects new keys");
        for _ in 0..6 {
            duplicates.observe(true);
        }
        assert!(duplicates.common(), "six duplicates in a row make them common");
        for _ in 0..2 {
            duplicates.observe(false);
        }
        assert!(!duplicates.common(), "two new keys after them make them rare again");
        // One duplicate in two claims keeps reading worth it; one in five does not.
        for round in 0..200 {
            duplicates.observe(round % 2 == 0);
        }
        assert!(duplicates.common());
        for round in 0..200 {
            duplicates.observe(round % 5 == 0);
        }
        assert!(!duplicates.common());
    }

    #[test]
    fn nearly_all_takes_a_run_of_duplicates() {
        let duplicates = Duplicates::default();
        for _ in 0..20 {
            duplicates.observe(true);
        }
        assert!(duplicates.common());
        assert!(
            !duplicates.nearly_all(),
            "twenty duplicates on a new store are not yet nearly all"
        );
        for _ in 0..10 {
            duplicates.observe(true);
        }
        assert!(duplicates.nearly_all(), "thirty in a row are");
        duplicates.observe(false);
        duplicates.observe(false);
        assert!(!duplicates.nearly_all(), "two new keys end it");
        assert!(duplicates.common());
        // Nine duplicates in ten keep it; three in four do not.
        for round in 0..200 {
            duplicates.observe(round % 10 != 0);
        }
        assert!(duplicates.nearly_all());
        for round in 0..200 {
            duplicates.observe(round % 4 != 0);
        }
        assert!(!duplicates.nearly_all());
        assert!(duplicates.common());
    }

    #[test]
    fn the_first_look_follows_the_share() {
        let duplicates = Duplicates::default();
        assert_eq!(duplicates.first_look(true), FirstLook::Insert);
        assert_eq!(duplicates.first_look(false), FirstLook::Insert);
        for _ in 0..10 {
            duplicates.observe(true);
        }
        assert_eq!(duplicates.first_look(true), FirstLook::InsertThatReads);
        assert_eq!(duplicates.first_look(false), FirstLook::Read);
        for _ in 0..30 {
            duplicates.observe(true);
        }
        assert_eq!(
            duplicates.first_look(true),
            FirstLook::Read,
            "in a storm of duplicates a plain read answers them cheapest"
        );
        assert_eq!(duplicates.first_look(false), FirstLook::Read);
    }
}

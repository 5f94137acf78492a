//! How often a store's claims meet a record already there, which picks the statement
//! a claim starts with where the dialect has two: the plain insert (cheapest for a key
//! nobody holds), or the insert that also reads the record in its way (a replay in one
//! round trip, a little dearer for a new key).

use std::sync::atomic::{AtomicU32, Ordering};

/// The whole share, in fixed point.
const ALL: u32 = 1 << 16;
/// Each claim moves the share by a sixteenth of the way: it follows the last few
/// dozen claims.
const STEP_SHIFT: u32 = 4;
/// From this share on, the claim reads what stands in its way in the same statement.
/// Measured on PostgreSQL (p50, durable server): reading too costs a new key about
/// 25 µs and saves a duplicate about 65 µs (a second statement), so it pays from
/// about a duplicate in four claims on.
const READ_TOO_FROM: u32 = ALL * 3 / 10;

/// A moving share of a store's recent claims that met a record (every clone of the
/// store shares one).
#[derive(Debug, Default)]
pub(crate) struct Duplicates {
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
}

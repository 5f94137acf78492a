//! What to do with duplicates and with failed bodies.

/// What a duplicate of a finished call gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Replay the first call's `Ok` value, decoded from the stored JSON.
    #[default]
    ReturnFirst,
    /// Fail with [`Error::Duplicate`](crate::Error::Duplicate).
    Reject,
}

/// What happens to the claim when the body returns `Err`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnError {
    /// Delete the claim so that a retry runs the body again.
    #[default]
    Release,
    /// Record `FAIL`: duplicates get [`Error::PreviousFailed`](crate::Error::PreviousFailed)
    /// until the TTL runs out.
    Record,
}

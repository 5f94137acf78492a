//! The pause before a consumer's or a relay's next session.

use std::time::Duration;

/// The pause before the next session: from 100 ms, doubling, at most 5 s; back to the
/// start after a session that did some work.
#[derive(Debug)]
pub struct Backoff(Duration);

impl Default for Backoff {
    fn default() -> Self {
        Backoff::new()
    }
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(100);
    const MOST: Duration = Duration::from_secs(5);

    /// The first pause.
    pub fn new() -> Self {
        Backoff(Self::FIRST)
    }

    /// Back to the first pause.
    pub fn reset(&mut self) {
        self.0 = Self::FIRST;
    }

    /// Wait the pause, and double the next one.
    pub async fn pause(&mut self) {
        tokio::time::sleep(self.0).await;
        self.0 = (self.0 * 2).min(Self::MOST);
    }
}

//! The stream's duplicate window beside the records' time to live: JetStream drops a
//! publish whose `Nats-Msg-Id` it saw within its window, and forgets the id after it;
//! idem's records answer a key for their whole `ttl`.

use std::time::Duration;

/// A stream whose duplicate window is shorter than the records' `ttl`: a copy of a
/// message published after the window (a producer's late retry, an outbox row published
/// again after a long outage) is stored and delivered again, and only the handler's
/// records keep it from a second effect — until they expire.
///
/// ```
/// use std::time::Duration;
/// use idem_nats::DuplicateWindow;
///
/// let day = Duration::from_secs(24 * 3600);
/// let note = DuplicateWindow::check("ORDERS", Duration::from_secs(120), day).unwrap();
/// assert!(note.to_string().contains("2m"));
/// assert!(DuplicateWindow::check("ORDERS", day, Duration::from_secs(60)).is_none());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DuplicateWindow {
    /// The stream.
    pub stream: String,
    /// Its duplicate window.
    pub window: Duration,
    /// How long the handler's records are kept.
    pub records_ttl: Duration,
}

impl DuplicateWindow {
    /// The note for `stream`, when its duplicate `window` is shorter than the records'
    /// `records_ttl`; `None` when the stream remembers ids at least as long.
    pub fn check(stream: &str, window: Duration, records_ttl: Duration) -> Option<Self> {
        (window < records_ttl).then(|| DuplicateWindow {
            stream: stream.to_owned(),
            window,
            records_ttl,
        })
    }
}

impl std::fmt::Display for DuplicateWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "stream {:?} forgets message ids after {} but the records last {}: a copy published later than {} after \
             the first is delivered again, and only the records stop its second effect (past {} nothing does)",
            self.stream,
            shown(self.window),
            shown(self.records_ttl),
            shown(self.window),
            shown(self.records_ttl),
        )
    }
}

/// `duration` as an operator reads it: `2m`, `24h`, `1.5s`.
fn shown(duration: Duration) -> String {
    let secs = duration.as_secs();
    if duration.subsec_nanos() == 0 && secs > 0 {
        for (unit, size) in [("d", 86_400), ("h", 3_600), ("m", 60)] {
            if secs.is_multiple_of(size) {
                return format!("{}{unit}", secs / size);
            }
        }
        return format!("{secs}s");
    }
    format!("{duration:?}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_shorter_than_the_records_is_noted_and_no_other() {
        let s = Duration::from_secs;
        let note = DuplicateWindow::check("ORDERS", s(120), s(86_400)).unwrap();
        assert_eq!((note.window, note.records_ttl), (s(120), s(86_400)));
        assert_eq!(
            note.to_string(),
            "stream \"ORDERS\" forgets message ids after 2m but the records last 1d: a copy published later than 2m \
             after the first is delivered again, and only the records stop its second effect (past 1d nothing does)"
        );
        assert_eq!(DuplicateWindow::check("ORDERS", s(120), s(120)), None);
        assert_eq!(DuplicateWindow::check("ORDERS", s(600), s(120)), None);
        assert!(DuplicateWindow::check("ORDERS", Duration::from_millis(1500), s(2))
            .unwrap()
            .to_string()
            .contains("1.5s"));
    }
}

//! Times as Keel writes them: RFC 3339 text exactly as chrono's own `Serialize` writes it,
//! formatted straight into a small buffer. Every message, task status, transition and event
//! carries a time, and chrono's `Serialize` goes through its general formatting machinery
//! (and, in most serializers, a `String` per time).

use chrono::{DateTime, Datelike, Timelike, Utc};
use serde::Serializer;

/// Serialize `time` exactly as chrono's own `Serialize` does (RFC 3339, `Z`, the fraction in
/// 0, 3, 6 or 9 digits, whichever is shortest without loss), for `#[serde(serialize_with)]`.
/// Times chrono writes differently (leap seconds, years outside 0..=9999) go through chrono.
///
/// ```
/// use chrono::TimeZone;
/// let time = chrono::Utc.with_ymd_and_hms(2026, 11, 24, 9, 5, 7).unwrap();
/// let mut out = Vec::new();
/// keel_core::time::serialize(&time, &mut serde_json::Serializer::new(&mut out)).unwrap();
/// assert_eq!(out, serde_json::to_vec(&time).unwrap());
/// ```
pub fn serialize<S: Serializer>(time: &DateTime<Utc>, serializer: S) -> Result<S::Ok, S::Error> {
    match Rfc3339::of(time) {
        Some(text) => serializer.serialize_str(text.as_str()),
        None => serde::Serialize::serialize(time, serializer),
    }
}

/// The fraction of a second as chrono writes it: `None` for none, or the value and its
/// digits (3, 6 or 9, the fewest without loss), e.g. `Some((5, 3))` for `.005`.
///
/// ```
/// assert_eq!(keel_core::time::fraction(0), None);
/// assert_eq!(keel_core::time::fraction(5_000_000), Some((5, 3)));
/// assert_eq!(keel_core::time::fraction(1_500), Some((1_500, 9)));
/// ```
pub fn fraction(nanos: u32) -> Option<(u32, usize)> {
    if nanos == 0 {
        None
    } else if nanos % 1_000_000 == 0 {
        Some((nanos / 1_000_000, 3))
    } else if nanos % 1_000 == 0 {
        Some((nanos / 1_000, 6))
    } else {
        Some((nanos, 9))
    }
}

/// A time's RFC 3339 text as chrono writes it, in a fixed buffer.
#[derive(Debug, Clone, Copy)]
pub struct Rfc3339 {
    bytes: [u8; 30],
    len: usize,
}

impl Rfc3339 {
    /// The text of `time`, or `None` for a time chrono writes in another shape (a leap
    /// second, a year outside 0..=9999).
    pub fn of(time: &DateTime<Utc>) -> Option<Rfc3339> {
        format(time).map(|(bytes, len)| Rfc3339 { bytes, len })
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        // ASCII digits and separators only.
        std::str::from_utf8(&self.bytes[..self.len]).unwrap_or_default()
    }
}

/// The text and its length, or `None` for a time chrono writes in another shape.
fn format(time: &DateTime<Utc>) -> Option<([u8; 30], usize)> {
    let year = time.year();
    let nanos = time.nanosecond();
    if !(0..=9999).contains(&year) || nanos >= 1_000_000_000 {
        return None;
    }
    let mut out = Text::default();
    out.digits(year.unsigned_abs(), 4);
    for (before, value) in [
        (b'-', time.month()),
        (b'-', time.day()),
        (b'T', time.hour()),
        (b':', time.minute()),
        (b':', time.second()),
    ] {
        out.byte(before);
        out.digits(value, 2);
    }
    out.fraction(nanos);
    Some((out.bytes, out.len))
}

/// A fixed buffer long enough for the longest time written (`YYYY-MM-DDTHH:MM:SS.nnnnnnnnnZ`).
#[derive(Default)]
struct Text {
    bytes: [u8; 30],
    len: usize,
}

impl Text {
    /// The fraction of a second (none, or 3, 6 or 9 digits, the shortest without loss, as
    /// chrono writes it) and the closing `Z`.
    fn fraction(&mut self, nanos: u32) {
        if let Some((fraction, digits)) = fraction(nanos) {
            self.byte(b'.');
            self.digits(fraction, digits);
        }
        self.byte(b'Z');
    }

    fn byte(&mut self, byte: u8) {
        self.bytes[self.len] = byte;
        self.len += 1;
    }

    /// `value` in exactly `width` decimal digits, zero-padded.
    fn digits(&mut self, mut value: u32, width: usize) {
        for i in (0..width).rev() {
            self.bytes[self.len + i] = b'0' + (value % 10) as u8;
            value /= 10;
        }
        self.len += width;
    }
}

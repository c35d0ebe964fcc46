//! Event times as JSON, written without the formatting machinery: every persisted event
//! carries one, so a run report writes a hundred or more of them per run.

use chrono::{DateTime, Datelike, Timelike, Utc};
use serde::Serializer;

/// Serialize `time` exactly as chrono's own `Serialize` does (RFC 3339, `Z`, the fraction
/// in 0, 3, 6 or 9 digits, whichever is shortest without loss), straight into a small buffer.
/// Times chrono writes differently (leap seconds, years outside 0..=9999) go through chrono.
pub(crate) fn serialize<S: Serializer>(
    time: &DateTime<Utc>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match format(time) {
        Some((buffer, len)) => match std::str::from_utf8(&buffer[..len]) {
            Ok(text) => serializer.serialize_str(text),
            Err(_) => serde::Serialize::serialize(time, serializer),
        },
        None => serde::Serialize::serialize(time, serializer),
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

/// The length of `YYYY-MM-DDTHH:MM:SS`, the part of a time shared by its whole second.
const SECOND_LEN: usize = 19;

/// Writes a sequence of times as JSON strings, as [`serialize`] writes each, remembering
/// the text of the last second written: a run's events mostly fall within one second, so
/// after the first each needs only its fraction formatted.
#[derive(Default)]
pub(crate) struct TimeWriter {
    second: Option<i64>,
    /// `"YYYY-MM-DDTHH:MM:SS` of that second, opening quote included.
    prefix: String,
}

impl TimeWriter {
    pub(crate) fn write(&mut self, out: &mut String, time: &DateTime<Utc>) {
        let (second, nanos) = (time.timestamp(), time.timestamp_subsec_nanos());
        // A leap second shares the timestamp of the second before it, so it never reuses it.
        if self.second == Some(second) && nanos < 1_000_000_000 {
            out.push_str(&self.prefix);
            push_fraction(out, nanos);
            out.push_str("Z\"");
            return;
        }
        match format(time).and_then(|(buffer, len)| {
            let text = std::str::from_utf8(&buffer[..len]).ok()?;
            Some(text.get(..SECOND_LEN)?.to_owned()).map(|prefix| (prefix, text.to_owned()))
        }) {
            Some((prefix, text)) => {
                self.prefix.clear();
                self.prefix.push('"');
                self.prefix.push_str(&prefix);
                self.second = Some(second);
                out.push('"');
                out.push_str(&text);
                out.push('"');
            }
            None => {
                self.second = None;
                push_chrono(out, time);
            }
        }
    }
}

/// Append the fraction of a second as [`Text::fraction`] writes it, without its `Z`: the
/// digits come from `itoa` with a leading 1 that keeps their zeros, then is left out.
fn push_fraction(out: &mut String, nanos: u32) {
    let (fraction, scale) = if nanos == 0 {
        return;
    } else if nanos % 1_000_000 == 0 {
        (nanos / 1_000_000, 1_000)
    } else if nanos % 1_000 == 0 {
        (nanos / 1_000, 1_000_000)
    } else {
        (nanos, 1_000_000_000)
    };
    let mut digits = itoa::Buffer::new();
    let digits = digits.format(scale + fraction);
    out.push('.');
    out.push_str(digits.get(1..).unwrap_or_default());
}

/// Append `time` as chrono serializes it: for the times [`format`] leaves to chrono.
fn push_chrono(out: &mut String, time: &DateTime<Utc>) {
    match serde_json::to_string(time) {
        Ok(text) => out.push_str(&text),
        // chrono writes every time it holds; keep the output JSON whatever happens.
        Err(_) => out.push_str("null"),
    }
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
        let (fraction, digits) = if nanos == 0 {
            (0, 0)
        } else if nanos % 1_000_000 == 0 {
            (nanos / 1_000_000, 3)
        } else if nanos % 1_000 == 0 {
            (nanos / 1_000, 6)
        } else {
            (nanos, 9)
        };
        if digits > 0 {
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

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    /// What `serialize` writes, checked to be what a `TimeWriter` writes too.
    fn ours(time: &DateTime<Utc>) -> String {
        let mut out = Vec::new();
        serialize(time, &mut serde_json::Serializer::new(&mut out)).unwrap();
        let serialized = String::from_utf8(out).unwrap();
        // And what a `TimeWriter` writes, fresh and after a time in the same second.
        for writer in [&mut TimeWriter::default(), &mut warm_writer(time)] {
            let mut written = String::new();
            writer.write(&mut written, time);
            assert_eq!(written, serialized);
        }
        serialized
    }

    /// A writer that has just written another time of `time`'s second, when there is one.
    fn warm_writer(time: &DateTime<Utc>) -> TimeWriter {
        let mut writer = TimeWriter::default();
        let start = time.with_nanosecond(0).unwrap_or(*time);
        writer.write(&mut String::new(), &start);
        writer
    }

    #[test]
    fn a_time_writer_follows_seconds_as_they_change() {
        let base = Utc.with_ymd_and_hms(2026, 12, 31, 23, 59, 58).unwrap();
        let mut writer = TimeWriter::default();
        for millis in [0, 1, 999, 1_000, 1_500, 2_000, 1_000, 86_400_000] {
            let time = base + chrono::Duration::milliseconds(millis);
            let mut written = String::new();
            writer.write(&mut written, &time);
            assert_eq!(
                written,
                serde_json::to_string(&time).unwrap(),
                "{millis} ms"
            );
        }
    }

    #[test]
    fn writes_what_chrono_writes() {
        let base = Utc.with_ymd_and_hms(2026, 1, 2, 3, 4, 5).unwrap();
        for nanos in [
            0,
            1,
            999,
            1_000,
            120_000,
            5_000_000,
            123_000_000,
            123_456_000,
            123_456_789,
            999_999_999,
        ] {
            let time = base + chrono::Duration::nanoseconds(nanos);
            assert_eq!(
                ours(&time),
                serde_json::to_string(&time).unwrap(),
                "{nanos} ns"
            );
        }
        for time in [
            Utc.with_ymd_and_hms(1, 12, 31, 23, 59, 59).unwrap(),
            Utc.with_ymd_and_hms(9999, 12, 31, 23, 59, 59).unwrap(),
            Utc::now(),
        ] {
            assert_eq!(ours(&time), serde_json::to_string(&time).unwrap());
        }
    }

    #[test]
    fn times_chrono_writes_differently_are_left_to_chrono() {
        let far = Utc.with_ymd_and_hms(12000, 1, 1, 0, 0, 0).unwrap();
        assert_eq!(ours(&far), serde_json::to_string(&far).unwrap());
        let leap = chrono::NaiveDate::from_ymd_opt(2016, 12, 31)
            .unwrap()
            .and_hms_nano_opt(23, 59, 59, 1_500_000_000)
            .unwrap()
            .and_utc();
        assert_eq!(ours(&leap), serde_json::to_string(&leap).unwrap());
    }
}

//! Event times as JSON, written without the formatting machinery: every persisted event
//! carries one, so a run report writes a hundred or more of them per run.

use chrono::{DateTime, Utc};

pub(crate) use keel_core::time::serialize;

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
        match keel_core::time::Rfc3339::of(time) {
            Some(text) if text.as_str().len() > SECOND_LEN => {
                let text = text.as_str();
                self.prefix.clear();
                self.prefix.push('"');
                self.prefix.push_str(&text[..SECOND_LEN]);
                self.second = Some(second);
                out.push('"');
                out.push_str(text);
                out.push('"');
            }
            _ => {
                self.second = None;
                push_chrono(out, time);
            }
        }
    }
}

/// Append the fraction of a second as `keel_core::time` writes it, without its `Z`: the
/// digits come from `itoa` with a leading 1 that keeps their zeros, then is left out.
fn push_fraction(out: &mut String, nanos: u32) {
    let Some((fraction, digits)) = keel_core::time::fraction(nanos) else {
        return;
    };
    let mut text = itoa::Buffer::new();
    let text = text.format(10u32.pow(digits as u32) + fraction);
    out.push('.');
    out.push_str(text.get(1..).unwrap_or_default());
}

/// Append `time` as chrono serializes it: for the times `keel_core::time` leaves to chrono.
fn push_chrono(out: &mut String, time: &DateTime<Utc>) {
    match serde_json::to_string(time) {
        Ok(text) => out.push_str(&text),
        // chrono writes every time it holds; keep the output JSON whatever happens.
        Err(_) => out.push_str("null"),
    }
}

#[cfg(test)]
mod tests {
    use chrono::{TimeZone, Timelike};

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

//! Timestamps as the SQL backends store them: one integer of nanoseconds since the Unix
//! epoch, UTC, so that comparing columns in SQL (lease expiry, time windows, the order of
//! children) agrees exactly with comparing the `DateTime`s the in-memory stores keep.

use chrono::{DateTime, Utc};

/// `at` as stored: nanoseconds since the Unix epoch, UTC. Nanoseconds keep chrono's full
/// precision; times outside 1677–2262 saturate, which keeps the order.
///
/// ```
/// use keel_runtime::stored_time::{from_nanos, to_nanos};
/// let now = chrono::Utc::now();
/// assert_eq!(from_nanos(to_nanos(now)), now);
/// ```
pub fn to_nanos(at: DateTime<Utc>) -> i64 {
    at.timestamp_nanos_opt().unwrap_or(if at.timestamp() < 0 {
        i64::MIN
    } else {
        i64::MAX
    })
}

/// The timestamp stored as `nanos` by [`to_nanos`].
pub fn from_nanos(nanos: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_nanos(nanos)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nanosecond_timestamps_round_trip_exactly() {
        let now = Utc::now();
        assert_eq!(from_nanos(to_nanos(now)), now);
    }

    #[test]
    fn out_of_range_timestamps_saturate_in_order() {
        assert_eq!(to_nanos(DateTime::<Utc>::MIN_UTC), i64::MIN);
        assert_eq!(to_nanos(DateTime::<Utc>::MAX_UTC), i64::MAX);
    }
}

//! W3C Trace Context values: the 16-byte trace id and 8-byte span ids a run's events and
//! spans carry, and the `traceparent` header that carries them between processes.
//!
//! Values only: reading the header off a request and writing it on one is the transport's
//! work; choosing which span an event belongs to is the event emitter's.

use crate::TraceId;

/// A W3C trace id: 16 bytes, written as 32 lowercase hex digits; never all zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct W3cTraceId(pub [u8; 16]);

/// A W3C span id: 8 bytes, written as 16 lowercase hex digits; never all zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SpanId(pub [u8; 8]);

impl W3cTraceId {
    /// A fresh random trace id (the random bits of a UUID v4).
    pub fn random() -> Self {
        Self(*uuid::Uuid::new_v4().as_bytes())
    }

    /// The trace id a Keel [`TraceId`] stands for: its own bytes when it is 32 hex digits (a
    /// W3C id, as [`TraceId::w3c`] makes and a `traceparent` brings) or a UUID; otherwise
    /// (an application's own text) a stable hash of the text, so the same text is always
    /// the same trace.
    pub fn of(trace: &TraceId) -> Self {
        let text = trace.as_str();
        if let Some(bytes) = parse_hex::<16>(text) {
            if bytes != [0; 16] {
                return Self(bytes);
            }
        }
        if let Ok(uuid) = uuid::Uuid::parse_str(text) {
            if !uuid.is_nil() {
                return Self(*uuid.as_bytes());
            }
        }
        let high = fnv1a(0xcbf2_9ce4_8422_2325, &[text.as_bytes(), b"high"]);
        let low = fnv1a(0xcbf2_9ce4_8422_2325, &[text.as_bytes(), b"low"]);
        let mut bytes = [0; 16];
        bytes[..8].copy_from_slice(&high.to_be_bytes());
        bytes[8..].copy_from_slice(&low.to_be_bytes());
        Self(bytes)
    }

    /// The 32 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        to_hex(&self.0)
    }
}

impl SpanId {
    /// The span id derived from `parts` (FNV-1a, 64 bits): the same parts always give the
    /// same id, in any process, so a run resumed elsewhere keeps its spans' ids. An all-zero
    /// result (invalid in W3C) becomes 1.
    pub fn derive(parts: &[&[u8]]) -> Self {
        let hash = fnv1a(0xcbf2_9ce4_8422_2325, parts);
        Self(hash.max(1).to_be_bytes())
    }

    /// A span id written as 16 hex digits, if `text` is one (and not all zero).
    pub fn parse(text: &str) -> Option<Self> {
        parse_hex::<8>(text)
            .filter(|bytes| *bytes != [0; 8])
            .map(Self)
    }

    /// The 16 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        to_hex(&self.0)
    }
}

impl std::fmt::Display for SpanId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl std::fmt::Display for W3cTraceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl TraceId {
    /// A fresh trace id in the W3C form (32 lowercase hex digits), the form a new
    /// [`RunContext`](crate::RunContext) takes and `traceparent` carries.
    pub fn w3c() -> Self {
        Self::from(W3cTraceId::random().to_hex())
    }
}

/// The W3C `traceparent` header (version `00`): the caller's trace, the caller's span (the
/// parent of the work the request starts) and whether the caller samples it.
///
/// ```
/// use keel_core::TraceParent;
/// let header = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
/// let parent = TraceParent::parse(header).unwrap();
/// assert_eq!(parent.span_id.to_hex(), "00f067aa0ba902b7");
/// assert!(parent.sampled);
/// assert_eq!(parent.to_string(), header);
/// assert!(TraceParent::parse("00-00000000000000000000000000000000-00f067aa0ba902b7-01").is_none());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    /// The trace.
    pub trace_id: W3cTraceId,
    /// The caller's span.
    pub span_id: SpanId,
    /// The `sampled` flag.
    pub sampled: bool,
}

impl TraceParent {
    /// The header's name.
    pub const HEADER: &'static str = "traceparent";
    /// The name of its companion header, vendor state passed along unchanged.
    pub const STATE_HEADER: &'static str = "tracestate";

    /// Read a header value; `None` when it is not a valid version-00 `traceparent` (the
    /// specification says to ignore such a header and start a new trace). A higher version
    /// is read by its first four fields, as the specification asks.
    pub fn parse(value: &str) -> Option<Self> {
        let value = value.trim();
        let mut fields = value.split('-');
        let version = parse_hex::<1>(fields.next()?)?;
        if version == [0xff] {
            return None;
        }
        let trace_id = parse_hex::<16>(fields.next()?).filter(|b| *b != [0; 16])?;
        let span_id = SpanId::parse(fields.next()?)?;
        let flags = parse_hex::<1>(fields.next()?.get(..2)?)?;
        if version == [0] && (fields.next().is_some() || value.len() != 55) {
            return None;
        }
        Some(Self {
            trace_id: W3cTraceId(trace_id),
            span_id,
            sampled: flags[0] & 1 == 1,
        })
    }
}

impl std::fmt::Display for TraceParent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "00-{}-{}-{:02x}",
            self.trace_id,
            self.span_id,
            u8::from(self.sampled)
        )
    }
}

fn fnv1a(mut hash: u64, parts: &[&[u8]]) -> u64 {
    for part in parts {
        for byte in *part {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        // A separator, so that ("ab", "c") and ("a", "bc") differ.
        hash ^= 0xff;
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        text.push(DIGITS[usize::from(byte >> 4)] as char);
        text.push(DIGITS[usize::from(byte & 0xf)] as char);
    }
    text
}

/// Exactly `2 * N` lowercase hex digits (W3C forbids upper case).
fn parse_hex<const N: usize>(text: &str) -> Option<[u8; N]> {
    let digits = text.as_bytes();
    if digits.len() != 2 * N {
        return None;
    }
    let value = |d: u8| match d {
        b'0'..=b'9' => Some(d - b'0'),
        b'a'..=b'f' => Some(d - b'a' + 10),
        _ => None,
    };
    let mut bytes = [0; N];
    for (i, byte) in bytes.iter_mut().enumerate() {
        *byte = value(digits[2 * i])? << 4 | value(digits[2 * i + 1])?;
    }
    Some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trace_id_reads_as_its_w3c_bytes() {
        let w3c = TraceId::w3c();
        assert_eq!(W3cTraceId::of(&w3c).to_hex(), w3c.as_str());
        let uuid = TraceId::from("01934b6e-7a2c-7def-8123-456789abcdef");
        assert_eq!(
            W3cTraceId::of(&uuid).to_hex(),
            "01934b6e7a2c7def8123456789abcdef"
        );
        let own = TraceId::from("tr-1");
        assert_eq!(W3cTraceId::of(&own), W3cTraceId::of(&TraceId::from("tr-1")));
        assert_ne!(W3cTraceId::of(&own), W3cTraceId::of(&TraceId::from("tr-2")));
    }

    #[test]
    fn derived_span_ids_are_stable_and_distinct() {
        assert_eq!(SpanId::derive(&[b"r", b"1"]), SpanId::derive(&[b"r", b"1"]));
        assert_ne!(SpanId::derive(&[b"r", b"1"]), SpanId::derive(&[b"r1"]));
        assert_eq!(
            SpanId::parse(&SpanId::derive(&[b"x"]).to_hex()),
            Some(SpanId::derive(&[b"x"]))
        );
    }

    #[test]
    fn malformed_traceparents_are_ignored() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad}");
        }
        let future =
            TraceParent::parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-x");
        assert!(future.is_some_and(|p| !p.sampled));
    }
}

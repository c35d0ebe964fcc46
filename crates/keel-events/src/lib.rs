//! Keel events.

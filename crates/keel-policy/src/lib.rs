//! Keel policy.

//! Keel stores over Redis.

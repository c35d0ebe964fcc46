//! Keel stores over SQLite.

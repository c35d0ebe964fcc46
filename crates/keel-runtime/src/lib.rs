//! keel-runtime

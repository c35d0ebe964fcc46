//! keel-transport

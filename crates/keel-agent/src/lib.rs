//! keel-agent

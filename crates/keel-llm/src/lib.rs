//! keel-llm

//! The scheduler: the one owner of dedup, routing, slot and retry state.

pub mod messages;

pub use messages::JobEvent;

//! The scheduler's decisions ([`core`]): one plain struct that takes events with the time and
//! returns effects. The actor that feeds it and carries out its effects is the daemon's.

pub mod core;
#[cfg(any(test, feature = "fixtures"))]
pub mod fixtures;

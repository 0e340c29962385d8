//! The decisions of ephemer-actors, pure: each core is a plain struct that takes events with
//! the time as arguments and returns what to do as data. Nothing here reads a clock, touches
//! the network, the disk or a process, logs, or runs a task: this crate depends on no async
//! runtime, actor framework or HTTP crate, so the compiler keeps it that way.
//!
//! - [`scheduler::core`]: admission, claims, the ladder, the runner ledger, pacing, warm
//!   spares, fleet offers, parking and the sweep.
//! - [`retry`], [`rate`]: the claim retry ladder and the rate-limit book.
//! - [`scaleset`]: a scale-set session's states and what its messages mean.
//! - [`release`]: the runner release policy.
//! - [`provision::warm_keeping`]: how many environments to keep warm, which to replace.
//! - [`egress`]: each job's network namespace and the rules that fence it.
//! - [`durable`], [`job`], [`vocab`], [`config`], [`cluster`]: the records and words they share.

#![warn(missing_docs)]

pub mod clock;
pub mod cluster;
pub mod config;
pub mod durable;
pub mod egress;
pub mod github;
pub mod job;
pub mod provision;
pub mod rate;
pub mod release;
pub mod retry;
pub mod scaleset;
pub mod scheduler;
pub mod usage;
pub mod vocab;

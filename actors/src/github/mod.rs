//! Everything that touches GitHub: the REST client and its auth, rate headers, error classes,
//! webhook signatures and payloads, and the actor that owns the client.
//!
//! Nothing outside this module builds a GitHub URL or reads a GitHub header.

pub mod actions;
pub mod actor;
pub mod auth;
pub mod client;
pub mod error;
pub mod event;
pub mod groups;
pub mod hooks;
mod inspect;
mod pages;
pub mod poll;
pub mod proxy;
pub mod rate;
pub mod reconcile;
pub mod signature;

pub(crate) use client::connector;
pub use client::{GithubClient, JitRunner, RunnerInfo};
pub use error::{ErrorClass, GithubError};

//! Integration tests of the daemon as a whole: the real binary, its CLI and its listeners.

mod admin;
mod chaos;
mod cli;
mod cluster;
mod cluster_figures;
mod container;
mod docs;
mod doctor;
mod durable;
mod e2e;
mod embed;
mod fleet;
mod fungible;
mod github;
mod install;
mod intake;
mod network;
mod ops;
mod pools;
mod provision;
mod pull;
mod redeliver;
mod reliability;
mod security;
mod support;
mod systemd;

//! The next release, played by this build, for the binary-swap tests (`tests/it/upgrade.rs`,
//! `tests/it/traces.rs`): they stop this build and start "the next one" on its store or beside
//! it on one ledger, then go back. The next one differs as a later release might: a job's row
//! in the store carries one more field (`accepted_by`), and the ledger has one more, additive,
//! migration. Builds that do not know the field read the row all the same (serde skips what it
//! does not know), and this build reads the next one's rows (the field is optional).
//!
//! A debug build plays the next release when `EPHEMER_TEST_NEXT_BUILD=1`. In a release build
//! (the package, `cargo run --release`, `cargo install`) [`on`] is `false` whatever the
//! environment says. It was a cargo feature of its own once; the tests' second build of the
//! daemon then rebuilt every dependency for minutes of each CI run (docs/development.md).

/// Whether this process plays the next release (debug builds, when the environment says so).
pub fn on() -> bool {
    #[cfg(debug_assertions)]
    {
        std::env::var_os("EPHEMER_TEST_NEXT_BUILD").is_some_and(|v| v == "1")
    }
    #[cfg(not(debug_assertions))]
    {
        false
    }
}

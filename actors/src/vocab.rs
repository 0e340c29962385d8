//! The daemon's shared words ([`ephemer_decide::vocab`]), and the one of them that needs the
//! system's randomness.

pub use ephemer_decide::vocab::*;

/// Eight lowercase alphanumerics for a runner name.
pub fn random_suffix() -> String {
    use rand::RngExt as _;
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    (0..RANDOM_SUFFIX_LEN)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

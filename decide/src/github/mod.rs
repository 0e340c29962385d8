//! What the cores know of GitHub: its errors sorted into classes, a registered JIT runner,
//! and the scale-set service's messages as they arrive on the wire.

pub mod error;

/// The Actions service's wire types.
pub mod actions {
    pub mod types;
}

pub use error::{ErrorClass, GithubError};

use crate::config::Secret;

/// A just-in-time runner GitHub registered for us.
#[derive(Clone, PartialEq, Eq)]
pub struct JitRunner {
    /// GitHub's runner id (to delete it).
    pub id: u64,
    /// The name it was registered under.
    pub name: String,
    /// The runner's config; a secret: it goes only into the runner's environment.
    pub encoded_jit_config: Secret,
}

impl std::fmt::Debug for JitRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JitRunner")
            .field("id", &self.id)
            .field("name", &self.name)
            .field("encoded_jit_config", &"***")
            .finish()
    }
}

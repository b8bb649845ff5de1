//! The engine as a process of its own (docs/ENGINE.md; Zhou et al.
//! [FTGM]). So far: the records an application and its engine exchange
//! through the rings of the application's region ([`records`]). The
//! engine loop, the supervisor and recovery come next (docs/ENGINE.md,
//! "Next, in order").

pub mod records;

pub use records::{Completion, RecordError, Submission};

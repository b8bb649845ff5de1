//! What the engine did, for operators and tests.

/// What the engine did, for operators and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineStats {
    pub attached: u64,
    pub detached: u64,
    pub attach_refused: u64,
    /// Regions removed because their application was gone: found when
    /// the engine started, or after an application's connection closed
    /// (`crate::reclaim`).
    pub reclaimed_regions: u64,
    /// Datagrams for a node no attached application is.
    pub unknown_destination: u64,
    /// Datagrams built and lost on the way out (a transport that refused
    /// them; the core repairs or reports the loss). A full socket is not
    /// a loss: the driver keeps them for the next turn.
    pub send_dropped: u64,
    /// Submissions that did not decode, or were impossible: the
    /// application is detached (its memory is not to be trusted).
    pub bad_submissions: u64,
    pub turns: u64,
    /// Time spent auditing the engine's own state (`crate::audit`).
    pub audit_ns: u64,
    /// Engines its supervisor replaced before this one (it died or hung):
    /// the node's engine recoveries.
    pub replaced_before: u64,
}

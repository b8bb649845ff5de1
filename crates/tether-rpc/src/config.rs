//! What a caller and a server agree on, and their bounds.

use core::time::Duration;

/// Both sides' settings. The credit must be the same on both: a caller
/// never has more calls open toward a server than it grants
/// (the credit-based flow control of Kaur's AMVIA, thesis section 3.3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RpcConfig {
    /// Calls a caller may have open toward one server (from its first
    /// incomplete one): the server holds at most this many per caller life.
    pub credit: u32,
    /// Retransmissions of a request (or query) before the caller gives up
    /// on it (AMVIA's k).
    pub retries: u32,
    /// The first wait for an acknowledgement; doubled at each
    /// retransmission up to `max_retry_interval`. The stream below
    /// retransmits lost datagrams by itself: this is for a server that
    /// died (or a path that did) with the request.
    pub ack_timeout: Duration,
    /// Once acknowledged, how long the caller waits for the reply before
    /// asking again (a server that died while the handler ran leaves no
    /// reply coming; asking again gets its logged outcome).
    pub reply_timeout: Duration,
    pub max_retry_interval: Duration,
    /// A server holding replies a caller has not acknowledged asks it for
    /// its first incomplete call after this long without word from it.
    pub ack_request_after: Duration,
    /// Caller lives a server remembers per node; an older one is forgotten
    /// (its calls refused as stale from then on).
    pub lives_per_node: usize,
    /// Calls a caller keeps (open, or finished and not yet taken).
    pub max_calls: usize,
    /// The largest arguments and reply, bytes.
    pub max_args: usize,
    pub max_reply: usize,
    /// A caller's events waiting to be taken.
    pub max_events: usize,
}

impl Default for RpcConfig {
    fn default() -> Self {
        RpcConfig {
            credit: 64,
            retries: 8,
            ack_timeout: Duration::from_millis(200),
            reply_timeout: Duration::from_millis(500),
            max_retry_interval: Duration::from_secs(2),
            ack_request_after: Duration::from_millis(100),
            lives_per_node: 4,
            max_calls: 65_536,
            max_args: 1 << 20,
            max_reply: 1 << 20,
            max_events: 65_536,
        }
    }
}

//! What `send` returns: a handle on one message, to ask how it fared and
//! to wait until it is delivered or failed, whether the endpoint runs the
//! protocol itself or in an engine.

use std::sync::Arc;
use std::time::Duration;

use tether_proto::{FailReason, MessageId, MessageState};

use crate::shared::{block_on, Awaits, Shared};
use crate::Error;

/// A sent message: ask it how it fared.
#[derive(Clone)]
pub struct SendHandle {
    id: Option<MessageId>,
    /// Set when an injected operation fault decided the outcome.
    injected: Option<FailReason>,
    owner: Owner,
}

/// The endpoint a handle asks.
#[derive(Clone)]
pub(crate) enum Owner {
    Embedded(Arc<Shared>),
    Engine(tether_attach::Tracker),
    /// Nobody: the message never entered a stream.
    Nobody,
}

impl std::fmt::Debug for SendHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendHandle").field("id", &self.id).field("injected", &self.injected).finish()
    }
}

impl SendHandle {
    pub(crate) fn new(id: Option<MessageId>, injected: Option<FailReason>, owner: Owner) -> Self {
        SendHandle { id, injected, owner }
    }

    /// A message a fault kept from ever entering a stream: failed for
    /// `reason`.
    pub(crate) fn never_sent(reason: FailReason) -> Self {
        SendHandle { id: None, injected: Some(reason), owner: Owner::Nobody }
    }

    /// This handle, reporting its message failed for `reason` whatever
    /// became of it.
    pub(crate) fn reported_failed(self, reason: FailReason) -> Self {
        SendHandle { injected: Some(reason), ..self }
    }

    /// The message's number in its stream; `None` when an injected
    /// operation fault kept it from ever entering one.
    pub fn id(&self) -> Option<MessageId> {
        self.id
    }

    /// Where the message stands now: pending, delivered (acknowledged at
    /// the peer's commit point) or failed, and why.
    pub fn state(&self) -> MessageState {
        match (self.injected, self.id) {
            (Some(reason), _) => MessageState::Failed(reason),
            (None, Some(id)) => match &self.owner {
                Owner::Embedded(shared) => shared.lock().core.message_state(id),
                Owner::Engine(t) => t.message_state(id),
                Owner::Nobody => MessageState::Unknown,
            },
            (None, None) => MessageState::Unknown,
        }
    }

    /// The embedded endpoint it asks (`None`: an engine's, or nobody).
    #[cfg(feature = "tokio")]
    pub(crate) fn shared(&self) -> Option<&Arc<Shared>> {
        match &self.owner {
            Owner::Embedded(s) => Some(s),
            _ => None,
        }
    }

    /// Block until the message is delivered or failed, or `timeout` passes.
    pub fn wait(&self, timeout: Option<Duration>) -> Result<MessageState, Error> {
        let (None, Some(id)) = (self.injected, self.id) else { return Ok(self.state()) };
        match &self.owner {
            Owner::Embedded(shared) => {
                block_on(shared, timeout, Awaits::Settled, |d| match d.core.message_state(id) {
                    MessageState::Pending => None,
                    settled => Some(settled),
                })
            }
            Owner::Engine(t) => t.wait_settled(id, timeout).map_err(Error::from),
            Owner::Nobody => Ok(MessageState::Unknown),
        }
    }
}

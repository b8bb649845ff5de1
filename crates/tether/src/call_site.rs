//! Where an endpoint's calls live (`call_layer`) and what carries their
//! envelopes: the embedded endpoint's station, or an engine's client. The
//! endpoint's call API (`calls`) reaches them through here, whichever
//! home the protocol runs in.

use std::sync::Arc;
use std::time::Duration;

use tether_attach::Client;
use tether_proto::{Instant, NodeId};

use crate::attached_calls::AttachedCalls;
use crate::call_layer::{CallWire, Calls, Handlers};
use crate::shared::{block_on, Awaits, Shared};
use crate::station::Station;
use crate::Error;

/// Where an endpoint's calls live, for handles that outlive a borrow of it.
#[derive(Clone)]
pub(crate) enum Host {
    Embedded(Arc<Shared>),
    Attached(Arc<AttachedCalls>),
}

impl Host {
    /// Look at or change the call layer (nothing is sent).
    pub fn with<R>(&self, f: impl FnOnce(&mut Calls) -> R) -> R {
        match self {
            Host::Embedded(s) => f(&mut s.lock().layer.calls),
            Host::Attached(a) => a.with(f),
        }
    }

    /// Wait until `ready` gives something, or `timeout` passes.
    pub fn wait<R>(
        &self,
        timeout: Option<Duration>,
        mut ready: impl FnMut(&mut Calls) -> Option<R>,
    ) -> Result<R, Error> {
        match self {
            Host::Embedded(s) => block_on(s, timeout, Awaits::Calls, |d| ready(&mut d.layer.calls)),
            Host::Attached(a) => a.wait(timeout, ready),
        }
    }
}

/// An endpoint's calls with what carries their envelopes.
pub(crate) enum Site<'a> {
    Embedded(&'a Arc<Shared>),
    /// The calls' pump and the engine's client that carries their envelopes.
    Attached {
        calls: &'a Arc<AttachedCalls>,
        client: &'a Arc<Client>,
    },
}

impl Site<'_> {
    pub fn host(&self) -> Host {
        match self {
            Site::Embedded(s) => Host::Embedded(Arc::clone(s)),
            Site::Attached { calls, .. } => Host::Attached(Arc::clone(calls)),
        }
    }

    pub fn handlers(&self) -> &Handlers {
        match self {
            Site::Embedded(s) => &s.handlers,
            Site::Attached { calls, .. } => &calls.handlers,
        }
    }

    /// Calls are in use: an attached endpoint's pump starts.
    pub fn start(&self) -> Result<(), Error> {
        match self {
            Site::Embedded(_) => Ok(()),
            Site::Attached { calls, client } => calls.start(client),
        }
    }

    /// Change the call layer and send what that makes it send; `peer`, if
    /// given, is learned first where the endpoint can (an address book).
    pub fn exchange<R>(
        &self,
        peer: Option<NodeId>,
        f: impl FnOnce(&mut Calls, &dyn CallWire, Instant) -> R,
    ) -> R {
        match self {
            Site::Embedded(shared) => {
                let mut d = shared.lock();
                if let Some(peer) = peer {
                    d.learn_peer(peer);
                }
                let now = shared.clock.now();
                let Station { layer, core, .. } = &mut *d;
                let calls = &mut layer.calls;
                let r = f(calls, core, now);
                calls.flush(now, core);
                d.transmit(now);
                r
            }
            Site::Attached { calls, client } => calls.exchange(client, f),
        }
    }
}

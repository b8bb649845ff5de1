//! Building an endpoint step by step: its rails (UDP addresses or any
//! transport), its peers' addresses, and its options, checked together
//! at `build`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tether_attach::ClientOptions;
use tether_fault::FaultPlan;
use tether_io::{AddressBook, Transport};
use tether_proto::{Config, NodeId, RailId, MAX_RAILS};

use crate::{Endpoint, Error, Options, Progress};

/// One rail of the endpoint being built.
enum Rail {
    Udp(SocketAddr),
    Transport(Box<dyn Transport + Send>),
}

/// Sets up an [`Endpoint`]: `Endpoint::builder(node)`, then rails, peers
/// and options, then [`build`](Self::build).
///
/// ```no_run
/// # use tether::{Endpoint, Config, Progress};
/// # use std::time::Duration;
/// let ep = Endpoint::builder(1)
///     .bind("10.0.0.1:7000".parse().unwrap()) // rail 0
///     .bind("10.1.0.1:7000".parse().unwrap()) // rail 1, another network
///     .peer_rails(2, &["10.0.0.2:7000".parse().unwrap(), "10.1.0.2:7000".parse().unwrap()])
///     .config(Config { abandon_after: Duration::from_secs(2), ..Config::default() })
///     .progress(Progress::Thread)
///     .build()?;
/// # Ok::<(), tether::Error>(())
/// ```
pub struct Builder {
    node: NodeId,
    rails: Vec<Rail>,
    peers: Vec<(NodeId, Vec<SocketAddr>)>,
    options: Options,
    /// Attach to the engine serving this directory instead of running the
    /// protocol here.
    engine: Option<PathBuf>,
    /// Options given that only an embedded endpoint has, by name.
    embedded_only: Vec<&'static str>,
    /// The settings the program gave by builder calls (`section.name`, or
    /// `section.*`): a `tether.toml` or `TETHER_*` value never overrides
    /// them (`tether::settings`).
    given: Vec<&'static str>,
    /// The settings to apply instead of reading `tether.toml` and the
    /// environment at `build`.
    settings: Option<crate::settings::Layers>,
}

impl std::fmt::Debug for Builder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let rails: Vec<String> = self
            .rails
            .iter()
            .map(|r| match r {
                Rail::Udp(a) => format!("udp {a}"),
                Rail::Transport(_) => "transport".to_string(),
            })
            .collect();
        f.debug_struct("Builder")
            .field("node", &self.node)
            .field("rails", &rails)
            .field("peers", &self.peers)
            .field("options", &self.options)
            .finish()
    }
}

impl Builder {
    pub(crate) fn new(node: NodeId) -> Self {
        Builder {
            node,
            rails: Vec::new(),
            peers: Vec::new(),
            options: Options::default(),
            engine: None,
            embedded_only: Vec::new(),
            given: Vec::new(),
            settings: None,
        }
    }

    /// Add a rail: a UDP socket bound at `addr` (port 0 picks a free one;
    /// `Endpoint::rail_addrs` tells which). Rails are numbered in the order
    /// they are added, from 0.
    pub fn bind(mut self, addr: SocketAddr) -> Self {
        self.rails.push(Rail::Udp(addr));
        self.given.push("endpoint.bind");
        self
    }

    /// Add a rail over any transport (e.g. `transport::MemNetwork` in tests).
    pub fn transport(mut self, transport: Box<dyn Transport + Send>) -> Self {
        self.rails.push(Rail::Transport(transport));
        self.given.push("endpoint.bind");
        self
    }

    /// A peer reached at `addr` over rail 0.
    pub fn peer(self, node: NodeId, addr: SocketAddr) -> Self {
        self.peer_rails(node, &[addr])
    }

    /// A peer reached over several rails: `addrs[i]` over rail `i`.
    pub fn peer_rails(mut self, node: NodeId, addrs: &[SocketAddr]) -> Self {
        self.peers.push((node, addrs.to_vec()));
        self
    }

    /// Authenticate every datagram with the cluster's key (every node of
    /// the cluster needs the same), leaving the rest of the protocol
    /// configuration as it is.
    pub fn key(mut self, key: tether_proto::ClusterKey) -> Self {
        self.options.config.key = Some(key);
        self.given.push("config.key_file");
        self.embedded_only.push("the cluster key (an engine's is its --key-file)");
        self
    }

    /// Take in up to `max` peers this endpoint was not given
    /// (`Config::accept_peers`, 256 unless set; 0: none): a node whose
    /// handshake completes from an address this endpoint answered at
    /// becomes a peer, announced by `Event::PeerAccepted`, and may be sent
    /// to. With a cluster key the handshake proves it holds the key;
    /// without one nobody is taken in unless `accept_unkeyed` says so.
    pub fn accept(mut self, max: usize) -> Self {
        self.options.config.accept_peers = max;
        self.given.push("config.accept_peers");
        self.embedded_only.push("accepting peers (an engine takes in peers by its own configuration)");
        self
    }

    /// Without a cluster key, take in up to `max` peers not given anyway:
    /// an explicit opt-in, as their node ids prove nothing (anyone who can
    /// reach the endpoint may claim one not yet taken; peers given to the
    /// builder are never moved without a key). docs/PROTOCOL.md,
    /// "Accepting peers".
    pub fn accept_unkeyed(mut self, max: usize) -> Self {
        self.options.config.accept_peers = max;
        self.options.config.accept_unkeyed = true;
        self.given.extend(["config.accept_peers", "config.accept_unkeyed"]);
        self.embedded_only.push("accepting peers (an engine takes in peers by its own configuration)");
        self
    }

    /// Run the protocol in the node's engine process instead of this one:
    /// attach to the `tether engine` serving `dir` (its `--dir`). The engine
    /// owns the rails, the protocol configuration and fault injection;
    /// this process keeps what it sent until it is settled, so the engine
    /// can die or hang and be replaced with nothing lost
    /// (`Event::EngineRecovered`). docs/ENGINE.md.
    pub fn engine(mut self, dir: impl Into<PathBuf>) -> Self {
        self.engine = Some(dir.into());
        self.given.push("endpoint.engine");
        self
    }

    /// All options at once (replaces any set before).
    pub fn options(mut self, options: Options) -> Self {
        self.options = options;
        self.given.extend(["config.*", "calls.*", "endpoint.*"]);
        self.embedded_only.push("options (all at once)");
        self
    }

    /// The protocol configuration (checked at `build`).
    pub fn config(mut self, config: Config) -> Self {
        self.options.config = config;
        self.given.push("config.*");
        self.embedded_only.push("the protocol configuration");
        self
    }

    /// Who drives the protocol while the application is away.
    pub fn progress(mut self, progress: Progress) -> Self {
        self.options.progress = progress;
        self.given.push("endpoint.progress");
        self.embedded_only.push("progress");
        self
    }

    /// How long a blocked call busy-polls before sleeping in the kernel.
    pub fn spin(mut self, spin: Duration) -> Self {
        self.options.spin = spin;
        self.given.push("endpoint.spin");
        self
    }

    /// Give up to `peers` peers per UDP rail a socket connected to them,
    /// the busiest first (at most `tether_io::MAX_CONNECTED`; default 0:
    /// one socket per rail for all). docs/ARCHITECTURE.md, "Connected
    /// sockets", says what it costs and saves.
    pub fn connected_peers(mut self, peers: usize) -> Self {
        self.options.connected_peers = peers;
        self.given.push("endpoint.connected_peers");
        self
    }

    /// Let the kernel segment runs of equal datagrams and hand them over
    /// coalesced (UDP GSO/GRO; default: on where the kernel has them).
    /// docs/ARCHITECTURE.md, "Segmentation offload".
    pub fn offload(mut self, on: bool) -> Self {
        self.options.offload = on;
        self.given.push("endpoint.offload");
        self
    }

    /// This life's incarnation (default: from the wall clock); a restarted
    /// node must use a larger one than before.
    pub fn incarnation(mut self, incarnation: u64) -> Self {
        self.options.incarnation = Some(incarnation);
        self.given.push("endpoint.incarnation");
        self
    }

    /// Faults to inject on every rail and into the application's calls.
    pub fn faults(mut self, plan: FaultPlan) -> Self {
        self.options.faults = plan;
        self.given.extend(["endpoint.faults", "endpoint.fault_seed"]);
        self.embedded_only.push("fault injection");
        self
    }

    /// Take part in a cluster (docs/CLUSTER.md): join as a member (its
    /// heartbeats, detector and probes as `config.member` says), and run a
    /// manager replica if `config.managers` names this node. Every node of
    /// the cluster must be a peer of this endpoint. Views and suspicions
    /// come as `Endpoint::next_cluster_event`. Embedded endpoints only,
    /// for now.
    pub fn cluster(mut self, config: crate::cluster::ClusterConfig) -> Self {
        self.options.cluster = Some(config);
        self.embedded_only.push("cluster membership (`Builder::cluster`)");
        self
    }

    /// Faults for one rail instead of the endpoint-wide plan there.
    pub fn rail_faults(mut self, rail: RailId, plan: FaultPlan) -> Self {
        self.options.rail_faults.push((rail, plan));
        self.embedded_only.push("fault injection");
        self
    }

    /// How long dropping the endpoint waits for unsettled messages.
    pub fn linger(mut self, linger: Duration) -> Self {
        self.options.linger = linger;
        self.given.push("endpoint.linger");
        self
    }

    /// The calls' settings: credit, retransmissions (k), timeouts, bounds
    /// (`tether::rpc::RpcConfig`).
    pub fn calls(mut self, calls: tether_rpc::RpcConfig) -> Self {
        self.options.calls = calls;
        self.given.push("calls.*");
        self
    }

    /// Keep the server's call log in a file (`tether::rpc::CallLogOptions`):
    /// calls it served are answered from it after a restart, never run
    /// again.
    pub fn call_log(mut self, log: crate::rpc::CallLogOptions) -> Self {
        self.options.call_log = Some(log);
        self.given.extend(["endpoint.call_log", "endpoint.call_log_sync"]);
        self
    }

    /// Keep the caller's log in a file: each call made and how it ended,
    /// so after a restart `Endpoint::earlier_calls` says how the earlier
    /// life's calls ended (asking the servers about those it did not see
    /// end).
    pub fn caller_log(mut self, log: crate::rpc::CallLogOptions) -> Self {
        self.options.caller_log = Some(log);
        self.given.extend(["endpoint.caller_log", "endpoint.call_log_sync"]);
        self
    }

    /// Publish this endpoint's counters, its calls' and (embedded) every
    /// peer's and path's state on a board in `dir`, a few times a second,
    /// for `tether stat --dir DIR` and the metrics exporter
    /// (docs/OPERATING.md). Readers map it read-only; the endpoint spends
    /// tens of microseconds per publication.
    pub fn publish_stats(mut self, dir: impl Into<PathBuf>) -> Self {
        self.options.publish_stats = Some(dir.into());
        self.given.push("endpoint.publish_stats");
        self
    }

    /// Serve this endpoint's metrics in the Prometheus text format at
    /// `addr` (`GET /metrics`, for a Prometheus server to scrape; port 0
    /// picks one: `Endpoint::metrics_addr`). Needs the `metrics` feature;
    /// without it `build` refuses. Names and labels: docs/OPERATING.md.
    pub fn metrics(mut self, addr: SocketAddr) -> Self {
        self.options.metrics = Some(addr);
        self.given.push("endpoint.metrics");
        self
    }

    /// Bind the sockets, start the progress thread, learn the peers.
    /// Errors name what is wrong: the configuration field, the address
    /// that could not be bound and why, the rail counts.
    pub fn build(mut self) -> Result<Endpoint, Error> {
        self.check_peers()?;
        let layers = match self.settings.take() {
            Some(layers) => layers,
            None => crate::settings::Layers::load()?,
        };
        self.configured(&layers)?.assemble()
    }

    /// Configure from these settings (`Layers::from_parts`: a file of your
    /// choosing and variables; `Layers::default()`: none) instead of the
    /// `tether.toml` and `TETHER_*` variables `build` reads otherwise.
    /// Builder calls win over them either way.
    pub fn settings(mut self, layers: crate::settings::Layers) -> Self {
        self.settings = Some(layers);
        self
    }

    /// The settings of `layers` (a `tether.toml`, `TETHER_*` variables)
    /// applied under what the builder calls gave (`tether::settings`).
    pub(crate) fn configured(mut self, layers: &crate::settings::Layers) -> Result<Self, Error> {
        let udp: Vec<SocketAddr> =
            self.rails.iter().filter_map(|r| if let Rail::Udp(a) = r { Some(*a) } else { None }).collect();
        let mut t = crate::settings::Target {
            options: std::mem::take(&mut self.options),
            bind: udp,
            engine: self.engine.take(),
            peers: self.peers.iter().cloned().collect(),
            ..Default::default()
        };
        let given = &self.given;
        layers.apply(&mut t, |key| {
            given
                .iter()
                .any(|g| *g == key || g.strip_suffix('*').is_some_and(|section| key.starts_with(section)))
        })?;
        if !given.contains(&"endpoint.bind") {
            self.rails = t.bind.iter().map(|&a| Rail::Udp(a)).collect();
        }
        for (node, addrs) in t.peers {
            if !self.peers.iter().any(|(n, _)| *n == node) {
                self.peers.push((node, addrs));
            }
        }
        self.options = t.options;
        self.engine = t.engine;
        Ok(self)
    }

    fn assemble(self) -> Result<Endpoint, Error> {
        if let Some(dir) = &self.engine {
            return self.attach(dir);
        }
        if self.rails.is_empty() || self.rails.len() > MAX_RAILS {
            return Err(Error::Rails { given: self.rails.len() });
        }
        // Configuration first: nothing is bound for a config that cannot run.
        self.options.config.validate()?;
        let rails = self
            .rails
            .into_iter()
            .map(|r| match r {
                Rail::Udp(addr) => {
                    Ok(Box::new(crate::endpoint::udp(addr, AddressBook::new(), &self.options)?) as _)
                }
                Rail::Transport(t) => Ok(t),
            })
            .collect::<Result<Vec<Box<dyn Transport + Send>>, Error>>()?;
        let ep = Endpoint::with_rails(self.node, rails, self.options)?;
        for (node, addrs) in &self.peers {
            ep.add_peer_rails(*node, addrs)?;
        }
        Ok(ep)
    }

    /// Each peer given once.
    fn check_peers(&self) -> Result<(), Error> {
        for (i, (node, addrs)) in self.peers.iter().enumerate() {
            if let Some((_, again)) = self.peers[..i].iter().find(|(n, _)| n == node) {
                let first =
                    |a: &[SocketAddr]| a.first().copied().unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0)));
                return Err(Error::PeerTwice { node: *node, first: first(again), second: first(addrs) });
            }
        }
        Ok(())
    }

    /// `build` with an engine: refuse what the engine owns, attach, learn
    /// the peers.
    fn attach(&self, dir: &Path) -> Result<Endpoint, Error> {
        if !self.rails.is_empty() {
            return Err(Error::EngineOwns { what: "a rail (bind, transport)" });
        }
        if let Some(&what) = self.embedded_only.first() {
            return Err(Error::EngineOwns { what });
        }
        let defaults = ClientOptions::default();
        let options = ClientOptions {
            incarnation: self.options.incarnation,
            spin: self.options.spin,
            linger: self.options.linger,
            ..defaults
        };
        let calls = crate::attached::CallSetup {
            config: self.options.calls.clone(),
            log: self.options.call_log.as_ref(),
            caller_log: self.options.caller_log.as_ref(),
        };
        let publish = self.options.publish_stats.as_deref();
        let (linger, metrics) = (self.options.linger, self.options.metrics);
        let ep = Endpoint::attached(self.node, dir, options, calls, linger, publish, metrics)?;
        for (node, addrs) in &self.peers {
            ep.add_peer_rails(*node, addrs)?;
        }
        Ok(ep)
    }
}

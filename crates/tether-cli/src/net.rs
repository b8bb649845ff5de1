//! Options shared by the network commands, and endpoint set-up from them.

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Args, ValueEnum};
use tether::{ChecksumKind, Config, Endpoint, NodeId, Options, Progress, RetransmitMode};
use tether_io::{AddressBook, FaultSpec, FaultyTransport, Transport, UdpTransport};

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum Mode {
    Selective,
    GoBackN,
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum Checksum {
    None,
    Crc32c,
}

#[derive(Debug, Clone, Args)]
pub struct NetOpts {
    /// Message size in bytes.
    #[arg(long, default_value_t = 8)]
    pub size: usize,
    /// Messages per run.
    #[arg(long)]
    pub count: Option<u64>,
    /// Repeat the measurement this many times and report the median, min and max.
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Send window in segments (the papers' send-queue size).
    #[arg(long, default_value_t = 1024)]
    pub window: usize,
    /// Largest datagram in bytes, header included.
    #[arg(long, default_value_t = 1472)]
    pub mtu: usize,
    /// Floor of the adaptive retransmission timeout, in microseconds.
    #[arg(long, default_value_t = 1000)]
    pub rto_min_us: u64,
    #[arg(long, value_enum, default_value_t = Checksum::Crc32c)]
    pub checksum: Checksum,
    #[arg(long, value_enum, default_value_t = Mode::Selective)]
    pub mode: Mode,
    /// Fraction of datagrams dropped at random on receive (e.g. 0.01).
    #[arg(long, default_value_t = 0.0)]
    pub loss: f64,
    /// Seed for the loss generator.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Measure the bare transport: no header, no reliability.
    #[arg(long)]
    pub raw: bool,
    /// Busy-poll this long before sleeping in the kernel, in microseconds.
    #[arg(long, default_value_t = 50)]
    pub spin_us: u64,
    /// No progress thread: the calling thread drives the protocol (inside
    /// its blocking calls) instead.
    #[arg(long)]
    pub polling: bool,
    /// Two-process mode, receiving side: bind this address.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Two-process mode, sending side: the listener's address.
    #[arg(long)]
    pub connect: Option<SocketAddr>,
    /// Two-process mode: this side's own address (sender) / the sender's address (listener, as --peer).
    #[arg(long)]
    pub bind: Option<SocketAddr>,
    /// Two-process mode, listener: the sender's address.
    #[arg(long)]
    pub peer: Option<SocketAddr>,
    /// Print one JSON document instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub const SENDER: NodeId = 1;
pub const RECEIVER: NodeId = 2;

impl NetOpts {
    pub fn config(&self) -> Config {
        let rto_min = Duration::from_micros(self.rto_min_us);
        Config {
            max_datagram: self.mtu,
            send_window: self.window,
            recv_window: self.window.max(1024),
            rto_min,
            rto_initial: rto_min.max(Config::default().rto_initial),
            checksum: match self.checksum {
                Checksum::None => ChecksumKind::None,
                Checksum::Crc32c => ChecksumKind::Crc32c,
            },
            retransmit: match self.mode {
                Mode::Selective => RetransmitMode::Selective,
                Mode::GoBackN => RetransmitMode::GoBackN,
            },
            ..Config::default()
        }
    }

    pub fn options(&self) -> Options {
        let progress = if self.polling { Progress::Polling } else { Progress::Thread };
        Options {
            config: self.config(),
            spin: Duration::from_micros(self.spin_us),
            progress,
            ..Options::default()
        }
    }

    /// A UDP transport for `node` at `bind`, with loss injected on receive if asked.
    pub fn transport(
        &self,
        node: NodeId,
        bind: SocketAddr,
        peers: &[(NodeId, SocketAddr)],
        seed: u64,
    ) -> Result<Box<dyn Transport + Send>, tether_io::TransportError> {
        let mut book = AddressBook::new();
        for &(id, addr) in peers {
            book.insert(id, addr);
        }
        let udp = UdpTransport::bind(node, bind, book)?;
        if self.loss > 0.0 {
            let spec = FaultSpec { recv_loss: self.loss, ..FaultSpec::default() };
            Ok(Box::new(FaultyTransport::new(udp, spec, seed)))
        } else {
            Ok(Box::new(udp))
        }
    }

    pub fn endpoint(
        &self,
        node: NodeId,
        bind: SocketAddr,
        peers: &[(NodeId, SocketAddr)],
    ) -> Result<Endpoint, tether::Error> {
        let t = self.transport(node, bind, peers, self.seed ^ node as u64)?;
        Endpoint::with_transport(node, t, self.options())
    }
}

pub fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().expect("valid literal")
}

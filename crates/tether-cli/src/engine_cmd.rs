//! `tether engine`: the engine process of a node (docs/ENGINE.md; Zhou et
//! al. [FTGM]): it owns the UDP socket of every rail and runs the protocol
//! for every application on this node that attaches to it
//! (`tether_engine::Client`, through the directory it serves).

use std::net::SocketAddr;
use std::path::PathBuf;

use tether::{AuthKind, ClusterKey, Config};
use tether_engine::{Engine, EngineOptions};

use crate::args;
use crate::net::{auth_kind, key_file};

#[derive(clap::Args)]
pub struct EngineOpts {
    /// The directory applications attach through (its socket and their
    /// shared-memory regions): this user's only [default: /dev/shm/tether-UID].
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// One UDP address per rail, in rail order (repeat for more rails).
    #[arg(long = "bind", required = true)]
    pub binds: Vec<SocketAddr>,
    /// Largest datagram the engine sends, header included.
    #[arg(long, default_value_t = Config::default().max_datagram,
          value_parser = args::config_field(|c, v| c.max_datagram = v))]
    pub mtu: usize,
    /// Shared secret of the cluster (16 bytes or more): every datagram is
    /// authenticated, peers may move. Every engine of the cluster needs the same.
    #[arg(long, value_name = "FILE", value_parser = key_file)]
    pub key_file: Option<ClusterKey>,
    /// With --key-file: aes-256-gmac, aes-256-gcm or chacha20-poly1305.
    #[arg(long, default_value = "aes-256-gmac", value_parser = auth_kind, requires = "key_file")]
    pub auth: AuthKind,
}

/// This user's engine directory in /dev/shm.
pub fn default_dir() -> PathBuf {
    PathBuf::from(format!("/dev/shm/tether-{}", tether_engine::attach::my_uid()))
}

pub fn run(o: &EngineOpts) -> anyhow::Result<()> {
    let dir = o.dir.clone().unwrap_or_else(default_dir);
    let config = Config {
        max_datagram: o.mtu,
        key: o.key_file.clone().map(|k| k.with_auth(o.auth)),
        ..Config::default()
    };
    let mut engine = Engine::bind(EngineOptions { config, ..EngineOptions::new(&dir, o.binds.clone()) })?;
    let rails: Vec<String> = engine.rail_addrs().iter().map(|a| a.to_string()).collect();
    println!(
        "tether engine: pid {} serving {} on rails {}",
        std::process::id(),
        dir.display(),
        rails.join(", ")
    );
    engine.run()?;
    Ok(())
}

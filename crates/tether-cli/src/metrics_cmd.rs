//! `tether metrics`: a node's boards (`tether stat`'s) served in the
//! Prometheus text format for a Prometheus server to scrape
//! (`tether::metrics`; docs/OPERATING.md, "Metrics"). `tether engine
//! --metrics ADDR` starts one beside its engine. Like `tether stat`, it
//! only maps the boards read-only: a scrape never reaches the engine.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use tether_engine::stat;

#[derive(Args, Debug, Clone)]
pub struct MetricsOpts {
    /// The directory whose boards to export: an engine's (`tether engine
    /// --dir`) or where endpoints publish theirs. Default: the engine's
    /// default directory, /dev/shm/tether-UID.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Where to answer scrapes (`GET /metrics`); port 0 picks one.
    #[arg(long, default_value = "127.0.0.1:9464")]
    pub listen: SocketAddr,
}

pub fn run(o: &MetricsOpts) -> anyhow::Result<()> {
    let dir = o.dir.clone().unwrap_or_else(tether_engine::attach::default_dir);
    let boards = dir.clone();
    // Each scrape reads every board there now: an engine replaced, or
    // endpoints come and gone, show at the next scrape. A board that does
    // not read (a publication torn twice, another format) is left out of
    // that scrape, and Prometheus's own `up` says whether this answered.
    let server = tether::metrics::MetricsServer::serve(o.listen, move || {
        stat::boards_in(&boards).unwrap_or_default().iter().filter_map(|b| stat::read_board(b).ok()).collect()
    })
    .map_err(|e| anyhow::anyhow!("--listen {}: {e}", o.listen))?;
    println!("tether metrics: {} at http://{}/metrics", dir.display(), server.local_addr());
    use std::io::Write;
    let _ = std::io::stdout().flush();
    while !crate::service::stopping() {
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

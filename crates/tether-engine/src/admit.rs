//! Admitting an application (docs/ENGINE.md, "Step 1 in detail"): the
//! attachment on the engine's Unix socket, checked by the kernel's account
//! of who connects (never what the request says), the region opened only
//! in the engine's own directory, and the application's core set up.

use std::collections::{BTreeMap, VecDeque};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use tether_attach::{attach, is_probe_node, owner, EngineCounters};
use tether_fault::FaultCounters;
use tether_proto::{Config, Endpoint as Core, Instant};
use tether_shm::ClientRegion;
use tracing::{info, warn};

use crate::application::{Application, MAX_CLIENTS, RECORD_OVERHEAD};
use crate::engine::Engine;
use crate::resume::read_backups;

/// The configuration of an application's core: the engine's, in fragment
/// mode (the commit point at the application), messages bounded by what
/// one ring record holds.
fn client_config(engine: &Config, largest: usize) -> Config {
    Config {
        max_message_len: engine.max_message_len.min(largest),
        deliver_fragments: true,
        // The engine's memory is a failure domain of its own: every
        // payload it buffers is checked before it is sent or delivered.
        verify_payloads: true,
        ..engine.clone()
    }
}

impl Engine {
    /// Take every waiting attachment.
    pub(crate) fn accept(&mut self) -> bool {
        let mut any = false;
        loop {
            let conn = match self.listener.accept() {
                Ok((conn, _)) => conn,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return any,
                Err(e) => {
                    warn!(error = %e, "accepting an application failed");
                    return any;
                }
            };
            any = true;
            match self.admit(conn) {
                Ok(c) => {
                    info!(
                        node = c.node,
                        pid = c.pid,
                        incarnation = c.core.incarnation(),
                        "application attached"
                    );
                    self.stats.attached += 1;
                    self.clients.push(c);
                    // `check_attachment` refused past the bound.
                    assert!(self.clients.len() <= MAX_CLIENTS, "more applications attached than MAX_CLIENTS");
                }
                Err(why) => {
                    self.stats.attach_refused += 1;
                    warn!(reason = %why, "attachment refused");
                }
            }
        }
    }

    /// Check an attachment and set up its core; on refusal the reason goes
    /// back on the connection too.
    fn admit(&mut self, mut conn: UnixStream) -> Result<Application, String> {
        conn.set_nonblocking(false).map_err(|e| e.to_string())?;
        conn.set_read_timeout(Some(attach::EXCHANGE_TIMEOUT)).map_err(|e| e.to_string())?;
        conn.set_write_timeout(Some(attach::EXCHANGE_TIMEOUT)).map_err(|e| e.to_string())?;
        let result = self.check_attachment(&mut conn);
        let reply = match &result {
            Ok(_) => Ok(std::process::id()),
            Err(why) => Err(why.as_str()),
        };
        attach::write_reply(&mut conn, reply).map_err(|e| format!("answering: {e}"))?;
        let (region, path, core, pid, mode) = result?;
        let pool = core.message_pool();
        let recovered = read_backups(&region);
        let backups = recovered.iter().map(|(&peer, &(slot, _))| (peer, (slot, None))).collect();
        conn.set_nonblocking(true).map_err(|e| e.to_string())?;
        Ok(Application {
            node: region.header.node,
            pid,
            region,
            path,
            core,
            conn,
            record: Vec::new(),
            stalled: false,
            pool,
            spare: Vec::new(),
            held: Vec::new(),
            settled: BTreeMap::new(),
            backups,
            recovered,
            rails: BTreeMap::new(),
            resuming: (mode == attach::Mode::Resume).then(BTreeMap::new),
            closing: None,
            acks_by: None,
            gone: false,
            backup: self.options.backup,
            local_requests: Vec::new(),
            wakes: Vec::new(),
            control_out: VecDeque::new(),
            fresh: mode == attach::Mode::Fresh,
            counters_due: Instant::ZERO,
            counters_sent: tether_proto::Stats::default(),
            faults_sent: FaultCounters::default(),
            checks_sent: EngineCounters::default(),
            counters_buf: Vec::new(),
        })
    }

    fn check_attachment(
        &mut self,
        conn: &mut UnixStream,
    ) -> Result<(ClientRegion, PathBuf, Core, u32, attach::Mode), String> {
        let cred = attach::peer_cred(conn).map_err(|e| format!("peer credentials: {e}"))?;
        if cred.uid != attach::my_uid() {
            return Err(format!("user {} may not attach to user {}'s engine", cred.uid, attach::my_uid()));
        }
        if self.clients.len() >= MAX_CLIENTS {
            return Err(format!("the engine serves {MAX_CLIENTS} applications already"));
        }
        let (path, mode) = attach::read_request(conn).map_err(|e| format!("request: {e}"))?;
        // Only regions in the engine's own directory: an application may
        // not make the engine map an arbitrary file.
        let dir = self.options.dir.canonicalize().map_err(|e| e.to_string())?;
        let canonical = path.canonicalize().map_err(|e| format!("region {}: {e}", path.display()))?;
        if canonical.parent() != Some(dir.as_path()) {
            return Err(format!("region {} is not in the engine's directory", path.display()));
        }
        let region = ClientRegion::open(&canonical).map_err(|e| format!("region {}: {e}", path.display()))?;
        let h = region.header;
        if h.pid != cred.pid {
            return Err(format!("region names pid {}, the connection is pid {}", h.pid, cred.pid));
        }
        // Named for its node and owner, so what a dead owner leaves is
        // found and reclaimed (`crate::reclaim`), and nothing else is.
        let name = canonical.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if owner::region_owner(name) != Some((h.node, h.pid)) {
            return Err(format!(
                "region {} is not named for node {} of pid {}",
                path.display(),
                h.node,
                h.pid
            ));
        }
        if is_probe_node(h.node) {
            return Err(format!("node {} is reserved for the engine's self-test", h.node));
        }
        if self.clients.iter().any(|c| c.node == h.node) {
            return Err(format!("node {} is attached already", h.node));
        }
        // A message must fit one ring record either way.
        let largest = region.submissions.max_record().min(region.completions.max_record()) - RECORD_OVERHEAD;
        let config = client_config(&self.options.config, largest);
        let mut core = Core::new(config, h.node, h.incarnation).map_err(|e| e.to_string())?;
        core.seed_secrets(region.control.secret());
        Ok((region, canonical, core, cred.pid, mode))
    }
}

//! Names for endpoints: an endpoint registers a name with its
//! node id and the address of each of its rails, and others resolve the
//! name to reach it, instead of being told node ids and addresses. This is
//! Kaur's AMVIA name server (thesis sections 3.3 and A.2,
//! `docs/REFERENCES.md` \[AMVIA\]), served by stores made for the job rather
//! than a server of our own: a directory of files for the processes of one
//! machine (`FileNames`: each name one file, replaced whole by a rename),
//! and etcd for a cluster (`EtcdNames`: its v3 JSON gateway, one key per
//! name under a prefix).
//!
//! A registration is what a store holds; it is read back as untrusted
//! text: `parse` checks every line and bound and answers a typed error.
//! What a name resolves to is only where to send: who answers there is
//! proven by the handshake (and, with a cluster key, every datagram's
//! authentication), never by the name store.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::{Endpoint, NodeId, MAX_RAILS};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use thiserror::Error;

/// The longest name, bytes.
pub const MAX_NAME: usize = 128;
/// The longest registration a store may hand back, bytes: a node id and
/// `MAX_RAILS` addresses fit many times over.
pub const MAX_REGISTRATION: usize = 4096;

/// Where a name points: a node, and one address per rail (rail 0 first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    /// The endpoint's node id.
    pub node: NodeId,
    /// Its address on each rail, rail 0 first.
    pub addrs: Vec<SocketAddr>,
}

/// What went wrong with a name.
#[derive(Debug, Error)]
pub enum NameError {
    /// Not a name: empty, too long, or with a character names do not have.
    #[error("name {0:?}: 1 to {MAX_NAME} bytes of letters, digits, '.', '_' and '-'")]
    BadName(String),
    /// A store handed back something that is not a registration.
    #[error("registration of {name:?} is malformed: {why}")]
    Malformed {
        /// The name it was read for.
        name: String,
        /// What is wrong with it.
        why: String,
    },
    /// The endpoint has no rail with an address, or too many.
    #[error("an endpoint has 1 to {MAX_RAILS} rails with addresses, not {0}")]
    Rails(usize),
    /// A rail bound to a wildcard: no peer could send to it.
    #[error(
        "rail {rail} is bound at {addr}, which no peer can send to: bind the endpoint to the address \
         peers reach it at"
    )]
    Unspecified {
        /// Which rail.
        rail: usize,
        /// Where it is bound.
        addr: SocketAddr,
    },
    /// The store itself failed (a file, etcd).
    #[error("name store: {0}")]
    Store(String),
    /// Nothing is registered under the name.
    #[error("no endpoint is registered as {0:?}")]
    Unknown(String),
    /// The endpoint refused the peer the name resolved to.
    #[error(transparent)]
    Endpoint(#[from] crate::Error),
}

fn check_name(name: &str) -> Result<(), NameError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        && !name.starts_with('.');
    if ok {
        Ok(())
    } else {
        Err(NameError::BadName(name.to_owned()))
    }
}

impl Registration {
    /// `node=ID` then one `rail=ADDR` line per rail.
    pub fn to_text(&self) -> String {
        let mut s = format!("node={}\n", self.node);
        for a in &self.addrs {
            s.push_str(&format!("rail={a}\n"));
        }
        s
    }

    /// Read a registration a store handed back for `name`.
    pub fn parse(name: &str, text: &[u8]) -> Result<Self, NameError> {
        let bad = |why: &str| NameError::Malformed { name: name.to_owned(), why: why.to_owned() };
        if text.len() > MAX_REGISTRATION {
            return Err(bad("larger than a registration can be"));
        }
        let text = std::str::from_utf8(text).map_err(|_| bad("not UTF-8"))?;
        let mut lines = text.lines();
        let node = lines
            .next()
            .and_then(|l| l.strip_prefix("node="))
            .ok_or_else(|| bad("no node= line first"))?
            .parse::<NodeId>()
            .map_err(|_| bad("node is not a node id"))?;
        let mut addrs = Vec::new();
        for l in lines {
            let a = l.strip_prefix("rail=").ok_or_else(|| bad("a line other than rail="))?;
            let a = a.parse::<SocketAddr>().map_err(|_| bad("a rail address that is not one"))?;
            if a.ip().is_unspecified() || a.port() == 0 {
                return Err(bad("a rail address no peer can send to (unspecified, or port 0)"));
            }
            addrs.push(a);
        }
        if addrs.is_empty() || addrs.len() > MAX_RAILS {
            return Err(bad("not 1 to MAX_RAILS rails"));
        }
        Ok(Registration { node, addrs })
    }

    /// What `ep` is: its node and each rail's address.
    pub fn of(ep: &Endpoint) -> Result<Self, NameError> {
        let rails = ep.rail_addrs();
        let addrs: Vec<SocketAddr> = rails.iter().flatten().copied().collect();
        if addrs.is_empty() || addrs.len() != rails.len() {
            return Err(NameError::Rails(addrs.len()));
        }
        // A wildcard is where the endpoint listens, not where anyone can
        // reach it: registered, a peer would send into nowhere and time out.
        if let Some((rail, &addr)) = addrs.iter().enumerate().find(|(_, a)| a.ip().is_unspecified()) {
            return Err(NameError::Unspecified { rail, addr });
        }
        Ok(Registration { node: ep.node(), addrs })
    }
}

/// A store of names.
pub trait Names {
    /// Point `name` at `r` (replacing what it pointed at).
    fn register(&self, name: &str, r: &Registration) -> Result<(), NameError>;
    /// Where `name` points, if anywhere.
    fn resolve(&self, name: &str) -> Result<Option<Registration>, NameError>;
    /// Forget `name`.
    fn unregister(&self, name: &str) -> Result<(), NameError>;
}

/// Register `ep` as `name`.
pub fn register(names: &dyn Names, name: &str, ep: &Endpoint) -> Result<Registration, NameError> {
    let r = Registration::of(ep)?;
    names.register(name, &r)?;
    Ok(r)
}

/// Resolve `name` and make it a peer of `ep` over each rail it has: its
/// node id, to send and call to.
pub fn connect(names: &dyn Names, ep: &Endpoint, name: &str) -> Result<NodeId, NameError> {
    let r = names.resolve(name)?.ok_or_else(|| NameError::Unknown(name.to_owned()))?;
    let rails = ep.rail_addrs().len().min(r.addrs.len());
    ep.add_peer_rails(r.node, &r.addrs[..rails])?;
    Ok(r.node)
}

/// Names as files in one directory: for the processes of one machine (or
/// a shared file system). Each name is one file, written beside and
/// renamed into place, so a reader sees the old registration or the new,
/// never a mix.
#[derive(Debug, Clone)]
pub struct FileNames {
    dir: PathBuf,
}

impl FileNames {
    /// Names under `dir` (created if missing).
    pub fn new(dir: impl Into<PathBuf>) -> Result<Self, NameError> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir).map_err(|e| NameError::Store(format!("{}: {e}", dir.display())))?;
        Ok(FileNames { dir })
    }

    /// Names under `dir`, a store another process made: an error if it is
    /// gone, rather than a new one where that process no longer looks.
    pub fn existing(dir: impl Into<PathBuf>) -> Result<Self, NameError> {
        let dir = dir.into();
        if !dir.is_dir() {
            return Err(NameError::Store(format!("{}: no such directory", dir.display())));
        }
        Ok(FileNames { dir })
    }
}

impl Names for FileNames {
    fn register(&self, name: &str, r: &Registration) -> Result<(), NameError> {
        check_name(name)?;
        let store = |e: std::io::Error| NameError::Store(format!("{}: {e}", self.dir.display()));
        // A leading dot: never a name (check_name), so never read as one.
        // One temporary file per writer: process, thread and a count.
        static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp =
            self.dir.join(format!(".{name}.{}.{:?}.{n}", std::process::id(), std::thread::current().id()));
        let mut f = std::fs::File::create(&tmp).map_err(store)?;
        f.write_all(r.to_text().as_bytes()).map_err(store)?;
        f.sync_all().map_err(store)?;
        std::fs::rename(&tmp, self.dir.join(name)).map_err(store)
    }

    fn resolve(&self, name: &str) -> Result<Option<Registration>, NameError> {
        check_name(name)?;
        let path = self.dir.join(name);
        let mut text = Vec::new();
        match std::fs::File::open(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(NameError::Store(format!("{}: {e}", path.display()))),
            Ok(f) => {
                use std::io::Read;
                // One byte past the bound says it is too long.
                f.take(MAX_REGISTRATION as u64 + 1)
                    .read_to_end(&mut text)
                    .map_err(|e| NameError::Store(format!("{}: {e}", path.display())))?;
            }
        }
        Registration::parse(name, &text).map(Some)
    }

    fn unregister(&self, name: &str) -> Result<(), NameError> {
        check_name(name)?;
        match std::fs::remove_file(self.dir.join(name)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(NameError::Store(e.to_string())),
            _ => Ok(()),
        }
    }
}

/// Names in etcd (`etcd-server` in Debian), through its v3 JSON gateway:
/// one key `PREFIX/NAME` per name.
#[derive(Debug, Clone)]
pub struct EtcdNames {
    /// `http://HOST:PORT` of one etcd member.
    endpoint: String,
    prefix: String,
    agent: ureq::Agent,
}

impl EtcdNames {
    /// Names under `prefix` in the etcd at `endpoint` (`http://HOST:PORT`).
    pub fn new(endpoint: &str, prefix: &str) -> Self {
        let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(5)).build();
        EtcdNames { endpoint: endpoint.trim_end_matches('/').to_owned(), prefix: prefix.to_owned(), agent }
    }

    fn key(&self, name: &str) -> Result<String, NameError> {
        check_name(name)?;
        Ok(B64.encode(format!("{}/{name}", self.prefix)))
    }

    fn post(&self, path: &str, body: serde_json::Value) -> Result<serde_json::Value, NameError> {
        let url = format!("{}{path}", self.endpoint);
        let store = |e: String| NameError::Store(format!("{url}: {e}"));
        let reply = self.agent.post(&url).send_json(body).map_err(|e| store(e.to_string()))?;
        // The gateway's answers are small; a large one is not etcd's.
        let mut text = String::new();
        use std::io::Read;
        reply.into_reader().take(1 << 20).read_to_string(&mut text).map_err(|e| store(e.to_string()))?;
        serde_json::from_str(&text).map_err(|e| store(format!("not JSON: {e}")))
    }
}

impl Names for EtcdNames {
    fn register(&self, name: &str, r: &Registration) -> Result<(), NameError> {
        let key = self.key(name)?;
        let value = B64.encode(r.to_text());
        self.post("/v3/kv/put", serde_json::json!({ "key": key, "value": value }))?;
        Ok(())
    }

    fn resolve(&self, name: &str) -> Result<Option<Registration>, NameError> {
        let key = self.key(name)?;
        let reply = self.post("/v3/kv/range", serde_json::json!({ "key": key }))?;
        let Some(kv) = reply["kvs"].as_array().and_then(|kvs| kvs.first()) else { return Ok(None) };
        let bad = |why: &str| NameError::Malformed { name: name.to_owned(), why: why.to_owned() };
        let value = kv["value"].as_str().ok_or_else(|| bad("no value"))?;
        if value.len() > MAX_REGISTRATION * 2 {
            return Err(bad("larger than a registration can be"));
        }
        let text = B64.decode(value).map_err(|_| bad("value is not base64"))?;
        Registration::parse(name, &text).map(Some)
    }

    fn unregister(&self, name: &str) -> Result<(), NameError> {
        let key = self.key(name)?;
        self.post("/v3/kv/deleterange", serde_json::json!({ "key": key }))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_registration_reads_back_and_bad_ones_are_typed_errors() {
        let r = Registration {
            node: 7,
            addrs: vec!["127.0.0.1:7000".parse().unwrap(), "[::1]:7001".parse().unwrap()],
        };
        assert_eq!(Registration::parse("x", r.to_text().as_bytes()).unwrap(), r);
        for bad in [
            &b""[..],
            b"node=x\nrail=127.0.0.1:1\n",
            b"node=1\n",
            b"node=1\nrail=nowhere\n",
            b"node=1\nother=1\n",
            b"rail=127.0.0.1:1\nnode=1\n",
            b"node=1\nrail=127.0.0.1:1\xff\n",
            // Nowhere to send: a wildcard, or port 0.
            b"node=1\nrail=0.0.0.0:7000\n",
            b"node=1\nrail=[::]:7000\n",
            b"node=1\nrail=127.0.0.1:0\n",
        ] {
            assert!(matches!(Registration::parse("x", bad), Err(NameError::Malformed { .. })), "{bad:?}");
        }
        let many = format!("node=1\n{}", "rail=127.0.0.1:1\n".repeat(MAX_RAILS + 1));
        assert!(Registration::parse("x", many.as_bytes()).is_err());
        for name in ["", ".hidden", "a/b", "a b", &"n".repeat(MAX_NAME + 1)] {
            assert!(matches!(check_name(name), Err(NameError::BadName(_))), "{name:?}");
        }
        check_name("bank-server_1.a").unwrap();
    }

    /// An endpoint bound to a wildcard cannot be registered: the error
    /// says which rail and what to do, where before a peer connected and
    /// its first `recv` timed out.
    #[test]
    fn an_endpoint_bound_to_a_wildcard_is_not_registered() {
        let ep = Endpoint::builder(3).bind("0.0.0.0:0".parse().unwrap()).build().unwrap();
        let names =
            FileNames::new(std::env::temp_dir().join(format!("tether-names-wild-{}", std::process::id())))
                .unwrap();
        let err = register(&names, "wild", &ep).unwrap_err();
        eprintln!("registering an endpoint bound at 0.0.0.0: {err}");
        assert!(matches!(err, NameError::Unspecified { rail: 0, .. }), "{err}");
        assert!(err.to_string().contains("bind the endpoint to the address peers reach it at"), "{err}");
        assert!(names.resolve("wild").unwrap().is_none(), "nothing registered");
        let _ = std::fs::remove_dir_all(&names.dir);
    }
}

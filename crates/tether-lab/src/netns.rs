//! Two hosts on one machine for `tether campaign --engine` (Zhou et al.
//! [FTGM] section 5, Table 1: the faults are struck at one node's network
//! interface while another node talks to it): two network namespaces, `a`
//! and `b`, joined by one veth pair per rail, rail `r` on 10.203.r.0/24
//! with `a` at .1 and `b` at .2. The engines run inside them; the
//! applications stay in this process, since an engine's directory in
//! /dev/shm (its Unix socket and shared-memory regions) is reachable from
//! every namespace.
//!
//! The namespaces are named after this process's pid, so two campaigns
//! (or the netns tests, on 10.201 and 10.202) never collide, and the
//! guard deletes them on drop, veth pairs and all.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{Command, Output};

/// The most rails the campaign joins the hosts with.
pub const MAX_RAILS: u8 = 4;

/// Why the namespaces were not made.
#[derive(Debug)]
pub enum NetnsError {
    /// This machine or user cannot make them (not root, no `ip netns`):
    /// nothing the command did wrong, so it is skipped, not failed.
    Unavailable(String),
    /// Making them started and then failed.
    Failed(String),
}

impl std::fmt::Display for NetnsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NetnsError::Unavailable(why) => write!(f, "network namespaces unavailable: {why}"),
            NetnsError::Failed(why) => write!(f, "setting up network namespaces: {why}"),
        }
    }
}

impl std::error::Error for NetnsError {}

/// Two namespaces joined by veth pairs; deleted on drop.
pub struct Netns {
    names: [String; 2],
    rails: u8,
}

fn ip(args: &[&str]) -> std::io::Result<Output> {
    Command::new("ip").args(args).output()
}

/// Run `ip args`, its complaint as the error.
fn must(args: &[&str]) -> Result<(), NetnsError> {
    must_run(&[], args)
}

/// Run `ip PREFIX... ARGS...`, its complaint as the error.
fn must_run(prefix: &[&str], args: &[&str]) -> Result<(), NetnsError> {
    let line = || format!("ip {}", [prefix, args].concat().join(" "));
    let out = Command::new("ip")
        .args(prefix)
        .args(args)
        .output()
        .map_err(|e| NetnsError::Failed(format!("{}: {e}", line())))?;
    if !out.status.success() {
        return Err(NetnsError::Failed(format!(
            "{}: {}",
            line(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

impl Netns {
    /// Make the two hosts, joined by `rails` veth pairs (1 to [`MAX_RAILS`]).
    pub fn pair(rails: u8) -> Result<Netns, NetnsError> {
        Self::pair_for("campaign", rails)
    }

    /// The same, the namespaces named for `purpose` (`tether-PURPOSE-PID-a`).
    pub fn pair_for(purpose: &str, rails: u8) -> Result<Netns, NetnsError> {
        if !(1..=MAX_RAILS).contains(&rails) {
            return Err(NetnsError::Failed(format!("{rails} rails: 1 to {MAX_RAILS} are supported")));
        }
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err(NetnsError::Unavailable("not root".into()));
        }
        match ip(&["netns", "list"]) {
            Ok(o) if o.status.success() => {}
            Ok(o) => {
                let why = String::from_utf8_lossy(&o.stderr).trim().to_string();
                return Err(NetnsError::Unavailable(format!("`ip netns list` failed: {why}")));
            }
            Err(e) => return Err(NetnsError::Unavailable(format!("cannot run `ip`: {e}"))),
        }
        let pid = std::process::id();
        // The guard exists before the first namespace does, so a failure
        // half way removes what was made.
        let mut ns = Netns { names: [0, 1].map(|s| format!("tether-{purpose}-{pid}-{}", side(s))), rails: 0 };
        for n in &ns.names {
            let out = ip(&["netns", "add", n]).map_err(|e| NetnsError::Unavailable(e.to_string()))?;
            if out.status.success() {
                crate::scratch::namespace_made(n);
            }
            if !out.status.success() {
                // Root without the capability (a container, say): the
                // environment's limit, like not being root.
                let why = String::from_utf8_lossy(&out.stderr).trim().to_string();
                return Err(NetnsError::Unavailable(format!("cannot create a namespace: {why}")));
            }
        }
        for n in &ns.names {
            must(&["-n", n, "link", "set", "lo", "up"])?;
        }
        for r in 0..rails {
            // Interface names are at most 15 bytes: "tc" + pid (<= 7
            // digits) + side + rail fits.
            let (va, vb) = (Self::veth(0, r), Self::veth(1, r));
            let (na, nb) = (&ns.names[0], &ns.names[1]);
            must(&["link", "add", &va, "netns", na, "type", "veth", "peer", "name", &vb, "netns", nb])?;
            ns.rails = r + 1;
            for (s, n, v) in [(0, na, &va), (1, nb, &vb)] {
                let addr = format!("{}/24", Self::host(s, r));
                must(&["-n", n, "addr", "add", &addr, "dev", v])?;
                must(&["-n", n, "link", "set", v, "up"])?;
            }
        }
        Ok(ns)
    }

    /// The namespace of side `s` (0 is `a`, 1 is `b`).
    pub fn name(&self, s: usize) -> &str {
        &self.names[s]
    }

    /// Rails joining the two.
    pub fn rails(&self) -> u8 {
        self.rails
    }

    /// Side `s`'s end of rail `r`'s veth pair.
    pub fn veth(s: usize, r: u8) -> String {
        format!("tc{}{}{r}", std::process::id(), side(s))
    }

    /// Run `f` on a thread inside side `s`'s namespace: the sockets it
    /// makes belong there, whichever thread uses them afterwards.
    pub fn within<T: Send>(&self, s: usize, f: impl FnOnce() -> T + Send) -> std::io::Result<T> {
        let path = format!("/var/run/netns/{}", self.names[s]);
        let file = std::fs::File::open(&path)?;
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    use std::os::fd::AsRawFd;
                    // SAFETY: setns on a descriptor we hold open; it moves
                    // only this thread, which ends with the scope.
                    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(f())
                })
                .join()
                .map_err(|_| std::io::Error::other("a thread inside the namespace panicked"))?
        })
    }

    /// Set the MTU of every veth link, both ends.
    pub fn set_mtu(&self, mtu: u32) -> Result<(), NetnsError> {
        let mtu = mtu.to_string();
        for r in 0..self.rails {
            for s in 0..2 {
                must(&["-n", &self.names[s], "link", "set", &Self::veth(s, r), "mtu", &mtu])?;
            }
        }
        Ok(())
    }

    /// Run `tc args` inside side `s`'s namespace.
    pub fn tc(&self, s: usize, args: &[&str]) -> Result<(), NetnsError> {
        must_run(&["netns", "exec", &self.names[s], "tc"], args)
    }

    /// `tc -s qdisc show dev DEV` inside side `s`'s namespace: the text.
    pub fn qdisc_stats(&self, s: usize, dev: &str) -> String {
        Command::new("ip")
            .args(["netns", "exec", &self.names[s], "tc", "-s", "qdisc", "show", "dev", dev])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }

    /// Side `s`'s address on rail `r`.
    pub fn host(s: usize, r: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(10, 203, r, s as u8 + 1))
    }

    /// Side `s`'s address and `port` on every rail, in rail order.
    pub fn binds(&self, s: usize, port: u16) -> Vec<SocketAddr> {
        (0..self.rails).map(|r| SocketAddr::new(Self::host(s, r), port)).collect()
    }
}

/// `a` or `b`.
fn side(s: usize) -> char {
    if s == 0 {
        'a'
    } else {
        'b'
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting a namespace deletes its end of each veth pair, and with
        // it the pair. A namespace still holding a process lives on until
        // that process exits (the engines are stopped first).
        for n in &self.names {
            let _ = ip(&["netns", "del", n]);
            crate::scratch::namespace_gone(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_follow_the_rail_and_the_side() {
        assert_eq!(Netns::host(0, 0).to_string(), "10.203.0.1");
        assert_eq!(Netns::host(1, 1).to_string(), "10.203.1.2");
        let ns = Netns { names: ["x".into(), "y".into()], rails: 2 };
        let binds: Vec<String> = ns.binds(1, 7700).iter().map(|a| a.to_string()).collect();
        assert_eq!(binds, ["10.203.0.2:7700", "10.203.1.2:7700"]);
        // Not made, so nothing to delete: forget it rather than run `ip`.
        std::mem::forget(ns);
    }
}

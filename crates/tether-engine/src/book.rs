//! The engine's address book: where each remote node is on each rail, and
//! which nodes each address hosts. One engine serves many nodes (one per
//! attached application), so unlike an endpoint's book an address maps to
//! a set of nodes; identity still comes from the source address, never
//! the header alone (docs/ENGINE.md, "Who is a node").

use std::collections::BTreeMap;
use std::net::SocketAddr;

use tether_proto::{NodeId, Origin, RailId, MAX_RAILS};

/// Remote nodes the book holds at most: every entry is bounded.
pub const MAX_NODES: usize = 65_536;

#[derive(Debug, Default)]
pub struct Book {
    /// Per node, its address on each rail (`None`: not reachable there).
    by_node: BTreeMap<NodeId, [Option<SocketAddr>; MAX_RAILS]>,
    /// Per rail and address, the nodes there.
    by_addr: BTreeMap<(RailId, SocketAddr), Vec<NodeId>>,
}

/// The book is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BookFull;

impl Book {
    /// `node` is at `addrs[i]` on rail `i` (replacing what was known).
    pub fn insert(&mut self, node: NodeId, addrs: &[SocketAddr]) -> Result<(), BookFull> {
        if !self.by_node.contains_key(&node) && self.by_node.len() >= MAX_NODES {
            return Err(BookFull);
        }
        let mut entry = [None; MAX_RAILS];
        for (rail, &a) in addrs.iter().enumerate().take(MAX_RAILS) {
            entry[rail] = Some(a);
        }
        self.forget(node);
        for (rail, a) in entry.iter().enumerate() {
            if let Some(a) = a {
                self.by_addr.entry((rail as RailId, *a)).or_default().push(node);
            }
        }
        self.by_node.insert(node, entry);
        assert!(self.by_node.len() <= MAX_NODES, "the address book past MAX_NODES");
        Ok(())
    }

    /// `node` proved itself at `addr` on `rail` (a handshake from a new
    /// address, with the cluster key).
    pub fn moved(&mut self, node: NodeId, rail: RailId, addr: SocketAddr) {
        let Some(mut entry) = self.by_node.get(&node).copied() else { return };
        entry[rail as usize % MAX_RAILS] = Some(addr);
        let addrs: Vec<_> = entry.iter().map_while(|a| *a).collect();
        let _ = self.insert(node, &addrs);
    }

    fn forget(&mut self, node: NodeId) {
        let Some(old) = self.by_node.remove(&node) else { return };
        for (rail, a) in old.iter().enumerate() {
            let Some(a) = a else { continue };
            let key = (rail as RailId, *a);
            if let Some(nodes) = self.by_addr.get_mut(&key) {
                nodes.retain(|&n| n != node);
                if nodes.is_empty() {
                    self.by_addr.remove(&key);
                }
            }
        }
    }

    /// The two maps agree: every node is listed at each of its addresses,
    /// and every address lists only nodes the book places there. They are
    /// kept apart for lookups both ways, which makes each the other's
    /// check (the engine's self-test runs this: Zhou et al. [FTGM]
    /// section 4, state checked by redundancy).
    pub fn audit(&self) -> Result<(), String> {
        let mut listed = 0;
        for (&node, entry) in &self.by_node {
            for (rail, a) in entry.iter().enumerate() {
                let Some(a) = a else { continue };
                listed += 1;
                if !self.by_addr.get(&(rail as RailId, *a)).is_some_and(|n| n.contains(&node)) {
                    return Err(format!("node {node} on rail {rail} at {a}: not listed there"));
                }
            }
        }
        let mut placed = 0;
        for (&(rail, a), nodes) in &self.by_addr {
            // `origin` names the first node an address lists.
            if nodes.is_empty() {
                return Err(format!("{a} on rail {rail} lists no node"));
            }
            for (i, &node) in nodes.iter().enumerate() {
                if nodes[..i].contains(&node) {
                    return Err(format!("{a} on rail {rail} lists node {node} twice"));
                }
                placed += 1;
                if self.addr(node, rail) != Some(a) {
                    return Err(format!("{a} on rail {rail} lists node {node}, which is not there"));
                }
            }
        }
        if listed != placed {
            return Err(format!("{listed} node addresses, {placed} listings"));
        }
        Ok(())
    }

    /// The fault hook: one bit of an address, or of a node id at an
    /// address, flipped in place (one map only, as a strike would).
    #[cfg(feature = "fault-hook")]
    pub fn flip(&mut self, draw: &mut tether_proto::fault_hook::Draw) -> Result<String, &'static str> {
        if self.by_node.is_empty() {
            return Err("the address book is empty");
        }
        if draw.below(2) == 0 {
            let n = draw.below(self.by_node.len() as u64) as usize;
            let Some((&node, entry)) = self.by_node.iter_mut().nth(n) else { return Err("no such entry") };
            let Some(a) = entry.iter_mut().flatten().next() else {
                return Err("an entry without an address");
            };
            let bit = draw.below(48);
            if bit < 16 {
                a.set_port(a.port() ^ (1 << bit));
            } else if let SocketAddr::V4(v4) = a {
                let ip = u32::from(*v4.ip()) ^ (1 << (bit - 16));
                v4.set_ip(ip.into());
            }
            Ok(format!("bit {bit} of node {node}'s address (now {a})"))
        } else {
            let n = draw.below(self.by_addr.len() as u64) as usize;
            let Some((key, nodes)) = self.by_addr.iter_mut().nth(n) else { return Err("no such address") };
            let i = draw.below(nodes.len() as u64) as usize;
            let bit = draw.below(32);
            nodes[i] ^= 1 << bit;
            Ok(format!("bit {bit} of a node id listed at {} (now {})", key.1, nodes[i]))
        }
    }

    /// The book agrees with where datagrams actually go: each node's
    /// address on each rail is the one `sent_to(node, rail)` says the
    /// rail's transport sends it to (`Ok(None)`: the transport cannot
    /// tell; `Err(())`: it does not know the node). The engine sends by
    /// node id through its rails' transports and tells senders apart by
    /// this book, so the two copies check each other.
    pub fn agrees_with(
        &self,
        sent_to: impl Fn(NodeId, RailId) -> Result<Option<SocketAddr>, ()>,
    ) -> Result<(), String> {
        for (&node, entry) in &self.by_node {
            for (rail, a) in entry.iter().enumerate() {
                let Some(a) = a else { continue };
                match sent_to(node, rail as RailId) {
                    Ok(Some(b)) if b != *a => {
                        return Err(format!("node {node} on rail {rail}: at {a} in the book, sent to {b}"))
                    }
                    Err(()) => {
                        return Err(format!(
                            "node {node} on rail {rail}: at {a} in the book, unknown to the rail"
                        ))
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }

    pub fn addr(&self, node: NodeId, rail: RailId) -> Option<SocketAddr> {
        self.by_node.get(&node).and_then(|e| e.get(rail as usize).copied().flatten())
    }

    /// Where a datagram that came from `addr` on `rail`, and names
    /// `claimed` as its sender, comes from: that node if the address
    /// hosts it; another node the address hosts if not (the core then
    /// counts a source mismatch, after verification); a stranger if the
    /// address hosts nobody.
    pub fn origin(&self, rail: RailId, addr: SocketAddr, claimed: NodeId) -> Origin {
        match self.by_addr.get(&(rail, addr)) {
            Some(nodes) if nodes.contains(&claimed) => Origin::Node(claimed),
            Some(nodes) => Origin::Node(nodes[0]),
            None => Origin::Stranger(addr),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_hosts_several_nodes_and_identity_follows_the_address() {
        let a: SocketAddr = "10.0.0.1:7000".parse().unwrap();
        let b: SocketAddr = "10.0.0.2:7000".parse().unwrap();
        let mut book = Book::default();
        book.insert(1, &[a]).unwrap();
        book.insert(2, &[a]).unwrap();
        book.insert(3, &[b]).unwrap();
        assert_eq!(book.origin(0, a, 2), Origin::Node(2));
        assert_eq!(book.origin(0, a, 1), Origin::Node(1));
        // Node 3 is not at `a`: a header naming it from there is not taken at its word.
        assert!(matches!(book.origin(0, a, 3), Origin::Node(n) if n != 3));
        assert_eq!(book.origin(1, a, 1), Origin::Stranger(a), "rail 1 was never given");
        book.moved(1, 0, b);
        assert_eq!(book.origin(0, b, 1), Origin::Node(1));
        assert_eq!(book.origin(0, a, 1), Origin::Node(2), "the old address no longer vouches for it");
        assert_eq!(book.addr(1, 0), Some(b));
    }
}

//! Hello, tether: a server that takes in any client, and a client.
//!
//! `cargo run -p tether --example hello`
use std::time::Duration;
use tether::{Endpoint, Event};

fn main() -> Result<(), tether::Error> {
    let wait = Some(Duration::from_secs(5));
    let any = "127.0.0.1:0".parse().expect("an address");
    // Node 1, the server: any free port; takes in clients it was not told of
    // (without a cluster key only by this explicit opt-in).
    let server = Endpoint::builder(1).bind(any).accept_unkeyed(16).build()?;
    let client = Endpoint::builder(2).bind(any).peer(1, server.local_addr().expect("bound")).build()?;
    let sent = client.send(1, b"hello")?;
    let msg = server.recv(wait)?;
    println!("node {} says {}", msg.from, String::from_utf8_lossy(&msg.message));
    println!("the message was {:?}", sent.wait(wait)?);
    if let Ok(Event::PeerAccepted { peer, addr, .. }) = server.next_event(wait) {
        println!("the server took in node {peer} at {addr:?}");
    }
    client.close(Duration::from_secs(1))?;
    server.close(Duration::from_secs(1))
}

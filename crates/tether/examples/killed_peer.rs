//! Surviving a killed peer: what the application sees.
//!
//! A receiver runs as a child process; this process streams messages to
//! it, kills it with SIGKILL mid-stream, and reads the event that says
//! exactly which messages failed, and which of those may still have
//! arrived (their acknowledgement lost with the peer). A new receiver
//! takes the old one's place at the same address and greets this process
//! (it is given this one's address): the restart is an event, and the
//! stream goes on with the new life.
//!
//! `cargo run -p tether --example killed_peer`

use std::net::SocketAddr;
use std::process::{Child, Command};
use std::time::Duration;

use tether::{Config, Endpoint, Error, Event, MessageState, Options};

const WAIT: Option<Duration> = Some(Duration::from_secs(30));

fn receiver(addr: SocketAddr, sender: SocketAddr) -> Result<(), Error> {
    let ep = Endpoint::builder(2).bind(addr).peer(1, sender).build()?;
    loop {
        ep.recv(None)?; // until killed
    }
}

/// A receiver process, killed and reaped when dropped.
struct Receiver(Child);

impl Receiver {
    fn kill(&mut self) {
        self.0.kill().ok();
        self.0.wait().ok();
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.kill();
    }
}

fn start(addr: SocketAddr, sender: SocketAddr) -> Receiver {
    let me = std::env::current_exe().expect("this program");
    let args = ["receiver", &addr.to_string(), &sender.to_string()];
    Receiver(Command::new(me).args(args).spawn().expect("the receiver starts"))
}

fn free_port() -> SocketAddr {
    std::net::UdpSocket::bind("127.0.0.1:0").and_then(|s| s.local_addr()).expect("a free port")
}

fn main() -> Result<(), Error> {
    if let [_, mode, addr, sender] = &std::env::args().collect::<Vec<_>>()[..] {
        if mode == "receiver" {
            return receiver(addr.parse().expect("an address"), sender.parse().expect("an address"));
        }
    }
    let (addr, me) = (free_port(), free_port());
    let mut child = start(addr, me);
    // A silent peer is given up after a second (the default is 5 s).
    let quick = Config { abandon_after: Duration::from_secs(1), ..Config::default() };
    let options = Options { config: quick, ..Options::default() };
    let ep = Endpoint::builder(1).bind(me).peer(2, addr).options(options).build()?;
    println!("first message: {:?}", ep.send(2, b"are you there?")?.wait(WAIT)?);
    let sent: Vec<_> = (0..200).map(|_| ep.send_blocking(2, &[7; 1000], WAIT)).collect::<Result<_, _>>()?;
    child.kill(); // SIGKILL
    let failed = loop {
        if let Event::PeerUnreachable { failed } = ep.next_event(WAIT)? {
            break failed;
        }
    };
    let acked = sent.iter().filter(|h| h.state() == MessageState::Delivered).count();
    println!(
        "peer {} unreachable: messages {} to {} failed ({} of them perhaps delivered, ack lost); {acked} were acknowledged",
        failed.peer,
        failed.first,
        failed.end - 1,
        failed.in_doubt_end - failed.first
    );
    let _child = start(addr, me); // a new life at the same address
    loop {
        if let Event::PeerRestarted { peer, .. } = ep.next_event(WAIT)? {
            println!("peer {peer} restarted: its new life greeted us");
            break;
        }
    }
    println!("sent to the new life: {:?}", ep.send(2, b"hello again")?.wait(WAIT)?);
    ep.close(Duration::from_secs(1))
}

//! Two processes, one message stream: the smallest complete tether program.
//!
//! Run it with no arguments and it plays both sides: it starts a copy of
//! itself as the receiver (a second process), sends it 1000 messages, and
//! checks what the receiver reports. Or run each side yourself, in two
//! terminals or on two hosts:
//!
//! ```sh
//! cargo run --release -p tether --example two_process -- receive 127.0.0.1:7002 127.0.0.1:7001
//! cargo run --release -p tether --example two_process -- send    127.0.0.1:7001 127.0.0.1:7002
//! ```
//!
//! (`receive BIND PEER` / `send BIND PEER`: this side's address, then the
//! other side's.) Kill the receiver mid-stream and the sender is told, by
//! an event, exactly which messages did not arrive.

use std::net::SocketAddr;
use std::process::{Command, ExitCode};
use std::time::Duration;

use tether::{Endpoint, Event, MessageState};

/// The sender is node 1, the receiver node 2.
const SENDER: u32 = 1;
const RECEIVER: u32 = 2;
const MESSAGES: u32 = 1000;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let addr = |s: &String| s.parse::<SocketAddr>().map_err(|e| format!("bad address {s}: {e}"));
    let result = match args.as_slice() {
        [] => both_sides(),
        [role, bind, peer] if role == "send" => {
            addr(bind).and_then(|b| send(b, addr(peer)?).map_err(|e| e.to_string()))
        }
        [role, bind, peer] if role == "receive" => {
            addr(bind).and_then(|b| receive(b, addr(peer)?).map_err(|e| e.to_string()))
        }
        _ => Err("usage: two_process [send|receive BIND PEER]".to_string()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("two_process: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The message numbered `i`: its bytes say which it is, so the receiver
/// can check order and content.
fn message(i: u32) -> Vec<u8> {
    let mut m = format!("message {i:05} ").into_bytes();
    m.resize(64 + (i as usize % 512), b'a' + (i % 26) as u8);
    m
}

fn send(bind: SocketAddr, peer: SocketAddr) -> Result<(), tether::Error> {
    let ep = Endpoint::builder(SENDER).bind(bind).peer(RECEIVER, peer).build()?;
    let mut last = None;
    for i in 0..MESSAGES {
        // Waits while the send buffer is full (back-pressure), never drops.
        last = Some(ep.send_blocking(RECEIVER, &message(i), Some(Duration::from_secs(10)))?);
    }
    // Messages are acknowledged in order: the last one settles them all.
    let state = last.expect("at least one message").wait(Some(Duration::from_secs(30)))?;
    while let Some(event) = ep.poll_event() {
        if let Event::PeerUnreachable { failed } = event {
            eprintln!(
                "sender: messages {}..{} failed ({} maybe delivered, the rest certainly not)",
                failed.first,
                failed.end,
                failed.in_doubt_end - failed.first
            );
        }
    }
    println!("sender: {MESSAGES} messages sent, the last one {state:?}");
    ep.close(Duration::from_secs(5))?;
    if state == MessageState::Delivered {
        Ok(())
    } else {
        Err(tether::Error::TimedOut)
    }
}

fn receive(bind: SocketAddr, peer: SocketAddr) -> Result<(), tether::Error> {
    let ep = Endpoint::builder(RECEIVER).bind(bind).peer(SENDER, peer).build()?;
    for i in 0..MESSAGES {
        let d = ep.recv(Some(Duration::from_secs(30)))?;
        assert_eq!((d.from, &d.message[..]), (SENDER, &message(i)[..]), "message {i}");
    }
    println!("receiver: {MESSAGES} messages, each once, in order, intact");
    // Linger so the last acknowledgements reach the sender.
    ep.close(Duration::from_secs(1)).or_else(|e| match e {
        tether::Error::Lingered { .. } => Ok(()),
        e => Err(e),
    })
}

/// Play both sides: this process sends, a child process receives.
fn both_sides() -> Result<(), String> {
    // Free ports, found by binding and releasing them.
    let free = || -> Result<SocketAddr, String> {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        s.local_addr().map_err(|e| e.to_string())
    };
    let (tx, rx) = (free()?, free()?);
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut child = Command::new(exe)
        .args(["receive", &rx.to_string(), &tx.to_string()])
        .spawn()
        .map_err(|e| format!("starting the receiver: {e}"))?;
    let sent = send(tx, rx).map_err(|e| format!("sender: {e}"));
    let status = child.wait().map_err(|e| e.to_string())?;
    sent?;
    if !status.success() {
        return Err(format!("the receiver process failed: {status}"));
    }
    println!("two processes, {MESSAGES} messages: OK");
    Ok(())
}

//! A request/reply server and its client, as two processes:
//!
//! ```sh
//! cargo run -p tether --example calls -- server 127.0.0.1:7300 [N]   # answers calls to handler 7
//! cargo run -p tether --example calls -- client 127.0.0.1:7300 N     # makes N calls, checks every reply
//! ```
//!
//! The server takes in any client (no key: `accept_unkeyed` is the opt-in)
//! and serves N calls (0: for ever); its handler reverses the bytes.

use std::time::Duration;

use tether::rpc::OperationStatus;
use tether::{Endpoint, Error};

const REVERSE: u32 = 7;

fn server(addr: std::net::SocketAddr, calls: u64) -> Result<(), Error> {
    let ep = Endpoint::builder(1).bind(addr).accept_unkeyed(64).build()?;
    ep.register_handler(REVERSE, |r| r.args.iter().rev().copied().collect())?;
    println!("serving on {addr}");
    let mut served = 0;
    while calls == 0 || served < calls {
        match ep.serve(Some(Duration::from_secs(1))) {
            Ok(()) => served += 1,
            Err(Error::TimedOut) => {}
            Err(e) => return Err(e),
        }
    }
    // The last replies acknowledged before the endpoint goes.
    ep.close(Duration::from_secs(5))
}

fn client(addr: std::net::SocketAddr, calls: u64) -> Result<(), Error> {
    let ep = Endpoint::builder(2).bind("127.0.0.1:0".parse().expect("an address")).peer(1, addr).build()?;
    for i in 0..calls {
        let args = format!("call {i}").into_bytes();
        let out = ep.request(1, REVERSE, &args)?.wait(Some(Duration::from_secs(5)))?;
        let want: Vec<u8> = args.iter().rev().copied().collect();
        if out.state.op != OperationStatus::Processed || out.reply.as_deref() != Some(&want[..]) {
            eprintln!("call {i}: {out:?}");
            std::process::exit(1);
        }
    }
    println!("{calls} calls answered, every reply right");
    ep.close(Duration::from_secs(1))
}

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().collect();
    let usage = || -> ! {
        eprintln!("usage: calls server ADDR [N] | client ADDR N");
        std::process::exit(2)
    };
    let addr = args.get(2).and_then(|a| a.parse().ok()).unwrap_or_else(|| usage());
    let n = args.get(3).map_or(Ok(0), |n| n.parse()).unwrap_or_else(|_| usage());
    match args.get(1).map(String::as_str) {
        Some("server") => server(addr, n),
        Some("client") => client(addr, n),
        _ => usage(),
    }
}

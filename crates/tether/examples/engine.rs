//! A program attached to the node's engine process (`tether engine`,
//! docs/ENGINE.md): its protocol runs in the engine, which can die or hang
//! and be replaced with nothing lost. It exchanges messages with an
//! endpoint embedded in this process.
//!
//! ```sh
//! tether engine --dir /dev/shm/my-engine --bind 127.0.0.1:7400 &
//! cargo run -p tether --example engine -- /dev/shm/my-engine 127.0.0.1:7400
//! ```

use std::time::Duration;

use tether::{Endpoint, Error};

fn main() {
    // An error is printed as its message ("no engine serves DIR: start one
    // with ..."), not as the `Debug` form `main` returning `Err` would print.
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().collect();
    let (Some(dir), Some(engine_addr)) = (args.get(1), args.get(2).and_then(|a| a.parse().ok())) else {
        eprintln!(
            "usage: engine ENGINE_DIR ENGINE_ADDR   (a `tether engine --dir ENGINE_DIR --bind ENGINE_ADDR`)"
        );
        std::process::exit(2);
    };
    let wait = Some(Duration::from_secs(5));
    let embedded =
        Endpoint::builder(1).bind("127.0.0.1:0".parse().expect("an address")).peer(2, engine_addr).build()?;
    let attached = Endpoint::builder(2).engine(dir).peer(1, embedded.local_addr().expect("bound")).build()?;
    for i in 0..100u32 {
        attached.send_blocking(1, &i.to_le_bytes(), wait)?;
        let m = embedded.recv(wait)?;
        embedded.send_blocking(2, &m.message, wait)?;
        let back = attached.recv(wait)?;
        assert_eq!(&back.message[..], &i.to_le_bytes()[..], "round trip {i}");
    }
    println!("100 round trips through the engine, each exact");
    attached.close(Duration::from_secs(1))?;
    embedded.close(Duration::from_secs(1))
}

//! Two hosts in two network namespaces joined by a veth pair: `tether
//! stream --listen` runs in one, `--connect` in the other, and every message
//! must arrive verified. Skips (with a message) where namespaces cannot be
//! made: not root, or no `ip`. Every namespace it makes is removed on drop.

use std::process::{Command, Output, Stdio};
use std::time::Duration;

struct Netns {
    names: Vec<String>,
}

fn ip(args: &[&str]) -> std::io::Result<Output> {
    Command::new("ip").args(args).output()
}

fn must(args: &[&str]) {
    let out = ip(args).expect("ip runs");
    assert!(out.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

impl Netns {
    /// Two namespaces `a` and `b` with a veth pair on 10.201.<n>.0/24, or
    /// `None` (and why) when this machine cannot make them.
    fn pair(tag: &str) -> Result<Netns, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("not root".into());
        }
        match ip(&["netns", "list"]) {
            Ok(o) if o.status.success() => {}
            _ => return Err("`ip netns` is not available".into()),
        }
        let id = std::process::id() % 200;
        let (a, b) = (format!("tt-{tag}-a-{id}"), format!("tt-{tag}-b-{id}"));
        let ns = Netns { names: vec![a.clone(), b.clone()] };
        for n in &ns.names {
            let out = ip(&["netns", "add", n]).map_err(|e| e.to_string())?;
            if !out.status.success() {
                return Err(format!("cannot create a namespace: {}", String::from_utf8_lossy(&out.stderr)));
            }
        }
        let (va, vb) = (format!("va{id}{tag}"), format!("vb{id}{tag}"));
        must(&["link", "add", &va, "netns", &a, "type", "veth", "peer", "name", &vb, "netns", &b]);
        for (n, v, addr) in [(&a, &va, "10.201.0.1/24"), (&b, &vb, "10.201.0.2/24")] {
            must(&["-n", n, "addr", "add", addr, "dev", v]);
            must(&["-n", n, "link", "set", v, "up"]);
            must(&["-n", n, "link", "set", "lo", "up"]);
        }
        Ok(ns)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = ip(&["netns", "del", n]);
        }
    }
}

fn tether_in(ns: &str, args: &[&str]) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns, env!("CARGO_BIN_EXE_tether")]).args(args);
    c
}

fn json(out: &Output) -> serde_json::Value {
    assert!(out.status.success(), "tether failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("one JSON document")
}

#[test]
fn stream_between_two_hosts_is_verified() {
    let ns = match Netns::pair("s") {
        Ok(ns) => ns,
        Err(why) => {
            eprintln!("SKIPPED stream_between_two_hosts_is_verified: {why}");
            return;
        }
    };
    let (a, b) = (&ns.names[0], &ns.names[1]);
    let count = "20000";
    let common = ["stream", "--size", "4096", "--count", count, "--json", "--loss", "0.01"];
    let listener = tether_in(b, &common)
        .args(["--listen", "10.201.0.2:7400", "--peer", "10.201.0.1:7401"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn listener");
    std::thread::sleep(Duration::from_millis(200));
    let sender =
        tether_in(a, &common).args(["--connect", "10.201.0.2:7400", "--bind", "10.201.0.1:7401"]).output();
    let listener = listener.wait_with_output().expect("listener exits");
    let (sent, got) = (json(&sender.expect("sender runs")), json(&listener));
    let (s, r) = (&sent["runs"][0], &got["runs"][0]);
    eprintln!("sender: {s}\nlistener: {r}");
    assert_eq!(r["delivered"].as_u64(), Some(20000), "every message delivered");
    assert_eq!(r["corrupted"].as_u64(), Some(0));
    assert_eq!(r["out_of_order"].as_u64(), Some(0));
    assert_eq!(s["delivered"].as_u64(), Some(20000), "every message acknowledged");
    assert!(s["retransmits"].as_u64().unwrap() > 0, "1% loss was injected and repaired");
}

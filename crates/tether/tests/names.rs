//! Names end to end: a server endpoint registers a name, a caller resolves
//! it and calls the server, through a directory of files and through a
//! real etcd (Debian's `etcd-server`), started here on free ports; the
//! etcd test says loudly when it skips (no `etcd` binary).

// Built with the `names` feature (every feature in `scripts/test`).
#![cfg(feature = "names")]
// The etcd test waits for the server by the wall clock.
#![allow(clippy::disallowed_methods)]

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tether::launch::Launch;
use tether::names::{connect, register, EtcdNames, FileNames, NameError, Names, Registration};
use tether::rpc::Executed;
use tether::{Endpoint, Options};

const ECHO: u32 = 1;
const WAIT: Option<Duration> = Some(Duration::from_secs(10));

fn endpoint(node: u32) -> Endpoint {
    Endpoint::udp(node, "127.0.0.1:0".parse().unwrap(), &[], Options::default()).unwrap()
}

/// A server registered as `name` in `names`; a caller that finds it by
/// name and calls it; the server learns the caller by name too.
fn call_by_name(names: &dyn Names) {
    let server = endpoint(20);
    let client = endpoint(10);
    register(names, "bank-server", &server).unwrap();
    register(names, "teller", &client).unwrap();
    assert_eq!(names.resolve("nobody").unwrap(), None);
    assert!(matches!(connect(names, &client, "nobody"), Err(NameError::Unknown(_))));
    let node = connect(names, &client, "bank-server").unwrap();
    assert_eq!(node, 20);
    assert_eq!(connect(names, &server, "teller").unwrap(), 10);
    server.register_handler(ECHO, |r| r.args.to_vec()).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| match server.serve(WAIT) {
            Ok(()) => {}
            Err(e) => panic!("serve: {e}"),
        });
        let out = client.request(node, ECHO, b"by name").unwrap().wait(WAIT).unwrap();
        assert_eq!((out.executed(), out.reply.as_deref()), (Executed::Yes, Some(&b"by name"[..])));
    });
    names.unregister("bank-server").unwrap();
    assert_eq!(names.resolve("bank-server").unwrap(), None);
}

#[test]
fn a_caller_finds_a_server_by_name_in_a_directory() {
    let dir = std::env::temp_dir().join(format!("tether-names-{}", std::process::id()));
    let names = FileNames::new(&dir).unwrap();
    call_by_name(&names);
    // What the store hands back is checked, not trusted.
    std::fs::write(dir.join("forged"), b"node=1\nrail=somewhere else\n").unwrap();
    assert!(matches!(names.resolve("forged"), Err(NameError::Malformed { .. })));
    std::fs::write(dir.join("huge"), vec![b'x'; 1 << 20]).unwrap();
    assert!(matches!(names.resolve("huge"), Err(NameError::Malformed { .. })));
    assert!(matches!(names.resolve("../escape"), Err(NameError::BadName(_))));
    let r = Registration { node: 3, addrs: vec!["127.0.0.1:9".parse().unwrap()] };
    names.register("again", &r).unwrap();
    names.register("again", &Registration { node: 4, ..r }).unwrap();
    assert_eq!(names.resolve("again").unwrap().unwrap().node, 4, "replaced whole");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A real etcd on free ports, stopped and its data removed when dropped.
struct Etcd {
    child: Child,
    dir: std::path::PathBuf,
    url: String,
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn start_etcd() -> Option<Etcd> {
    if Command::new("etcd").arg("--version").stdout(Stdio::null()).status().is_err() {
        return None;
    }
    let dir = std::env::temp_dir().join(format!("tether-etcd-{}", std::process::id()));
    let (client, peer) = (free_port(), free_port());
    let url = format!("http://127.0.0.1:{client}");
    let child = Command::new("etcd")
        .args(["--name", "tether-test", "--data-dir"])
        .arg(&dir)
        .args(["--listen-client-urls", &url, "--advertise-client-urls", &url])
        .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
        .args(["--initial-advertise-peer-urls", &format!("http://127.0.0.1:{peer}")])
        .args(["--initial-cluster", &format!("tether-test=http://127.0.0.1:{peer}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    Some(Etcd { child, dir, url })
}

#[test]
fn a_caller_finds_a_server_by_name_in_etcd() {
    let Some(etcd) = start_etcd() else {
        eprintln!("SKIPPED: no etcd binary (Debian: apt-get install etcd-server); etcd names untested");
        return;
    };
    let names = EtcdNames::new(&etcd.url, "/tether-test");
    // Up once a write goes through.
    let probe = Registration { node: 1, addrs: vec!["127.0.0.1:1".parse().unwrap()] };
    let start = Instant::now();
    while names.register("probe", &probe).is_err() {
        assert!(start.elapsed() < Duration::from_secs(20), "etcd at {} never came up", etcd.url);
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(names.resolve("probe").unwrap(), Some(probe));
    call_by_name(&names);
    ranks_meet_through(&names);
}

/// Three ranks that know only their rank, the job's size and where each
/// will listen meet through the store (`Launch::from_names`), and talk.
fn ranks_meet_through(names: &(dyn Names + Sync)) {
    let ports: Vec<u16> = (0..3).map(|_| free_udp_port()).collect();
    let jobs: Vec<Launch> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..3u32)
            .map(|rank| {
                let addr: std::net::SocketAddr =
                    format!("127.0.0.1:{}", ports[rank as usize]).parse().unwrap();
                s.spawn(move || {
                    Launch::from_names(names, "job-7", rank, 3, addr, Duration::from_secs(20)).unwrap()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(jobs.windows(2).all(|w| w[0].addrs == w[1].addrs), "every rank sees the same layout");
    assert_eq!(jobs[2].node(), 3);
    let eps: Vec<Endpoint> = jobs.iter().map(|j| j.builder().build().unwrap()).collect();
    eps[0].send(3, b"from rank 0").unwrap();
    let d = eps[2].recv(Some(Duration::from_secs(10))).unwrap();
    assert_eq!((d.from, &d.message[..]), (1, &b"from rank 0"[..]));
    let late =
        Launch::from_names(names, "job-8", 0, 2, "127.0.0.1:9".parse().unwrap(), Duration::from_millis(100));
    assert!(late.unwrap_err().to_string().contains("ranks [1]"), "a rank that never registers is named");
}

fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

//! An endpoint configured without code: its rail, its peer, its protocol
//! and calls settings from a `tether.toml` and `TETHER_*` variables
//! (`tether::settings`), the builder's own calls winning over both, and
//! the result an endpoint that talks.

#![allow(clippy::disallowed_methods)]

use std::time::Duration;

use tether::settings::Layers;
use tether::{Config, Endpoint};

fn file(name: &str, text: &str) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("tether-settings-test-{}-{name}.toml", std::process::id()));
    std::fs::write(&p, text).unwrap();
    p
}

fn vars(v: &[(&str, &str)]) -> std::vec::IntoIter<(String, String)> {
    v.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<Vec<_>>().into_iter()
}

#[test]
fn an_endpoint_from_a_file_and_variables_talks_and_builder_calls_win() {
    let b = Endpoint::builder(2)
        .bind("127.0.0.1:0".parse().unwrap())
        .settings(Layers::default())
        .build()
        .unwrap();
    let toml = file(
        "talks",
        &format!(
            "[endpoint]\nbind = [\"127.0.0.1:0\"]\nlinger = \"200ms\"\n[endpoint.peers]\n2 = [\"{}\"]\n\
             [config]\nabandon_after = \"1500ms\"\n[calls]\ncredit = 5\n",
            b.local_addr().unwrap()
        ),
    );
    let env = [("TETHER_CONFIG_MAX_DATAGRAM", "1400"), ("TETHER_RUN_OWNER", "not a setting")];
    // No rail and no peer given in code: both come from the file.
    let a =
        Endpoint::builder(1).settings(Layers::from_parts(Some(&toml), vars(&env)).unwrap()).build().unwrap();
    b.add_peer(1, a.local_addr().unwrap()).unwrap();
    a.send(2, b"configured").unwrap();
    assert_eq!(&b.recv(Some(Duration::from_secs(5))).unwrap().message[..], b"configured");
    a.flush(Some(Duration::from_secs(5))).unwrap();
    assert_eq!(a.max_datagram_to(2), Some(1400), "the variable's datagram size");

    // The builder's own configuration wins over the variable's.
    let c = Endpoint::builder(3)
        .config(Config { max_datagram: 1300, ..Config::default() })
        .settings(Layers::from_parts(Some(&toml), vars(&env)).unwrap())
        .build()
        .unwrap();
    b.add_peer(3, c.local_addr().unwrap()).unwrap();
    c.send(2, b"mine").unwrap();
    assert_eq!(&b.recv(Some(Duration::from_secs(5))).unwrap().message[..], b"mine");
    c.flush(Some(Duration::from_secs(5))).unwrap();
    assert_eq!(c.max_datagram_to(2), Some(1300), "the builder's datagram size");
    std::fs::remove_file(toml).unwrap();
}

#[test]
fn a_bad_setting_is_refused_naming_where_it_was() {
    let toml = file("bad", "[config]\nabandon_after = \"soon\"\n");
    let e = Layers::from_parts(Some(&toml), vars(&[])).unwrap_err().to_string();
    assert!(e.contains(&toml.display().to_string()) && e.contains("config.abandon_after"), "{e}");
    let e =
        Layers::from_parts(None, vars(&[("TETHER_ENDPOINT_BINDD", "127.0.0.1:0")])).unwrap_err().to_string();
    assert!(e.contains("TETHER_ENDPOINT_BINDD") && e.contains("did you mean endpoint.bind?"), "{e}");
    std::fs::remove_file(toml).unwrap();
}

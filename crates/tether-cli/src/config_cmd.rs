//! `tether config`: the effective configuration and where each value came
//! from, as `ucx_info -c` shows UCX's: every setting an endpoint or an
//! engine takes from a `tether.toml` or `TETHER_*` variables
//! (`tether::settings`; docs/OPERATING.md, "Configuration"), its value
//! and its source (default, the file, a variable). What a program sets
//! itself (builder calls, flags) wins over all of these when it runs.

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::Args;
use tether::settings::{Layers, Source, Target};

#[derive(Args, Debug, Clone)]
pub struct ConfigOpts {
    /// The configuration file to read, instead of $TETHER_TOML or
    /// ./tether.toml.
    #[arg(long)]
    pub file: Option<PathBuf>,
    /// Print one JSON document (every setting: key, value, source,
    /// variable) instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `engine_defaults`: what `tether engine` uses for an `engine.*` key
/// nobody set (its flags' defaults).
pub fn run(o: &ConfigOpts, engine_defaults: &BTreeMap<&'static str, String>) -> anyhow::Result<()> {
    let layers = match &o.file {
        Some(f) => Layers::from_parts(Some(f), std::env::vars())?,
        None => Layers::load()?,
    };
    let mut target = Target::default();
    let mut resolved = layers.apply(&mut target, |_| false)?;
    for r in resolved.iter_mut().filter(|r| r.source == Source::Default) {
        if let Some(d) = engine_defaults.get(r.key.as_str()) {
            r.value = d.clone();
        }
    }
    let var = |key: &str| {
        tether::settings::setting(key)
            .map(|s| s.env_var())
            .unwrap_or_else(|| format!("TETHER_{}", key.replace('.', "_").to_uppercase()))
    };
    let file = layers.file.as_ref().map(|f| f.display().to_string());
    if o.json {
        let settings: Vec<_> = resolved
            .iter()
            .map(|r| {
                let help =
                    tether::settings::setting(&r.key).map_or("a peer's addresses, one per rail", |s| s.help);
                serde_json::json!({
                    "key": r.key, "value": r.value, "source": r.source.to_string(), "variable": var(&r.key),
                    "help": help,
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "file": file, "settings": settings }))?
        );
        return Ok(());
    }
    println!(
        "tether config: file {}; the program's own settings (builder calls, flags) win over these",
        file.as_deref().unwrap_or("none (no $TETHER_TOML, no ./tether.toml)")
    );
    let mut t = crate::table::table(&["key", "value", "source", "variable"]);
    for r in &resolved {
        t.add_row([r.key.clone(), r.value.clone(), r.source.to_string(), var(&r.key)]);
    }
    println!("{t}");
    Ok(())
}

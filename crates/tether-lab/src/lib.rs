//! tether's laboratory: every measurement, baseline, campaign, workload,
//! demo and plot behind the `tether` command, as a library, so tests and
//! other front ends run them directly. The command (tether-cli) keeps
//! argument parsing, tables and output; what each experiment measures and
//! which paper it answers is in its module's header and in
//! docs/RESULTS.md.
//!
//! The options of each experiment are `clap::Args` structs, so the command
//! flattens them into its subcommands and their doc comments are its help.

#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

pub mod app_kernels;
pub mod args;
pub mod async_bench;
pub mod auth_bench;
pub mod bandwidth;
pub mod bench;
pub mod calls_bench;
pub mod campaign;
pub mod cluster_campaign;
pub mod congestion_bench;
pub mod contention_bench;
pub mod demo;
pub mod demo_cluster;
pub mod demo_engine;
pub mod demo_rpc;
pub mod detect_bench;
pub mod detection;
pub mod engine_bench;
pub mod engine_campaign;
pub mod engine_fault;
pub mod engine_proc;
pub mod external_load;
pub mod fault_hook;
pub mod flows;
pub mod group_bench;
pub mod limit;
pub mod logp_bench;
pub mod loss_bench;
pub mod model;
pub mod net;
pub mod netns;
pub mod pattern;
pub mod performability;
pub mod performability_bench;
pub mod pingpong;
pub mod plot;
pub mod raw;
pub mod report;
pub mod scratch;
pub mod shm_bench;
pub mod stream;
pub mod summary;
pub mod sweep;
pub mod timeline;
pub mod verified_stream;

//! Black-box tests of the `cairn` binary: each test runs the real command in a tempdir,
//! as a user would, and checks what it did to the files, not just its exit code.

mod backup;
mod chunk;
mod common;
mod config_file;
mod copy;
mod damage;
mod default_repo;
mod diff;
mod dump;
mod errors;
mod find;
mod fixtures;
mod helpers;
mod ignore_files;
mod init;
mod inspect;
mod maintenance;
mod mount;
mod no_loss;
mod no_loss_remote;
mod options;
mod pipeline;
mod progress;
mod props;
mod remote;
mod remote_cluster;
mod remote_faults;
mod repair_converge;
mod restore;
mod restore_filters;
mod stats;
mod trust_concurrency;
mod trust_crash;
mod trust_damage;
mod trust_full_disk;

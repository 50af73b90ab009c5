//! One module per user-visible operation; each is a library call that returns a report.

pub mod backup;
pub mod browse;
pub mod check;
pub mod copy;
pub mod diff;
pub mod exclude;
pub mod find;
pub mod forget;
pub mod ignore_files;
pub mod ingest;
pub mod prune;
pub mod read_once;
pub mod repair;
pub mod restore;
pub mod restore_filter;
mod restore_packs;
pub mod restore_plan;
mod restore_target;
pub mod rewrite;
pub mod select;
pub mod stats;
pub mod walk;

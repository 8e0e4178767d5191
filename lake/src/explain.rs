//! Errors explained with what the lake says of them (a dataset removed while a command read it).

use lake_store::Lake;

/// `e`, or, when it is a failure to read the files of a dataset that `lake rm` removed while
/// the command read it, the removal, said plainly.
pub async fn explained(root: &str, e: anyhow::Error) -> anyhow::Error {
    let Ok(lake) = Lake::open(root) else { return e };
    match lake.removal_behind(&format!("{e:#}")).await {
        Some(removal) => anyhow::anyhow!("{removal}, while this command read it"),
        None => e,
    }
}

//! `lake export`: a dataset or a view over one as LeRobot v3.0 or parquet.

use std::{path::PathBuf, process::ExitCode};

use lake_store::Lake;

/// Formats of `lake export`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExportFormatArg {
    /// A LeRobot v3.0 dataset (parquet + mp4 by stream copy) that LeRobot loads.
    LerobotV3,
    /// The dataset's tables as plain parquet files.
    Parquet,
}

/// Arguments of `lake export`.
#[derive(Debug, clap::Args)]
pub struct ExportArgs {
    /// Dataset (`NAME`, `NAME@VERSION`) or a view over one dataset.
    dataset: String,
    /// Output format.
    #[arg(long, value_enum)]
    format: ExportFormatArg,
    /// Output directory (must not exist, or be empty), or an object store prefix (s3://…,
    /// gs://…, az://…; must hold no object), written once the export is complete.
    out: PathBuf,
}

/// `lake export`.
pub async fn export(root: &str, args: ExportArgs) -> anyhow::Result<ExitCode> {
    let lake = Lake::open(root)?;
    let format = match args.format {
        ExportFormatArg::LerobotV3 => lake_export::ExportFormat::LerobotV3,
        ExportFormatArg::Parquet => lake_export::ExportFormat::Parquet,
    };
    let remote = args.out.to_str().filter(|o| lake_store::remote::is_remote(o)).map(str::to_string);
    let report = match &remote {
        // Made whole on the local disk first, then copied up: nothing lands in the store from an
        // export that failed.
        Some(to) => {
            let staging = tempfile::tempdir()?;
            let local = staging.path().join("export");
            let report = lake_export::export(&lake, &args.dataset, format, &local).await?;
            lake_store::remote::upload_dir(&local, to).await?;
            report
        }
        None => lake_export::export(&lake, &args.dataset, format, &args.out).await?,
    };
    outln!(
        "exported {} ({}, {} steps) to {}: {} files, {:.1} MB",
        report.dataset,
        if report.episodes == 1 { "1 episode".to_string() } else { format!("{} episodes", report.episodes) },
        report.steps,
        args.out.display(),
        report.files,
        report.bytes as f64 / 1e6
    )?;
    Ok(ExitCode::SUCCESS)
}

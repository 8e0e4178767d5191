//! `lake sample`: the LeRobot samples of given steps, to an Arrow IPC file.

use std::process::ExitCode;

use crate::args::{LoaderArgs, WindowArgs, index_or_file};
use anyhow::Context;
use arrow::ipc::writer::FileWriter;
use lake_loader::{Draw, Loader, LoaderDataset};
use lake_store::Lake;

/// Arguments of `lake sample`.
#[derive(Debug, clap::Args)]
pub struct SampleArgs {
    /// Dataset name (optionally `NAME@VERSION`), or a view over one dataset.
    #[arg(value_name = "DATASET", required_unless_present = "dataset", conflicts_with = "dataset")]
    name: Option<String>,
    /// The dataset, as a flag: the same as the positional DATASET.
    #[arg(long, value_name = "DATASET")]
    dataset: Option<String>,
    /// LeRobot `index` values (absolute step indices), comma-separated; `@FILE` reads them from
    /// FILE (separated by commas, spaces or lines), for more than a command line holds.
    #[arg(long, required = true, allow_negative_numbers = true, value_parser = index_or_file)]
    indices: Vec<Vec<i64>>,
    #[command(flatten)]
    windows: WindowArgs,
    #[command(flatten)]
    loader: LoaderArgs,
    /// Arrow IPC file to write (one row per index, LeRobot's keys as column names).
    #[arg(long)]
    out: std::path::PathBuf,
}

/// `lake sample`: the samples of given indices, as an Arrow IPC file.
pub async fn sample(root: &str, args: SampleArgs) -> anyhow::Result<ExitCode> {
    let lake = Lake::open(root)?;
    let dataset = args.name.or(args.dataset).context("name the dataset to sample")?;
    let selection = match lake_loader::views::resolve(&lake, &dataset).await?.as_slice() {
        [one] => one.clone(),
        many => anyhow::bail!(
            "view `{}` spans {} datasets; sample one of them by name ({})",
            dataset,
            many.len(),
            many.iter().map(|s| s.dataset.as_str()).collect::<Vec<_>>().join(", ")
        ),
    };
    if args.out.is_dir() {
        anyhow::bail!("--out {} is a directory; give a file name (e.g. samples.arrow)", args.out.display());
    }
    let frames = lake_loader::FrameSpec { size: args.loader.frame_size, format: args.loader.frame_format, proxy: args.loader.proxy };
    let ds = LoaderDataset::open_mapped(&lake, &selection.dataset, frames, &selection.features).await?;
    let loader = Loader::new(vec![ds.clone()], &args.windows.windows()?, args.loader.options())?;
    let indices: Vec<i64> = args.indices.concat();
    if indices.is_empty() {
        anyhow::bail!("--indices names no step (an empty file?)");
    }
    let draws = indices.iter().map(|&i| Ok(Draw { source: 0, row: ds.row_of_index(i)? })).collect::<anyhow::Result<Vec<_>>>()?;
    if let Some(episodes) = &selection.episodes {
        for (draw, index) in draws.iter().zip(&indices) {
            let episode = ds.episodes.iter().find(|e| (e.first_row..e.first_row + e.len).contains(&draw.row)).map(|e| e.episode_index);
            if episode.is_none_or(|e| episodes.binary_search(&e).is_err()) {
                anyhow::bail!("index {index} is in episode {}, which view `{}` does not select", episode.unwrap_or(-1), dataset);
            }
        }
    }
    let batch = loader.batch(&draws).await?;
    // Whole or not at all (see `Output`).
    let written = (|| -> anyhow::Result<()> {
        let mut writer = FileWriter::try_new(crate::output::Output::create(&args.out)?, &batch.schema())?;
        writer.write(&batch)?;
        writer.finish()?;
        writer.into_inner()?.commit()?;
        Ok(())
    })();
    written.with_context(|| format!("writing {}", args.out.display()))?;
    errln!(
        "wrote {} sample{} of {} ({} columns, {:.1} MB) to {}",
        batch.num_rows(),
        if batch.num_rows() == 1 { "" } else { "s" },
        ds.label,
        batch.num_columns(),
        batch.get_array_memory_size() as f64 / 1e6,
        args.out.display()
    );
    Ok(ExitCode::SUCCESS)
}

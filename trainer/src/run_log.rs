//! A run's step log (`train_log.jsonl`, one [`StepRecord`] per line) and its plot
//! (`train_log.svg`): the loss falling, and the share of each step spent waiting for its batch,
//! which is the trainer's measure of whether the data kept up.

use std::{
    io::{BufRead, BufReader},
    path::Path,
};

use plotters::prelude::*;

use crate::{Error, Result};

/// The step log's file name in a run directory.
pub const LOG_FILE: &str = "train_log.jsonl";
/// The plot's file name in a run directory.
pub const PLOT_FILE: &str = "train_log.svg";
/// The held-out evaluations' log file name in a run directory.
pub const EVAL_FILE: &str = "eval_log.jsonl";
/// The step log's file name of a run without a model (`--policy none`).
pub const FEED_LOG_FILE: &str = "feed_log.jsonl";

/// One step of a run without a model: its batch taken and moved to the device, as logged.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct FeedRecord {
    /// The step (1 is the first).
    pub step: u64,
    /// Samples in this rank's batch.
    pub samples: u64,
    /// Seconds the step waited for its batch.
    pub data_wait_s: f64,
    /// Seconds of the whole step: the wait, and the copy to the device finished.
    pub step_s: f64,
}

/// One evaluation on held-out samples, as logged.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EvalRecord {
    /// The step it followed.
    pub step: u64,
    /// The policy's loss in eval mode (no dropout, no VAE sampling: ACT's L1 alone), the mean
    /// over the samples.
    pub loss: f64,
    /// Samples evaluated, every rank's.
    pub samples: u64,
}

/// A record of a log that is kept per step.
pub trait Logged: serde::de::DeserializeOwned {
    /// The step it belongs to.
    fn step(&self) -> u64;
}

impl Logged for StepRecord {
    fn step(&self) -> u64 {
        self.step
    }
}

impl Logged for FeedRecord {
    fn step(&self) -> u64 {
        self.step
    }
}

impl Logged for EvalRecord {
    fn step(&self) -> u64 {
        self.step
    }
}

/// One step, as logged.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StepRecord {
    /// The step (1 is the first).
    pub step: u64,
    /// The loss (the mean over ranks): ACT's L1 plus `kl_weight` × KL; Diffusion's mean
    /// squared error of the predicted noise.
    pub loss: f64,
    /// ACT's L1 term (absent for Diffusion).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub l1: Option<f64>,
    /// The KL term (absent without the VAE).
    pub kld: Option<f64>,
    /// Gradient norm before clipping.
    pub grad_norm: f64,
    /// The learning rate of the optimizer's first group at this step (absent in logs of
    /// earlier releases).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lr: Option<f64>,
    /// Seconds the step waited for its batch.
    pub data_wait_s: f64,
    /// Seconds of the whole step, the wait included.
    pub step_s: f64,
}

impl StepRecord {
    /// The step's scalars under lerobot-train's metric names, as the run's TensorBoard events
    /// carry them.
    pub fn scalars(&self) -> Vec<(&'static str, f64)> {
        let mut scalars = vec![("train/loss", self.loss)];
        scalars.extend(self.l1.map(|v| ("train/l1_loss", v)));
        scalars.extend(self.kld.map(|v| ("train/kld_loss", v)));
        scalars.push(("train/grad_norm", self.grad_norm));
        scalars.extend(self.lr.map(|v| ("train/lr", v)));
        scalars.push(("train/dataloading_s", self.data_wait_s));
        scalars.push(("train/update_s", self.step_s - self.data_wait_s));
        scalars
    }
}

/// Every record of a step log (steps, or evaluations), in file order; a resumed run's log holds the steps of each of its
/// processes, and a step logged twice (a run resumed from an earlier checkpoint) counts as its
/// last line says.
///
/// # Errors
/// When the file cannot be read or a line is not a step record (naming the line).
pub fn read_log<T: Logged>(path: &Path) -> Result<Vec<T>> {
    let file = std::fs::File::open(path).map_err(Error::io(path))?;
    let mut steps: Vec<T> = Vec::new();
    for (n, line) in BufReader::new(file).lines().enumerate() {
        let line = line.map_err(Error::io(path))?;
        if line.trim().is_empty() {
            continue;
        }
        let record: T = serde_json::from_str(&line)
            .map_err(|e| Error::Format { path: path.to_path_buf(), reason: format!("line {}: not a step record: {e}", n + 1) })?;
        // A resume from an earlier checkpoint runs its steps again: the later line is the run's.
        let at = steps.partition_point(|s| s.step() < record.step());
        steps.truncate(at);
        steps.push(record);
    }
    Ok(steps)
}

/// Plots `steps` into the SVG file `out`: the loss (and its L1 term, and the held-out loss of
/// `evals`) against the step, on a logarithmic scale, above the share of each step's time spent
/// waiting for data.
///
/// # Errors
/// When there is no step to plot or the file cannot be written.
pub fn plot(steps: &[StepRecord], evals: &[EvalRecord], out: &Path) -> Result<()> {
    let (Some(first), Some(last)) = (steps.first(), steps.last()) else {
        return Err(Error::Run(format!("{}: no step to plot", out.display())));
    };
    let draw = |e: &dyn std::fmt::Display| Error::Run(format!("plotting {}: {e}", out.display()));
    let root = SVGBackend::new(out, (960, 640)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| draw(&e))?;
    let (top, bottom) = root.split_vertically(400);
    let steps_range = first.step..last.step.max(first.step + 1);

    let positive = |v: f64| v.is_finite() && v > 0.0;
    let losses: Vec<f64> =
        steps.iter().flat_map(|s| [Some(s.loss), s.l1]).flatten().chain(evals.iter().map(|e| e.loss)).filter(|v| positive(*v)).collect();
    let low = losses.iter().copied().fold(f64::INFINITY, f64::min);
    let high = losses.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let (low, high) = if low.is_finite() { (low * 0.9, high * 1.1) } else { (1e-3, 1.0) };
    let mut chart = ChartBuilder::on(&top)
        .caption(format!("loss, steps {} to {}", first.step, last.step), ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(steps_range.clone(), (low..high).log_scale())
        .map_err(|e| draw(&e))?;
    chart.configure_mesh().x_desc("step").y_desc("loss").draw().map_err(|e| draw(&e))?;
    type Series<'a> = (&'a str, &'a RGBColor, fn(&StepRecord) -> Option<f64>);
    let series: [Series; 2] = [("loss", &BLUE, |s| Some(s.loss)), ("L1", &RED, |s| s.l1)];
    for (name, colour, value) in series {
        if steps.iter().all(|s| value(s).is_none()) {
            continue;
        }
        chart
            .draw_series(LineSeries::new(steps.iter().filter_map(|s| value(s).filter(|v| positive(*v)).map(|v| (s.step, v))), colour))
            .map_err(|e| draw(&e))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], colour));
    }
    if !evals.is_empty() {
        let held_out = evals.iter().filter(|e| positive(e.loss) && (first.step..=last.step).contains(&e.step));
        chart
            .draw_series(held_out.map(|e| Circle::new((e.step, e.loss), 4, BLACK.filled())))
            .map_err(|e| draw(&e))?
            .label("held-out loss")
            .legend(|(x, y)| Circle::new((x + 8, y), 4, BLACK.filled()));
    }
    chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw().map_err(|e| draw(&e))?;

    let waited: f64 = steps.iter().map(|s| s.data_wait_s).sum();
    let total: f64 = steps.iter().map(|s| s.step_s).sum();
    let share = |s: &StepRecord| if s.step_s > 0.0 { 100.0 * s.data_wait_s / s.step_s } else { 0.0 };
    let mut chart = ChartBuilder::on(&bottom)
        .caption(
            format!("waiting for data: {:.1} % of {:.1} s of steps", 100.0 * waited / total.max(f64::MIN_POSITIVE), total),
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(steps_range, 0.0..100.0)
        .map_err(|e| draw(&e))?;
    chart.configure_mesh().x_desc("step").y_desc("% of the step").draw().map_err(|e| draw(&e))?;
    chart.draw_series(LineSeries::new(steps.iter().map(|s| (s.step, share(s))), &GREEN)).map_err(|e| draw(&e))?;
    root.present().map_err(|e| draw(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(step: u64, loss: f64, wait: f64) -> StepRecord {
        StepRecord { step, loss, l1: Some(loss / 2.0), kld: None, grad_norm: 1.0, lr: Some(1e-5), data_wait_s: wait, step_s: 0.5 }
    }

    #[test]
    fn a_log_reads_back_with_a_resumed_runs_steps_counted_once() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join(LOG_FILE);
        let lines: Vec<String> =
            [record(1, 4.0, 0.1), record(2, 3.0, 0.0), record(3, 2.0, 0.0), record(2, 2.5, 0.2), record(3, 1.5, 0.0), record(4, 1.0, 0.0)]
                .iter()
                .map(|r| serde_json::to_string(r).expect("json"))
                .collect();
        std::fs::write(&path, lines.join("\n") + "\n").expect("written");
        let steps: Vec<StepRecord> = read_log(&path).expect("read");
        assert_eq!(steps.iter().map(|s| (s.step, s.loss)).collect::<Vec<_>>(), [(1, 4.0), (2, 2.5), (3, 1.5), (4, 1.0)]);

        std::fs::write(&path, "{\"step\": 1}\n").expect("written");
        let err = read_log::<StepRecord>(&path).expect_err("not a step record");
        assert!(err.to_string().contains("line 1: not a step record"), "{err}");
    }

    #[test]
    fn the_plot_draws_the_loss_and_the_wait_for_data() {
        let dir = tempfile::tempdir().expect("tmp");
        let out = dir.path().join(PLOT_FILE);
        let steps: Vec<StepRecord> = (1..=20).map(|s| record(s, 10.0 / s as f64, if s % 5 == 0 { 0.25 } else { 0.0 })).collect();
        let evals = [EvalRecord { step: 10, loss: 1.5, samples: 64 }, EvalRecord { step: 20, loss: 0.75, samples: 64 }];
        plot(&steps, &evals, &out).expect("plotted");
        let svg = std::fs::read_to_string(&out).expect("an SVG");
        assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(80)]);
        // The loss, L1 and wait lines, each with its 20 points (and the legend's two samples).
        for colour in ["#0000FF", "#FF0000", "#00FF00"] {
            let line = svg.lines().find(|l| l.contains("<polyline") && l.contains(colour) && l.matches(',').count() == 20);
            assert!(line.is_some(), "no 20-point line in {colour}: {svg}");
        }
        // 4 of 20 steps waited half their time: 10 % of the run.
        assert!(svg.contains("waiting for data: 10.0 % of 10.0 s of steps"), "{svg}");
        assert!(svg.contains("held-out loss") && svg.matches("<circle").count() >= 2, "the evaluations are drawn");
        assert!(plot(&[], &[], &out).is_err());
    }
}
